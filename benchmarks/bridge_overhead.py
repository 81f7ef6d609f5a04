"""Per-step bridge overhead: re-tokenization + DTW alignment, per request per step.

Replays real text through the real tokenizers (SmolLM2 draft, Qwen2.5-Coder target)
with the proposer's own batched functions: each simulated step commits k+1 target tokens
for every request, realigns the draft tokenizations (look-behind re-encode, one batched
tokenizer call), re-tokenizes k draft tokens' text into target tokens (one batched call)
and aligns draft and proxy tokens by DTW (w = 8, one compiled call). For comparison it
also times the same re-tokenization one request at a time, and a plain-Python DTW
reference kept here for that purpose.

    .venv/bin/python benchmarks/bridge_overhead.py

Writes benchmarks/results/bridge.json (``{"rows": [...]}``) and bridge.md.
"""

from __future__ import annotations

import argparse
import os
import time

from report import read_result, results_dir, table, write_report

from vllm_hetero_spec.vocab.alignment import dtw_align_batch
from hetero_harness.models import ensure_model
from hetero_harness.prompts import spec_bench_questions
from vllm_hetero_spec.vocab.bridge import VocabBridge
from vllm_hetero_spec.vocab.retokenize import AlignedTokens, propose_continuation, propose_continuations, sync_batch

