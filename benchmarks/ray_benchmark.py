"""The Ray drafter (DuoDecoding-style) against plain decoding, vLLM's built-in
heterogeneous drafting and our in-process drafter, in one run.

Each configuration runs in a fresh process, same prompts and settings. Besides speed
it reports where the time goes: how long the target waits for drafts per step, how
long the actor waits for the target, how much drafting the actor did while the target
computed (overlap), the pipeline's hit rate, and the draft budget the hardware-aware
rule chose. Medians over --repeats.

    .venv/bin/python benchmarks/ray_benchmark.py                  # CPU defaults below
    .venv/bin/python benchmarks/ray_benchmark.py --ray-cpus 8     # GPU machine: actor on 8 cores

Writes benchmarks/results/ray.json and benchmarks/results/ray.md.
"""

from __future__ import annotations

import argparse

from report import fmt, median, meta as run_meta, table, write_report

from hetero_harness.evaluation import run_isolated
from hetero_harness.models import ensure_model
from hetero_harness.prompts import chat_prompts, spec_bench_questions

def configs(draft: str, algorithm: str, k: int, cpus: int) -> dict[str, dict | None]:
    ours = {"method": "hetero", "model": draft, "num_speculative_tokens": k, "algorithm": algorithm}
    ray = {**ours, "executor": "ray", "ray_num_cpus": cpus}
    return {
        "plain": None,
        "vllm draft_model + use_heterogeneous_vocab": {
            "method": "draft_model", "model": draft, "num_speculative_tokens": k, "use_heterogeneous_vocab": True,
        },
        "ours in-process": ours,
        "ray actor, no pipeline, k fixed": {**ray, "pipeline": False, "draft_budget": "fixed"},
        "ray pipeline, 1 sequence, k fixed": {**ray, "max_branches": 1, "draft_budget": "fixed"},
        "ray pipeline, multi-sequence, k fixed": {**ray, "draft_budget": "fixed"},
        "ray pipeline, multi-sequence, adaptive k": ray,
    }



def timing(run: dict) -> dict[str, float | None]:
    """Per-step figures from one run's drafter counters."""
    raw = run.get("drafter_raw")
    if not raw or not raw["steps"]:
        return {}
    steps = raw["steps"]
    on_demand = raw["draft_s"] + raw["bridge_s"]
    remote = raw["ray_target_s"] > 0
    tried = raw["pipeline_hits"] + raw["pipeline_misses"]
    return {
        # In process the target waits for all of the drafting; with Ray, for the call.
        "wait_ms": 1e3 * (raw["ray_wait_s"] if remote else on_demand) / steps,
        "target_ms": 1e3 * raw["ray_target_s"] / steps if remote else None,
        "actor_idle_ms": 1e3 * raw["actor_idle_s"] / steps if remote else None,
        "overlap": raw["pipeline_s"] / (raw["pipeline_s"] + on_demand) if remote and raw["pipeline_s"] else None,
        "hit_rate": raw["pipeline_hits"] / tried if tried else None,
        "budget": raw["budget_sum"] / steps if raw["budget_sum"] else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="smollm2-135m")
    ap.add_argument("--algorithm", default="slem")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--ray-cpus", type=int, default=1, help="CPUs (and torch threads) of the drafter actor")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0])
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    target = str(ensure_model(args.target))
    draft = str(ensure_model(args.draft))
    prompts = chat_prompts(target, spec_bench_questions(args.num_prompts))
    meta = run_meta(args)
    rows = []
    for temp in args.temperatures:
        plain_tps = None
        for name, spec in configs(draft, args.algorithm, args.k, args.ray_cpus).items():
            runs = []
            for rep in range(args.repeats):
                job = {
                    "target": target, "prompts": prompts, "max_tokens": args.max_tokens, "temperature": temp,
                    "batch_size": args.batch_size, "speculative_config": spec,
                    "request_seeds": list(range(len(prompts))), "ignore_eos": True,
                }
                try:
                    runs.append(run_isolated(job))
                except RuntimeError as e:
                    print(f"{name} T={temp}: FAILED {str(e)[-300:]}", flush=True)
                    break
                print(f"{name} T={temp} rep={rep}: {runs[-1]['tok_per_s']:.2f} tok/s", flush=True)
            if not runs:
                rows.append({"config": name, "temperature": temp, "error": "failed"})
                continue
            tps = median([r["tok_per_s"] for r in runs])
            plain_tps = tps if name == "plain" else plain_tps
            times = [timing(r) for r in runs]
            rows.append({
                "config": name, "temperature": temp, "repeats": len(runs), "tok_per_s": tps,
                "speedup": tps / plain_tps if plain_tps else None,
                "acceptance_rate": median([r["acceptance_rate"] for r in runs]),
                "restarts": max(r.get("drafter_raw", {}).get("ray_restarts", 0) for r in runs),
                **{key: median([t.get(key) for t in times]) for key in
                   ("wait_ms", "target_ms", "actor_idle_ms", "overlap", "hit_rate", "budget")},
            })
            write_report("ray", {"meta": meta, "rows": rows}, to_markdown(rows, args))
    print(to_markdown(rows, args))



def to_markdown(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"Target {args.target} (float32), draft {args.draft}, `{args.algorithm}`, k={args.k}, actor on "
        f"{args.ray_cpus} CPU(s), batch {args.batch_size}, {args.num_prompts} Spec-Bench prompts x "
        f"{args.max_tokens} tokens, median of {args.repeats}. Waits and times are per step.",
        "",
    ]
    body = []
    for r in rows:
        if "error" in r:
            body.append([r["temperature"], r["config"], "failed", *[""] * 8])
            continue
        body.append([
            r["temperature"], r["config"], f"{r['tok_per_s']:.2f}", f"{fmt(r['speedup'], '.2f')}x",
            fmt(r["acceptance_rate"], ".1%"), fmt(r["wait_ms"], ".0f"), fmt(r["target_ms"], ".0f"),
            fmt(r["actor_idle_ms"], ".0f"), fmt(r["overlap"], ".0%"), fmt(r["hit_rate"], ".0%"), fmt(r["budget"], ".1f"),
        ])
    lines += table(["T", "configuration", "tok/s", "speedup", "acceptance", "target waits, ms", "target step, ms",
                    "actor idle, ms", "overlap", "pipeline hits", "mean k"], body)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
