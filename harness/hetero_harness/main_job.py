"""The main job: a real heterogeneous speculative-decoding batch run, with no arguments.

``python -m hetero_harness`` runs Spec-Bench prompts through vLLM's offline
``LLM.generate`` twice on the same machine -- the target alone, then the target with a
draft model of another vocabulary -- and prints tokens/s, speedup, acceptance rate,
mean acceptance length, and whether the outputs are identical (T = 0).
"""

from __future__ import annotations

import argparse
import json

from vllm_hetero_spec.config import ALGORITHMS
from hetero_harness.evaluation import run_isolated
from hetero_harness.models import MODELS, ensure_model
from hetero_harness.prompts import chat_prompts, spec_bench_questions


def _path(name: str) -> str:
    return str(ensure_model(name)) if name in MODELS else name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b", help="target model folder or short name")
    ap.add_argument("--draft", default="smollm2-135m", help="draft model folder or short name")
    ap.add_argument("--algorithm", default="auto", choices=ALGORITHMS,
                    help="auto: the plugin picks the rule per request from what it measures")
    ap.add_argument("-k", "--num-speculative-tokens", type=int, default=4,
                    help="the most tokens drafted per step (the adaptive budget picks 0..k each step)")
    ap.add_argument("--draft-budget", default="adaptive", choices=("adaptive", "fixed"),
                    help="fixed: always k draft tokens")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=1, help="requests submitted together")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--draft-dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                    help="auto: the target's dtype on CUDA, bfloat16 on a CPU with native bf16, else float32")
    ap.add_argument("--executor", default="inprocess", choices=("inprocess", "ray"),
                    help="ray: draft in a Ray actor on CPU cores, pipelined with the target")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()

    target, draft = _path(args.target), _path(args.draft)
    prompts = chat_prompts(target, spec_bench_questions(args.num_prompts))
    base = {
        "target": target,
        "prompts": prompts,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "batch_size": args.batch_size,
        "request_seeds": list(range(len(prompts))),
    }
    spec = {
        "method": "hetero",
        "model": draft,
        "num_speculative_tokens": args.num_speculative_tokens,
        "algorithm": args.algorithm,
        "draft_dtype": args.draft_dtype,
        "draft_budget": args.draft_budget,
    }
    if args.executor == "ray":
        spec["executor"] = "ray"
    print(f"target={args.target} draft={args.draft} algorithm={args.algorithm} executor={args.executor} "
          f"k<={args.num_speculative_tokens} budget={args.draft_budget} "
          f"prompts={len(prompts)} max_tokens={args.max_tokens} batch={args.batch_size} T={args.temperature}",
          flush=True)
    plain = run_isolated(base)
    print(f"plain decoding: {plain['tok_per_s']:.2f} tok/s", flush=True)
    hetero = run_isolated({**base, "speculative_config": spec})
    same = sum(a == b for a, b in zip(plain["token_ids"], hetero["token_ids"]))
    summary = {
        "plain_tok_per_s": plain["tok_per_s"],
        "hetero_tok_per_s": hetero["tok_per_s"],
        "speedup": hetero["tok_per_s"] / plain["tok_per_s"],
        "acceptance_rate": hetero["acceptance_rate"],
        "mean_acceptance_length": hetero["mean_acceptance_length"],
        "bridge_ms_per_step": hetero.get("bridge_ms_per_step"),
        "draft_ms_per_step": hetero.get("draft_ms_per_step"),
        "identical_outputs": f"{same}/{len(prompts)}",
        "draft_lengths": hetero.get("draft_lengths"),
        "rules_chosen": hetero.get("rules_chosen"),
        "rule_rates": hetero.get("rule_rates"),
    }
    summary["draft_dtype"] = hetero.get("draft_dtype")
    print(f"hetero ({args.algorithm}, draft dtype {summary['draft_dtype']}): {hetero['tok_per_s']:.2f} tok/s  "
          f"speedup {summary['speedup']:.2f}x")

    def fmt(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    print(f"acceptance rate {fmt(summary['acceptance_rate'], '.1%')}  mean acceptance length "
          f"{fmt(summary['mean_acceptance_length'], '.2f')}  bridge {fmt(summary['bridge_ms_per_step'], '.2f')} ms/step  "
          f"drafter {fmt(summary['draft_ms_per_step'], '.1f')} ms/step")
    lengths = summary["draft_lengths"] or {}
    print("draft length chosen per step (k: steps): " + ", ".join(f"{k}: {n}" for k, n in lengths.items()))
    if summary["rules_chosen"] is not None:
        rates = "; ".join(f"{kind}: " + ", ".join(f"{r} {v:.2f}" for r, v in by_rule.items())
                          for kind, by_rule in (summary["rule_rates"] or {}).items() if by_rule)
        print("rule chosen per drafted request-step: " + ", ".join(
            f"{r}: {n}" for r, n in sorted(summary["rules_chosen"].items(), key=lambda x: -x[1]))
              + (f"  (measured tok/s per rule, {rates})" if rates else ""))
    if args.temperature == 0:
        print(f"identical to plain decoding: {summary['identical_outputs']} prompts")
    print("sample output:", json.dumps(hetero["texts"][0][:200]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "summary": summary}, f, indent=2)


if __name__ == "__main__":
    main()
