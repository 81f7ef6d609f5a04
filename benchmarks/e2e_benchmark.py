"""End-to-end benchmark: plain decoding vs vLLM's built-in options vs ours, one run.

Same machine, same prompts, same engine settings; every configuration in a fresh
process. Reports output tok/s, speedup over plain decoding, acceptance rate, mean
acceptance length, the time our bridge adds per step, and -- for ours and vLLM's own
draft models alike -- the runner's drafting time (``propose_draft_token_ids``) per draft
token and the time per engine step; medians over --repeats.

    .venv/bin/python benchmarks/e2e_benchmark.py            # defaults below
    .venv/bin/python benchmarks/e2e_benchmark.py --repeats 3 --batch-sizes 1 8

Writes benchmarks/results/e2e.json and benchmarks/results/e2e.md.
"""

from __future__ import annotations

import argparse
import time

from report import fmt, median, meta as run_meta, table, write_report

from hetero_harness.evaluation import run_isolated
from hetero_harness.models import ensure_model
from hetero_harness.prompts import chat_prompts, spec_bench_questions

def configs(draft: str, same_vocab_draft: str, k: int) -> dict[str, dict | None]:
    return {
        "plain": None,
        "vllm draft_model + use_heterogeneous_vocab (greedy TLI)": {
            "method": "draft_model", "model": draft, "num_speculative_tokens": k, "use_heterogeneous_vocab": True,
        },
        "vllm draft_model, same vocab (Qwen-0.5B)": {
            "method": "draft_model", "model": same_vocab_draft, "num_speculative_tokens": k,
        },
        "ours slem": {"method": "hetero", "model": draft, "num_speculative_tokens": k, "algorithm": "slem"},
        "ours tli": {"method": "hetero", "model": draft, "num_speculative_tokens": k, "algorithm": "tli"},
        "ours dtw (faithful)": {
            "method": "hetero", "model": draft, "num_speculative_tokens": k, "algorithm": "dtw",
            "dtw_verify": "faithful",
        },
        "ours union": {"method": "hetero", "model": draft, "num_speculative_tokens": k, "algorithm": "union"},
        "ours slrs": {"method": "hetero", "model": draft, "num_speculative_tokens": k, "algorithm": "slrs"},
        "ours fsd (tau 0.1)": {
            "method": "hetero", "model": draft, "num_speculative_tokens": k, "algorithm": "fsd", "fsd_threshold": 0.1,
        },
    }



def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="smollm2-135m")
    ap.add_argument("--same-vocab-draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--only", nargs="*", help="substrings of configuration names to run")
    args = ap.parse_args()

    target = str(ensure_model(args.target))
    draft = str(ensure_model(args.draft))
    same = str(ensure_model(args.same_vocab_draft))
    prompts = chat_prompts(target, spec_bench_questions(args.num_prompts))
    rows = []
    meta = run_meta(args)
    cells = [(t, b) for b in args.batch_sizes for t in args.temperatures]
    for temp, bs in cells:
        n = bs if bs > 1 else min(len(prompts), 4)
        plain_tps = None
        cases = [(name, spec) for name, spec in configs(draft, same, args.k).items()
                 if not args.only or name == "plain" or any(s in name for s in args.only)]
        for name, spec in cases:
            runs = []
            for rep in range(args.repeats):
                job = {
                    "target": target, "prompts": prompts[:n], "max_tokens": args.max_tokens,
                    "temperature": temp, "batch_size": bs, "speculative_config": spec,
                    "request_seeds": list(range(n)), "ignore_eos": True,
                }
                t0 = time.time()
                try:
                    runs.append(run_isolated(job))
                except RuntimeError as e:
                    print(f"{name} T={temp} bs={bs}: FAILED {str(e)[-300:]}", flush=True)
                    break
                print(f"{name} T={temp} bs={bs} rep={rep}: {runs[-1]['tok_per_s']:.2f} tok/s "
                      f"({time.time() - t0:.0f}s wall)", flush=True)
            if not runs:
                rows.append({"config": name, "temperature": temp, "batch_size": bs, "error": "failed"})
                continue
            tps = median([r["tok_per_s"] for r in runs])
            if name == "plain":
                plain_tps = tps
            rows.append({
                "config": name, "temperature": temp, "batch_size": bs, "repeats": len(runs),
                "tok_per_s": tps,
                "speedup": tps / plain_tps if plain_tps else None,
                "acceptance_rate": median([r["acceptance_rate"] for r in runs]),
                "mean_acceptance_length": median([r["mean_acceptance_length"] for r in runs]),
                "bridge_ms_per_step": median([r.get("bridge_ms_per_step") for r in runs]),
                "draft_ms_per_step": median([r.get("draft_ms_per_step") for r in runs]),
                "propose_ms_per_draft_token": median([r.get("propose_ms_per_draft_token") for r in runs]),
                "step_ms": median([1e3 * r["elapsed_s"] / r["propose_calls"] for r in runs if r.get("propose_calls")]),
            })
            # Written after every row, so an interrupted run keeps what it measured.
            write_report("e2e", {"meta": meta, "rows": rows}, to_markdown(rows, args))
    print(to_markdown(rows, args))



def to_markdown(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"Target {args.target} (float32), drafts {args.draft} / {args.same_vocab_draft}, k={args.k}, "
        f"{args.max_tokens} output tokens per request, Spec-Bench prompts, median of {args.repeats}.",
        "",
    ]
    body = []
    for r in rows:
        if "error" in r:
            body.append([r["temperature"], r["batch_size"], r["config"], "failed", *[""] * 7])
            continue
        body.append([
            r["temperature"], r["batch_size"], r["config"], f"{r['tok_per_s']:.2f}", f"{fmt(r['speedup'], '.2f')}x",
            fmt(r["acceptance_rate"], ".1%"), fmt(r["mean_acceptance_length"], ".2f"),
            fmt(r["bridge_ms_per_step"], ".2f"), fmt(r["draft_ms_per_step"], ".0f"),
            fmt(r.get("propose_ms_per_draft_token"), ".1f"), fmt(r.get("step_ms"), ".0f"),
        ])
    lines += table(["T", "batch", "configuration", "tok/s", "speedup", "acceptance", "mean acc. length",
                    "bridge ms/step", "drafter ms/step", "propose ms/draft token", "step ms"], body)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
