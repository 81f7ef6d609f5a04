"""What min_p, logit_bias and seeds cost under speculation: batch 1, T = 1.

Plain decoding and the shipped config (``algorithm: auto``), both with top-k, top-p and
min_p set (vLLM's own speculative methods refuse min_p), and the shipped config again
with a seed per request (seeded requests are verified by equality with their positions'
seeded samples, ``verify/seeded.py``). Every configuration in a fresh process with
vLLM's default flags, interleaved and repeated; speedups are per repeat against that
repeat's plain run.

    .venv/bin/python benchmarks/sampling_params.py --repeats 2 [--in-process]

Writes benchmarks/results/sampling_params.json and .md.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from report import fmt, median, ratio_cell, table, write_report

from hetero_harness.evaluation import run_isolated
from hetero_harness.models import ensure_model
from hetero_harness.prompts import chat_prompts, spec_bench_questions

FILTERS = {"top_k": 40, "top_p": 0.95}
MIN_P = 0.05


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="smollm2-135m")
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--in-process", action="store_true",
                    help="engines in the caller's process (VLLM_ENABLE_V1_MULTIPROCESSING=0), as the earlier "
                         "benchmarks ran; on a 2-core CPU vLLM's default layout leaves the worker one core")
    args = ap.parse_args()
    target, draft = str(ensure_model(args.target)), str(ensure_model(args.draft))
    prompts = chat_prompts(target, spec_bench_questions(args.num_prompts))
    spec = {**json.loads((Path(__file__).parents[1] / "configs/hetero.json").read_text()), "model": draft}
    configs = {
        "plain": (None, None),
        "hetero auto": (spec, None),
        "hetero auto, seeded": (spec, list(range(len(prompts)))),
    }
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for repeat in range(args.repeats):
        for name, (spec_config, seeds) in configs.items():
            job = {
                "target": target, "prompts": prompts, "max_tokens": args.max_tokens, "temperature": 1.0,
                **FILTERS, "params": [{"min_p": MIN_P}] * len(prompts), "request_seeds": seeds,
                "speculative_config": spec_config, "batch_size": 1, "seed": repeat,
            }
            t0 = time.perf_counter()
            result = run_isolated(job, env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if args.in_process else None)
            print(f"repeat {repeat} {name}: {result['tok_per_s']:.2f} tok/s, mean acceptance length "
                  f"{result['mean_acceptance_length']}, {time.perf_counter() - t0:.0f} s", flush=True)
            runs[name].append({k: result.get(k) for k in ("tok_per_s", "output_tokens", "elapsed_s",
                                                          "mean_acceptance_length", "acceptance_rate",
                                                          "rules_chosen")})
            write(args, len(prompts), runs)


def write(args: argparse.Namespace, n_prompts: int, runs: dict[str, list[dict]]) -> None:
    """The JSON and markdown of the repeats so far (rewritten after each run)."""
    rows = []
    done = len(runs["plain"])
    for name, results in runs.items():
        ratios = [r["tok_per_s"] / p["tok_per_s"] for r, p in zip(results, runs["plain"])]
        rows.append({
            "config": name, "tok_per_s": median([r["tok_per_s"] for r in results]),
            "speedup": median(ratios), "speedup_min": min(ratios, default=None),
            "speedup_max": max(ratios, default=None),
            "mean_acceptance_length": median([r["mean_acceptance_length"] for r in results]),
            "acceptance_rate": median([r["acceptance_rate"] for r in results]),
        })
    setup = {"target": args.target, "draft": args.draft, "prompts": n_prompts, "max_tokens": args.max_tokens,
             "batch_size": 1, "temperature": 1.0, **FILTERS, "min_p": MIN_P, "repeats": done,
             "engine_layout": "in process" if args.in_process else "vLLM's default (engine core process)",
             "machine": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d")}
    lines = [
        f"Batch 1, T = 1, top-k {FILTERS['top_k']}, top-p {FILTERS['top_p']}, min_p {MIN_P}; {args.draft} drafting "
        f"for {args.target}; {n_prompts} Spec-Bench prompts x {args.max_tokens} tokens; medians of "
        f"{done} interleaved repeats (speedup: min-max over repeats); engines "
        f"{'in process' if args.in_process else 'in vLLM default layout'}. vLLM's own speculative methods "
        "refuse min_p.",
        "",
        *table(["config", "tok/s", "speedup over plain", "mean acceptance length", "acceptance rate"],
               ([row["config"], fmt(row["tok_per_s"], ".2f"),
                 ratio_cell(row["speedup"], row["speedup_min"], row["speedup_max"]),
                 fmt(row["mean_acceptance_length"], ".2f"), fmt(row["acceptance_rate"], ".2f")] for row in rows)),
    ]
    write_report("sampling_params", {"setup": setup, "rows": rows, "runs": runs}, lines, indent=1)
    print("\n".join(lines), flush=True)

if __name__ == "__main__":
    main()
