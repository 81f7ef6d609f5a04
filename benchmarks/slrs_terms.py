"""How much work psi (slrs) takes on real vocabulary pairs.

Two parts:

1. **Static, every target token.** For each target token y: its *segmentations* (draft
   token sequences spelling exactly y, the terms of psi(y) the paper counts: median 15,
   maximum 65,536 for Qwen2 tokens), its minimal extensions, and the drafter evaluations
   exact psi(y) needs (every path spelling a proper prefix of y or of a minimal
   extension). Counted by dynamic programming over the strings, no model needed.
2. **At run time, real contexts.** The drafter on Spec-Bench prompts: nodes evaluated
   per request and step with the default pruning and cap, candidates capped, psi's
   coverage (the drafter's mass on C), and the time per step.

    .venv/bin/python benchmarks/slrs_terms.py                 # both parts, default pairs
    .venv/bin/python benchmarks/slrs_terms.py --contexts 0    # static part only

Writes benchmarks/results/slrs_terms.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from report import table, write_report

from vllm_hetero_spec.drafter.runtime.model import DraftModel, RuntimeConfig
from vllm_hetero_spec.drafter.sampling import SamplingRows
from vllm_hetero_spec.drafter.rules.slrs.first_token import FirstTokenSampler
from hetero_harness.models import ensure_model
from hetero_harness.prompts import chat_prompts, spec_bench_questions
from vllm_hetero_spec.vocab.bridge import VocabBridge
from vllm_hetero_spec.vocab.sorted_strings import SortedStrings

def static_counts(draft: SortedStrings, target: SortedStrings) -> dict[str, np.ndarray]:
    """Per target string: segmentations, minimal extensions, exact-psi nodes."""

    @lru_cache(maxsize=None)
    def segmentations(text: bytes) -> int:
        if not text:
            return 1
        return sum(
            len(draft.ids.get(text[:j], ())) * segmentations(text[j:]) for j in range(1, min(len(text), draft.max_len) + 1)
        )

    # Counts exceed int64 (a 128-space token has ~2^127 segmentations): Python ints.
    segs, exts, nodes = [], [], []
    for y in target.strings:
        words = [y, *target.minimal_extensions(y)]
        prefixes = {w[:j] for w in words for j in range(1, len(w))}
        segs.append(segmentations(y))
        exts.append(len(words) - 1)
        nodes.append(sum(segmentations(p) for p in prefixes))  # one node per path spelling p
    return {name: np.array(v, dtype=object) for name, v in
            (("segmentations", segs), ("minimal_extensions", exts), ("nodes", nodes))}


def _summary(values: np.ndarray) -> dict[str, float]:
    ordered = np.sort(values)

    def quantile(q: float) -> float:
        return float(ordered[min(int(q * len(ordered)), len(ordered) - 1)])

    return {
        "median": quantile(0.5), "p90": quantile(0.9), "p99": quantile(0.99), "max": float(ordered[-1]),
        "zero_share": float((values == 0).mean()),
    }


def runtime_counts(bridge: VocabBridge, draft_path: str, target_path: str, contexts: int, steps: int) -> dict[str, float]:
    """Drive the drafter through real prompts: each step proposes a first token with
    slrs defaults, then commits the drafter's greedy token (a plausible text path)."""
    runtime = DraftModel(RuntimeConfig(draft_path))
    proposer = FirstTokenSampler(
        bridge.draft_bytes, bridge.target_bytes, bridge.target_encoder, bridge.target_tokenizer.eos_token_id,
        len(bridge.target_bytes), max_nodes=32, num_candidates=8, min_prob=1e-3,
    )
    prompts = chat_prompts(target_path, spec_bench_questions(contexts))
    nodes, capped, coverage, seconds = [], [], [], []
    for prompt in prompts:
        cache = runtime.new_cache()
        ids = bridge.draft_tokenizer.encode(prompt)
        logits = runtime.forward([cache], [ids])
        for _ in range(steps):
            rows = SamplingRows.build([1.0], [0], [1.0], [None], torch.device("cpu"))
            t0 = time.perf_counter()
            first = proposer.propose(runtime, [cache], logits[:, : len(bridge.draft_bytes)], rows)
            seconds.append(time.perf_counter() - t0)
            nodes.append(first.nodes)
            capped.append(first.capped)
            coverage.extend(first.coverage)
            logits = runtime.forward([cache], [[int(logits[0].argmax())]])
        cache.release()
    return {
        "steps": len(nodes), "nodes_median": statistics.median(nodes), "nodes_mean": statistics.mean(nodes),
        "nodes_max": max(nodes), "capped_per_step": statistics.mean(capped),
        "coverage_median": statistics.median(coverage) if coverage else 0.0,
        "coverage_mean": statistics.mean(coverage) if coverage else 0.0,
        "ms_per_step_median": 1e3 * statistics.median(seconds),
    }


