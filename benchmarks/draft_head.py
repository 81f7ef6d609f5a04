"""Would a pruned draft head pay? The drafter's output layer over the shared vocabulary only.

For the token-level rules (``tli``, ``fsd``) the drafter samples from its distribution
restricted to the tokens both vocabularies share, so its output layer could compute
logits for those rows only, as SGLang's TLI does. The most that saves is the pruned
rows' share of the output matmul. Measured here against the whole draft forward (the
vLLM-native drafter, one decode token per request over a 256-token context), per batch
size, for each target the project ships:

    .venv/bin/python benchmarks/draft_head.py        # -> results/draft_head.{json,md}
"""

from __future__ import annotations

import argparse
import time

import torch
from drafter_speed import time_runtime
from report import median, meta as run_meta, table, write_report
from transformers import AutoTokenizer

from vllm_hetero_spec.drafter.runtime.model import DraftModelRuntime, RuntimeConfig
from hetero_harness.models import ensure_model
from vllm_hetero_spec.vocab.intersection import VocabIntersection
from vllm_hetero_spec.vocab.token_bytes import token_bytes_table

def matmul_s(x: torch.Tensor, weight: torch.Tensor, repeats: int = 50) -> float:
    """Seconds per ``x @ weight.T`` (after three untimed calls)."""
    for _ in range(3):
        x @ weight.T
    t0 = time.perf_counter()
    for _ in range(repeats):
        x @ weight.T
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", default="smollm2-135m")
    ap.add_argument("--targets", nargs="+", default=["qwen2.5-coder-1.5b", "gemma3-270m"])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    draft = str(ensure_model(args.draft))
    draft_bytes = token_bytes_table(AutoTokenizer.from_pretrained(draft))
    shared = {t: VocabIntersection.build(draft_bytes, token_bytes_table(AutoTokenizer.from_pretrained(
        str(ensure_model(t))))).size for t in args.targets}
    runtime = DraftModelRuntime(RuntimeConfig(draft, getattr(torch, args.dtype), kv_pool_mb=256))
    head = runtime.model.lm_head.weight.detach()
    rows = []
    for b in args.batch_sizes:
        forward = median([time_runtime(runtime, b, 256, 16) for _ in range(3)])
        x = torch.randn(b, head.shape[1], dtype=head.dtype)
        full = median([matmul_s(x, head) for _ in range(3)])
        for target, n in shared.items():
            pruned = median([matmul_s(x, head[:n].contiguous()) for _ in range(3)])
            rows.append({"batch_size": b, "target": target, "shared_tokens": n, "draft_vocab": head.shape[0],
                         "forward_ms": 1e3 * forward, "head_ms": 1e3 * full, "pruned_head_ms": 1e3 * pruned,
                         "saving": (full - pruned) / forward})
            print(rows[-1], flush=True)
    meta = run_meta(args, threads=torch.get_num_threads())
    lines = [
        f"Draft model {args.draft} ({args.dtype}, vocabulary {head.shape[0]:,}), {torch.get_num_threads()} threads; "
        "one decode token per request over a 256-token context; the output matmul timed alone, over the whole "
        "vocabulary and over the rows the target shares (the pruned rows taken as the first n: the cost depends on "
        "their number only). Medians of 3. `benchmarks/draft_head.py`, "
        f"{meta['date']}.",
        "",
        *table(["batch", "target", "shared tokens", "draft forward ms", "output layer ms", "pruned ms",
                "saving per draft forward"],
               ([r["batch_size"], r["target"], f"{r['shared_tokens']:,}", f"{r['forward_ms']:.1f}",
                 f"{r['head_ms']:.2f}", f"{r['pruned_head_ms']:.2f}", f"{r['saving']:.1%}"] for r in rows)),
    ]
    write_report("draft_head", {"meta": meta, "rows": rows}, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
