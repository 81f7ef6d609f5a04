"""Verification speed: our rejection sampler against vLLM's own on the same inputs.

One verification step as vLLM runs it: B requests with k = 4 drafts each, the target's
``[B * (k + 1), V]`` logits (V = 151,936, Qwen2.5's vocabulary), at T = 0 (greedy) and
T = 1. vLLM's ``RejectionSampler`` gets the draft distributions the way vLLM's own
draft-model method hands them over, dense ``[B * k, V]`` (at T = 0 none); ours gets
its :class:`VerifyPlan`, q in compact form on the intersection's support (the
SmolLM2 -> Qwen2.5 support size by default). Both run vLLM's bonus sampling and
sampling constraints; the CPU build's kernels are registered as the CPU worker does.

Reported per point: the median time of one verification over ``--repeats`` runs (ours and
vLLM's interleaved), and the
host memory allocated during one verification (torch profiler, ``profile_memory``: the
sum of every op's own allocations, so a tensor allocated and freed twice counts twice).

    .venv/bin/python benchmarks/verify_speed.py         # -> results/verify_speed.{json,md}
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
from report import fmt, median, results_dir, table, write_report

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # vLLM's inputs, built as the tests do
from _sampler_inputs import sampling_metadata, spec_metadata  # noqa: E402

from vllm_hetero_spec.verify.sampler import BatchRows  # noqa: E402

VOCAB = 151936
SUPPORT = 39234  # SmolLM2-135M -> Qwen2.5: distinct target ids of the vocabulary intersection


def _inputs(b: int, k: int, greedy: bool, gen: torch.Generator) -> dict:
    """One step's logits, drafts, layout and sampling settings (host tensors)."""
    drafts = torch.randint(0, VOCAB, (b, k), generator=gen).tolist()
    logits = torch.randn(b * (k + 1), VOCAB, generator=gen) * 3
    return dict(
        metadata=spec_metadata(drafts),
        logits=logits,
        sampling=sampling_metadata(b, [0.0 if greedy else 1.0] * b),
        rows=BatchRows([f"r{i}" for i in range(b)], [greedy] * b, [0] * b),
    )


def _plan(b: int, k: int, greedy: bool, gen: torch.Generator):
    from vllm_hetero_spec.verify.draft_probs import DraftProbs
    from vllm_hetero_spec.verify.plan import VerifyPlan

    req_ids = [f"r{i}" for i in range(b)]
    if greedy:
        return VerifyPlan()
    support = torch.randperm(VOCAB, generator=gen)[:SUPPORT].sort().values
    probs = torch.rand(b * k, SUPPORT, generator=gen).softmax(-1)
    return VerifyPlan(DraftProbs(probs, support), {r: list(range(i * k, (i + 1) * k)) for i, r in enumerate(req_ids)})


def _dense_q(b: int, k: int, greedy: bool, gen: torch.Generator) -> torch.Tensor | None:
    return None if greedy else torch.rand(b * k, VOCAB, generator=gen).softmax(-1)


def _host_bytes(fn) -> int:
    """Bytes of host memory the ops of ``fn()`` allocate (profiler, profile_memory)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return int(sum(max(e.self_cpu_memory_usage, 0) for e in prof.events()))


def measure(b: int, k: int, greedy: bool, repeats: int) -> dict:
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    from vllm_hetero_spec.verify.sampler import HeteroRejectionSampler

    gen = torch.Generator().manual_seed(b * 10 + greedy)
    inp = _inputs(b, k, greedy, gen)
    plan = _plan(b, k, greedy, gen)
    dense = _dense_q(b, k, greedy, gen)
    ours = HeteroRejectionSampler(Sampler(), None, torch.device("cpu"), batch_rows=lambda: inp["rows"])
    theirs = RejectionSampler(Sampler())

    def run_ours() -> None:
        ours.plan = plan
        ours(inp["metadata"], None, inp["logits"], inp["sampling"])

    def run_theirs() -> None:
        theirs(inp["metadata"], dense, inp["logits"], inp["sampling"])

    out = {"batch": b, "k": k, "mode": "greedy" if greedy else "T=1"}
    runs = {"ours": run_ours, "vllm": run_theirs}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for fn in runs.values():
        fn()  # warm-up
    for _ in range(repeats):  # interleaved, so drift in the machine's speed hits both alike
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    for name, fn in runs.items():
        out[f"{name}_ms"] = 1000 * median(times[name])
        out[f"{name}_host_mb"] = _host_bytes(fn) / 2**20
    out["ratio"] = out["ours_ms"] / out["vllm_ms"]
    out["q_mb_ours"] = 0.0 if plan.q is None else plan.q.nbytes / 2**20
    out["q_mb_vllm"] = 0.0 if dense is None else dense.nbytes / 2**20
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--out", type=Path, default=results_dir() / "verify_speed",
                        help="results path without suffix: <out>.json and <out>.md")
    args = parser.parse_args()

    from vllm.platforms.cpu import CpuPlatform

    import vllm_hetero_spec

    CpuPlatform.register_triton_kernel_overrides()  # what the CPU worker does at start-up
    vllm_hetero_spec.register()  # the expand fix: vLLM's own sampler needs it at T > 0 too
    torch.manual_seed(0)
    rows = [measure(b, args.k, greedy, args.repeats) for b in args.batches for greedy in (True, False)]
    for r in rows:
        print(json.dumps(r))
    meta = {"machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "vocab": VOCAB, "support": SUPPORT, "repeats": args.repeats}
    lines = [
        f"One verification step, k = {args.k}, V = {VOCAB}; q compact on a {SUPPORT}-id support (ours) or dense "
        f"(vLLM's draft-model layout). Median of {args.repeats} runs; host MB = memory the step's ops allocate. "
        f"{torch.get_num_threads()} threads. `benchmarks/verify_speed.py`.",
        "",
        *table(["batch", "mode", "ours ms", "vLLM ms", "ours / vLLM", "ours host MB", "vLLM host MB", "q MB ours",
                "q MB vLLM"],
               ([r["batch"], r["mode"], fmt(r["ours_ms"], ".2f"), fmt(r["vllm_ms"], ".2f"), f"{fmt(r['ratio'], '.2f')}x",
                 fmt(r["ours_host_mb"], ".1f"), fmt(r["vllm_host_mb"], ".1f"), fmt(r["q_mb_ours"], ".1f"),
                 fmt(r["q_mb_vllm"], ".1f")] for r in rows)),
    ]
    title = "Verification: our rejection sampler vs vLLM's"
    write_report(args.out.name, {"meta": meta, "rows": rows}, lines, title=title, out=args.out.parent)
    print("\n".join([f"# {title}", "", *lines]))


if __name__ == "__main__":
    main()