def _vocab(model_path: str) -> int:
    return json.loads((Path(model_path) / "config.json").read_text()).get("vocab_size")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", nargs="+", default=["smollm2-135m:qwen2.5-coder-1.5b", "smollm2-135m:gemma3-270m"],
                    help="draft:target short names")
    ap.add_argument("--contexts", type=int, default=8, help="Spec-Bench prompts for the run-time part (0: skip)")
    ap.add_argument("--steps", type=int, default=16, help="steps per prompt in the run-time part")
    args = ap.parse_args()
    results = {}
    for spec in args.pairs:
        draft_name, target_name = spec.split(":")
        draft_path, target_path = str(ensure_model(draft_name)), str(ensure_model(target_name))
        bridge = VocabBridge.build(draft_path, target_path, _vocab(draft_path), _vocab(target_path))
        t0 = time.perf_counter()
        counts = static_counts(SortedStrings(bridge.draft_bytes), SortedStrings(bridge.target_bytes))
        entry = {name: _summary(v) for name, v in counts.items()}
        entry["target_tokens"] = int(counts["segmentations"].size)
        entry["segmentations_above_65536_share"] = float((counts["segmentations"] > 65536).mean())
        entry["static_seconds"] = time.perf_counter() - t0
        if args.contexts:
            entry["runtime"] = runtime_counts(bridge, draft_path, target_path, args.contexts, args.steps)
        results[spec] = entry
        print(spec, json.dumps(entry, indent=1), flush=True)
    write_report("slrs_terms", {"args": vars(args), "results": results}, to_markdown(results, args))
    print(to_markdown(results, args))


def to_markdown(results: dict, args: argparse.Namespace) -> str:
    lines = [
        "Static: per target token (all of them). Run time: slrs defaults (slrs_max_nodes 32, slrs_candidates 8, "
        f"slrs_min_prob 0.001), T = 1, {args.contexts} Spec-Bench prompts x {args.steps} steps.",
        "",
        *table(["pair (draft:target)", "per target token", "median", "p90", "p99", "max", "share zero"],
               ([spec, name.replace("_", " "), f"{s['median']:.0f}", f"{s['p90']:.0f}", f"{s['p99']:.0f}",
                 f"{s['max']:.3g}", f"{s['zero_share']:.1%}"]
                for spec, entry in results.items()
                for name in ("segmentations", "minimal_extensions", "nodes") for s in [entry[name]])),
        "",
        *table(["pair", "steps", "nodes / step (median, mean, max)", "capped candidates / step",
                "coverage (median, mean)", "ms / step"],
               ([spec, r["steps"], f"{r['nodes_median']:.0f}, {r['nodes_mean']:.1f}, {r['nodes_max']}",
                 f"{r['capped_per_step']:.2f}", f"{r['coverage_median']:.2f}, {r['coverage_mean']:.2f}",
                 f"{r['ms_per_step_median']:.0f}"]
                for spec, entry in results.items() for r in [entry.get("runtime")] if r)),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
