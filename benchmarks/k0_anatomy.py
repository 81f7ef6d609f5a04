"""Where a speculative engine's time goes when the draft budget drafts almost nothing.

A target too cheap for any drafter (Gemma-3-270M on a CPU) should run at plain speed
under the adaptive budget, which then plans k = 0 on most steps. This runs plain
decoding and ours (default settings, one rule) with the model runner's methods timed,
as ``step_anatomy.py`` does, and splits the per-step difference into the target
forward, the sampler, our proposer, and the rest of the step -- over all decode steps
(means, since the few drafted steps are part of the cost) and over the median step.
With ``--batch-size`` above 1, that many prompts run as one batch instead of one at a
time (the budget plans k = 0 on nearly every step there too).
The timers also count the engine's untimed warm-up request, whose first drafting steps
read whole prompts: the proposer's mean overstates what a timed run pays (the
proposer's per-step debug line, ``VLLM_LOGGING_LEVEL=DEBUG``, separates warm-up, probe
and planned steps).

    .venv/bin/python benchmarks/k0_anatomy.py --target gemma3-270m   # -> results/k0_anatomy.{json,md}
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from defaults import seeds_work
from report import meta as run_meta, results_dir, table, write_report
from step_anatomy import run

from hetero_harness.models import ensure_model
from hetero_harness.prompts import MAX_CHARS, chat_prompts, held_out_questions

PARTS = ("_model_forward", "_sample", "propose_draft_token_ids")


def split(calls: dict[str, list[float]]) -> dict[str, float]:
    """Per step, in ms: the whole step and its parts, mean and median."""
    steps = [a + b for a, b in zip(calls["execute_model"], calls["sample_tokens"])]
    out = {"steps": len(steps), "step_mean": 1e3 * statistics.fmean(steps), "step_median": 1e3 * statistics.median(steps)}
    for part in PARTS:
        xs = calls.get(part) or [0.0]
        out[f"{part}_mean"] = 1e3 * sum(xs) / len(steps)
        out[f"{part}_median"] = 1e3 * statistics.median(xs)
    out["rest_mean"] = out["step_mean"] - sum(out[f"{p}_mean"] for p in PARTS)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument("--draft", default="smollm2-135m")
    ap.add_argument("--algorithm", default="slem")
    ap.add_argument("--prompts", type=int, default=6, help="prompts run one at a time (batch 1)")
    ap.add_argument("--batch-size", type=int, default=1, help="above 1: this many prompts as one batch")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--full-warmup", action="store_true",
                    help="run the whole job once untimed first, as defaults.py does for batches")
    ap.add_argument("--out", type=Path, default=results_dir() / "k0_anatomy",
                    help="results path without suffix: <out>.json and <out>.md")
    args = ap.parse_args()
    target, draft = str(ensure_model(args.target)), str(ensure_model(args.draft))
    n = args.batch_size if args.batch_size > 1 else args.prompts
    prompts = chat_prompts(target, held_out_questions(n, 40))
    seeds = list(range(n)) if seeds_work(args.batch_size, args.temperature) else None
    base = {"target": target, "prompts": prompts, "max_tokens": args.max_tokens, "ignore_eos": True,
            "temperature": args.temperature, "batch_size": args.batch_size, "request_seeds": seeds,
            "max_num_seqs": max(args.batch_size, 16), "warmup": "full" if args.full_warmup else True}
    spec = {"method": "hetero", "model": draft, "num_speculative_tokens": 4, "algorithm": args.algorithm}
    rows = {}
    for name, config in (("plain", None), ("ours", spec)):
        out = run({**base, "speculative_config": config})
        rows[name] = {"tok_per_s": out["result"]["tok_per_s"], "draft_lengths": out["result"].get("draft_lengths"),
                      **split(out["calls"])}
        print(name, json.dumps(rows[name]), flush=True)
    meta = run_meta({k: str(v) for k, v in vars(args).items()})
    cols = ("step", "_model_forward", "_sample", "propose_draft_token_ids")
    shape = (f"batch 1, {n} held-out prompts one at a time" if args.batch_size == 1
             else f"{n} held-out prompts as one batch")
    lines = [f"{args.draft} drafting for {args.target} ({args.algorithm}, adaptive budget), {shape}, "
             f"T = {args.temperature}{'' if seeds else ' (unseeded)'} (prompts <= {MAX_CHARS} characters), "
             f"{args.max_tokens} tokens each{'; the job ran once untimed first' if args.full_warmup else ''}. "
             "Per step, ms: mean over every step (median). "
             "`benchmarks/k0_anatomy.py`.", "",
             *table(["run", "tok/s", "steps", "step", "target forward", "sampler", "proposer", "rest", "draft lengths"],
                    ([name, f"{r['tok_per_s']:.2f}", r["steps"],
                      *(f"{r[f'{c}_mean']:.1f} ({r[f'{c}_median']:.1f})" for c in cols), f"{r['rest_mean']:.1f}",
                      r["draft_lengths"] or "-"] for name, r in rows.items()))]
    write_report(args.out.name, {"meta": meta, "rows": rows}, lines, out=args.out.parent)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
