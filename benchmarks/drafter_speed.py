"""Drafter speed: the vLLM-native drafter against the transformers drafter it replaced.

The old drafter (a transformers model with a packed attention backend and contiguous
per-request caches) is no longer in the package; this benchmark loads it from the git
history (``LEGACY_COMMIT``) into a temporary module, so both run in the same process on
the same weights. Each batch size b: b requests with a ``--context``-token prompt
(prefilled, not timed), then ``--steps`` decode forwards of one token per request, the
drafter's per-step work in a draft loop. Median of ``--repeats``. The new drafter also
runs in each of ``--new-dtypes`` (the draft dtype is independent of the target's and
never changes outputs, only acceptance and speed).

    .venv/bin/python benchmarks/drafter_speed.py            # -> results/drafter_speed.{json,md} (--name)

The end-to-end comparison with vLLM's own in-engine drafter (same draft model, same
run) is ``benchmarks/e2e_benchmark.py`` (its ``propose ms/draft token`` column).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from report import median, meta as run_meta, table, write_report

from vllm_hetero_spec.drafter.runtime.model import DraftModelRuntime, RuntimeConfig
from hetero_harness.models import ensure_model

ROOT = Path(__file__).resolve().parent.parent
LEGACY_COMMIT = "465d77b"  # the last commit with the transformers drafter
LEGACY_FILES = ("runtime.py", "kv_cache.py", "varlen_attention.py")


def load_legacy() -> type:
    """The old ``DraftModelRuntime`` class, from the git history."""
    folder = Path(tempfile.mkdtemp()) / "legacy_drafter"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    for name in LEGACY_FILES:
        text = subprocess.run(
            ["git", "show", f"{LEGACY_COMMIT}:vllm_hetero_spec/drafter/{name}"], cwd=ROOT, check=True,
            capture_output=True, text=True,
        ).stdout
        (folder / name).write_text(text.replace("vllm_hetero_spec.drafter", "legacy_drafter"))
    sys.path.insert(0, str(folder.parent))
    spec = importlib.util.find_spec("legacy_drafter.runtime")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.DraftModelRuntime


def time_runtime(runtime, batch: int, context: int, steps: int) -> float:
    """Seconds per decode forward of ``batch`` requests."""
    caches = [runtime.new_cache() for _ in range(batch)]
    prompts = [[(i * 37 + j) % 20000 + 100 for j in range(context)] for i in range(batch)]
    runtime.forward(caches, prompts)
    runtime.forward(caches, [[5] for _ in range(batch)])  # warm
    t0 = time.perf_counter()
    for s in range(steps):
        runtime.forward(caches, [[100 + s] for _ in range(batch)])
    elapsed = (time.perf_counter() - t0) / steps
    for cache in caches:
        getattr(cache, "release", lambda: None)()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", default="smollm2-135m")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new-dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--name", default="drafter_speed", help="results file name (another machine's run keeps its own)")
    args = ap.parse_args()
    draft = str(ensure_model(args.draft))
    news = {d: DraftModelRuntime(RuntimeConfig(draft, getattr(torch, d), kv_pool_mb=1024)) for d in args.new_dtypes}
    old = load_legacy()(draft, torch.float32)
    rows = []
    for b in args.batch_sizes:
        t_old = median([time_runtime(old, b, args.context, args.steps) for _ in range(args.repeats)])
        for dtype, new in news.items():
            t_new = median([time_runtime(new, b, args.context, args.steps) for _ in range(args.repeats)])
            rows.append({
                "batch_size": b, "new_dtype": dtype, "old_ms_per_forward": 1e3 * t_old,
                "new_ms_per_forward": 1e3 * t_new, "old_ms_per_draft_token": 1e3 * t_old / b,
                "new_ms_per_draft_token": 1e3 * t_new / b, "speedup": t_old / t_new,
            })
            print(rows[-1], flush=True)
    meta = run_meta(args, threads=torch.get_num_threads())
    lines = [
        f"Draft model {args.draft}; the old (transformers) drafter in float32, the vLLM-native one in the dtype "
        f"shown; {torch.get_num_threads()} threads, {args.context}-token contexts, one decode token per request per "
        f"forward, median of {args.repeats} x {args.steps} forwards. `benchmarks/drafter_speed.py`; "
        f"machine: {meta['machine']}, {meta['date']}.",
        "",
        *table(["batch", "new dtype", "transformers drafter ms/forward", "vLLM-native drafter ms/forward",
                "old ms/draft token", "new ms/draft token", "speedup"],
               ([r["batch_size"], r["new_dtype"], f"{r['old_ms_per_forward']:.1f}", f"{r['new_ms_per_forward']:.1f}",
                 f"{r['old_ms_per_draft_token']:.2f}", f"{r['new_ms_per_draft_token']:.2f}", f"{r['speedup']:.2f}x"]
                for r in rows)),
    ]
    write_report(args.name, {"meta": meta, "rows": rows}, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
