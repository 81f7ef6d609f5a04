"""Draft loop speed before and after a change, in one run.

``BatchDrafter.step`` on the real drafter (SmolLM2-135M, the draft dtype ``auto`` picks
here) and the real SmolLM2 -> Qwen2.5 tokenizer pair: b requests with Spec-Bench
prompts, one warm step (their prompts), then ``--steps`` timed steps, each committing
one more target token per request (the first proposal, or a space), so every step
syncs, drafts k = 4 and maps. The baseline is the package at ``--baseline`` (a commit,
exported with ``git archive``); each side runs in its own process, the sides alternate
per repeat, and the median of the repeats' per-step medians is reported.

    .venv/bin/python benchmarks/draft_loop_speed.py     # -> results/draft_loop_speed.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report import median, meta as run_meta, range_cell, table, write_report

ROOT = Path(__file__).resolve().parent.parent


def child(args: argparse.Namespace) -> None:
    """One side, one repeat: print ``{(algorithm, batch): ms per step}`` as JSON."""
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from vllm_hetero_spec.config import HeteroSettings
    from vllm_hetero_spec.drafter.batch_drafter import BatchDrafter
    from vllm_hetero_spec.drafter.messages import RequestParams, StepBatch
    from hetero_harness.models import ensure_model
    from hetero_harness.prompts import spec_bench_questions

    draft, target = str(ensure_model("smollm2-135m")), str(ensure_model("qwen2.5-coder-0.5b"))
    tok = AutoTokenizer.from_pretrained(target)
    questions = spec_bench_questions(max(args.batch_sizes))
    out = {}
    for algorithm in args.algorithms:
        settings = HeteroSettings(algorithm=algorithm, draft_model=draft, draft_tokenizer=draft,
                                  num_speculative_tokens=4, max_draft_tokens=4, draft_budget="fixed",
                                  draft_kv_pool_mb=256)
        engine = BatchDrafter(settings, target, 151936)
        for b in args.batch_sizes:
            ids = [f"{algorithm}-{b}-{i}" for i in range(b)]
            tokens = [tok.encode(q)[:200] for q in questions[:b]]
            params = [RequestParams(args.temperature)] * b
            times = []
            for step in range(args.steps + 1):
                t0 = time.perf_counter()
                drafts = engine.step(StepBatch(ids, [np.array(t) for t in tokens], params, 4))
                if step:
                    times.append(time.perf_counter() - t0)
                tokens = [t + (d[:1] or [220]) for t, d in zip(tokens, drafts.ids)]
            engine.keep_only(set())
            out[f"{algorithm}/{b}"] = 1e3 * median(times)
        del engine
    print(json.dumps({"threads": torch.get_num_threads(), "ms": out}))


def run_side(src: Path, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{Path(__file__).parent}"}
    cmd = [sys.executable, __file__, "--child", "--steps", str(args.steps), "--temperature", str(args.temperature),
           "--algorithms", *args.algorithms, "--batch-sizes", *map(str, args.batch_sizes)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{src}: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default="207a34b")
    ap.add_argument("--algorithms", nargs="+", default=["tli", "slem"])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--name", default="draft_loop_speed", help="results/<name>.{json,md}")
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        return child(args)
    base = Path(tempfile.mkdtemp())
    archive = subprocess.run(["git", "archive", args.baseline, "vllm_hetero_spec", "data"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
    sides = {"baseline": base, "current": ROOT}
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, src in sides.items():
            runs[name].append(run_side(src, args)["ms"])
            print(name, runs[name][-1], flush=True)
    keys = list(runs["current"][0])
    rows = [{"case": k, "baseline_ms": median([r[k] for r in runs["baseline"]]),
             "current_ms": median([r[k] for r in runs["current"]]),
             "spread_ms": {n: [min(r[k] for r in runs[n]), max(r[k] for r in runs[n])] for n in runs}} for k in keys]
    for r in rows:
        r["speedup"] = r["baseline_ms"] / r["current_ms"]
    meta = run_meta({k: v for k, v in vars(args).items() if k != "child"}, commit_baseline=args.baseline)
    lines = [
        f"`BatchDrafter.step` (k = 4, T = {args.temperature}), SmolLM2-135M drafting for the Qwen2.5 tokenizer, "
        f"200-token Spec-Bench prompts; median over {args.repeats} alternating runs per side of the per-step "
        f"median of {args.steps} steps; baseline = commit `{args.baseline}`. `benchmarks/draft_loop_speed.py`.",
        "",
        *table(["algorithm / batch", "baseline ms/step", "current ms/step", "speedup", "spread (baseline; current)"],
               ([r["case"], f"{r['baseline_ms']:.1f}", f"{r['current_ms']:.1f}", f"{r['speedup']:.2f}x",
                 f"{range_cell(*r['spread_ms']['baseline'], '.1f')}; {range_cell(*r['spread_ms']['current'], '.1f')}"]
                for r in rows)),
    ]
    write_report(args.name, {"meta": meta, "rows": rows}, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