def python_dtw(a: list[bytes], b: list[bytes], w: int) -> int:
    """Reference: the same banded DTW with Levenshtein cost, in plain Python."""

    def lev(x: bytes, y: bytes) -> int:
        row = list(range(len(y) + 1))
        for i in range(1, len(x) + 1):
            prev, row[0] = row[0], i
            for j in range(1, len(y) + 1):
                cur = min(row[j] + 1, row[j - 1] + 1, prev + (x[i - 1] != y[j - 1]))
                prev, row[j] = row[j], cur
        return row[-1]

    n, m, inf = len(a), len(b), float("inf")
    d = [[inf] * m for _ in range(n)]
    for i in range(n):
        center = 0 if n <= 1 else (i * (m - 1) + (n - 1) // 2) // (n - 1)
        for j in range(max(0, center - w), min(m, center + w + 1)):
            prev = 0 if i == j == 0 else min(
                d[i - 1][j - 1] if i and j else inf, d[i - 1][j] if i else inf, d[i][j - 1] if j else inf)
            d[i][j] = prev + lev(a[i], b[j])
    return int(d[-1][-1])


def _target_step_ms(batch: int) -> float | None:
    """Plain decoding's step time on this machine from the e2e benchmark (Qwen-1.5B,
    fp32): batch / tok/s. Batches it did not run are scaled linearly from the largest
    one it did (a CPU step is compute-bound, so this is about right, not a measurement)."""
    if not (results_dir() / "e2e.json").exists():
        return None
    plain = {r["batch_size"]: r["tok_per_s"] for r in read_result("e2e")["rows"]
             if r["config"] == "plain" and r["temperature"] == 0.0}
    if not plain:
        return None
    if batch in plain:
        return 1e3 * batch / plain[batch]
    ref = max(plain)
    return 1e3 * ref / plain[ref] * batch / ref


def _streams(bridge: VocabBridge, batch: int) -> list[list[int]]:
    texts = spec_bench_questions(64)
    return [bridge.target_tokenizer.encode(texts[i % len(texts)] * 4, add_special_tokens=False) for i in range(batch)]


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as in the engine's tests
    draft_path, target_path = str(ensure_model("smollm2-135m")), str(ensure_model("qwen2.5-coder-1.5b"))
    bridge = VocabBridge.build(draft_path, target_path, 49152, 151936)
    denc, tenc = bridge.draft_encoder, bridge.target_encoder
    rows = []
    warmup, steps = 2, 24
    for k in (4, 8):
        for batch in (1, 16, 64):
            streams = _streams(bridge, batch)
            batched = [AlignedTokens(denc, [], 4) for _ in range(batch)]
            single = [AlignedTokens(denc, [], 4) for _ in range(batch)]
            texts_b = [bytearray() for _ in range(batch)]
            for i in range(batch):  # prompt: 16 target tokens
                texts_b[i] += b"".join(tenc.bytes_of(t) for t in streams[i][:16])
            sync_batch(batched, texts_b)
            for a, t in zip(single, texts_b):
                a.sync(t)
            t_realign = t_batched = t_single = t_dtw = t_py = 0.0
            for s in range(warmup + steps):
                lo = 16 + s * (k + 1)
                for i in range(batch):
                    texts_b[i] += b"".join(tenc.bytes_of(t) for t in streams[i][lo : lo + k + 1])
                tails = [streams[i][lo + k - 3 : lo + k + 1] for i in range(batch)]
                # The drafter's k tokens: the draft tokenization of what the target says
                # next (a drafter that guesses right), so token boundaries are realistic.
                future = [b"".join(tenc.bytes_of(t) for t in streams[i][lo + k + 1 : lo + 2 * k + 1])
                          for i in range(batch)]
                bodies = [ids[:k] for ids in denc.encode_many(future)]
                draft_texts = [b"".join(denc.bytes_of(t) for t in body) for body in bodies]
                t0 = time.perf_counter()
                sync_batch(batched, texts_b)
                t_mid = time.perf_counter()
                proxies = propose_continuations(tenc, tails, draft_texts, k)
                t1 = time.perf_counter()
                dtw_align_batch(bodies, proxies, denc.packed, tenc.packed, 8)
                t2 = time.perf_counter()
                for body, proxy in zip(bodies, proxies):
                    if body and proxy:
                        python_dtw([denc.bytes_of(t) for t in body], [tenc.bytes_of(t) for t in proxy], 8)
                t3 = time.perf_counter()
                for a, t, tail, text in zip(single, texts_b, tails, draft_texts):
                    a.sync(t)
                    propose_continuation(tenc, tail, text, k)
                t4 = time.perf_counter()
                if s >= warmup:
                    t_realign += t_mid - t0
                    t_batched += t1 - t0
                    t_dtw += t2 - t1
                    t_py += t3 - t2
                    t_single += t4 - t3
            per = 1e6 / (steps * batch)
            step_ms = _target_step_ms(batch)
            bridge_us = (t_batched + t_dtw) * per
            rows.append({
                "k": k, "batch": batch, "realign_us": t_realign * per,
                "retokenize_us": t_batched * per, "retokenize_unbatched_us": t_single * per,
                "dtw_compiled_us": t_dtw * per, "dtw_python_us": t_py * per,
                "dtw_speedup": t_py / t_dtw if t_dtw else None,
                "bridge_us": bridge_us, "bridge_tli_us": t_realign * per,
                "target_step_ms_est": step_ms,
                "share_of_step": bridge_us * batch / (1e3 * step_ms) if step_ms else None,
            })
            print(rows[-1], flush=True)
    lines = table(
        ["k", "batch", "realign (all algorithms)", "re-tokenization total (slem, dtw)", "same, one request at a time",
         "DTW compiled µs/req/step", "DTW Python µs/req/step", "DTW speedup", "bridge total µs/req/step",
         "share of a target step"],
        ([r["k"], r["batch"], f"{r['realign_us']:.1f}", f"{r['retokenize_us']:.1f}",
          f"{r['retokenize_unbatched_us']:.1f}", f"{r['dtw_compiled_us']:.1f}", f"{r['dtw_python_us']:.1f}",
          f"{r['dtw_speedup']:.0f}x", f"{r['bridge_us']:.1f}",
          f"{100 * r['share_of_step']:.2f}%" if r["share_of_step"] is not None else "n/a"] for r in rows))
    write_report("bridge", {"rows": rows}, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
