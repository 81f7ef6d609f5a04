"""A drafter of the target's own vocabulary: our plugin against vLLM's ``draft_model``.

Qwen2.5-Coder-0.5B drafting for Qwen2.5-Coder-1.5B (one vocabulary, so our bridge is an
id map and ``auto`` drafts with ``tli`` alone), held-out Spec-Bench prompts (never in
``advise``'s sample), batch 1, T = 0, 48 tokens each. Per round, one engine per
configuration in turn (each in a process of its own, one alive at a time, so a large
target's memory is freed between them), so the rounds interleave:

- plain decoding;
- vLLM's ``draft_model`` at k = 4;
- ours as shipped (``auto``, the adaptive budget) at k <= 4, and the same with the
  drafter's output layer over its 65536 most frequent tokens (``draft_head_tokens``);
- ours at a fixed k = 4 with ``tli``, over the id map and (``id_map: off``) over
  re-tokenized text, and with a float16 drafter (a knob ``draft_model`` lacks: its
  drafter runs in the target's dtype).

Each configuration's tokens per second over the same round's plain decoding; the ratio
to ``draft_model`` in the same round; and the draft lengths each drafted (vLLM's
counters: drafts, draft tokens, acceptance per position).

    .venv/bin/python benchmarks/same_vocab.py [--rounds 2] [--configs "ours, as shipped (auto)"]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from report import meta, ratio_cell, table, write_report

from hetero_harness.prompts import held_out_questions

TARGET, DRAFTER = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
SAMPLE_POOL = 40  # held out past the first 40 Spec-Bench prompts (advise's default sample: the first 13)
K = 4
CONFIGS: dict[str, dict[str, Any] | None] = {
    "plain": None,
    "vLLM draft_model": {"method": "draft_model", "num_speculative_tokens": K},
    "ours, as shipped (auto)": {"method": "hetero", "num_speculative_tokens": K},
    "ours, auto, 65536-token output layer": {"method": "hetero", "num_speculative_tokens": K,
                                             "draft_head_tokens": 65536},
    "ours, tli, fixed k": {"method": "hetero", "num_speculative_tokens": K, "algorithm": "tli",
                           "draft_budget": "fixed"},
    "ours, tli, fixed k, re-tokenized": {"method": "hetero", "num_speculative_tokens": K, "algorithm": "tli",
                                         "draft_budget": "fixed", "id_map": "off"},
    "ours, tli, fixed k, float16 drafter": {"method": "hetero", "num_speculative_tokens": K, "algorithm": "tli",
                                            "draft_budget": "fixed", "draft_dtype": "float16"},
}


def jobs(args: argparse.Namespace) -> list[tuple[str, int, dict[str, Any]]]:
    """(configuration, round, session job) in the order they run."""
    from vllm_hetero_spec.advise.cli import engine_dtype, parser, resolve_model
    from vllm_hetero_spec.advise.prompts import as_chat
    from vllm_hetero_spec.advise.session import base_job

    advise = parser().parse_args(["--target", TARGET, "--drafters", DRAFTER])  # advise's engine settings
    drafter = str(resolve_model("--drafters", DRAFTER).folder)
    prompts = as_chat(held_out_questions(args.prompts, SAMPLE_POOL))
    base = base_job(str(resolve_model("--target", TARGET).folder), prompts,
                    dtype=engine_dtype(advise.dtype), max_model_len=advise.max_model_len, seed=advise.seed,
                    max_tokens=args.max_tokens, k=K, batch_sizes=[1], temperatures=[0.0])
    chosen = {label: CONFIGS[label] for label in CONFIGS if label in {"plain", "vLLM draft_model", *args.configs}}
    out = []
    for r in range(args.rounds):
        for label, config in chosen.items():
            pins = [{"T": 0.0, "b": 1, "round": r}]
            if config is None:
                job = {**base, "kind": "plain", "first_token": False, "pins": pins}
            else:
                job = {**base, "kind": "config", "config": {**config, "model": drafter}, "pins": pins}
            out.append((label, r, job))
    return out


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per configuration: its speedup over plain and its ratio to draft_model
    per round, and its draft lengths."""
    tps = {(r["config"], r["round"]): r["tokens"] / r["wall"] for r in runs}
    rounds = sorted({r["round"] for r in runs})
    rows = []
    for label in dict.fromkeys(r["config"] for r in runs):
        mine = [r for r in runs if r["config"] == label]
        over_plain = [tps[(label, n)] / tps[("plain", n)] for n in rounds]
        over_dm = [tps[(label, n)] / tps[("vLLM draft_model", n)] for n in rounds]
        counters = [r["counters"] for r in mine if r.get("counters")]
        drafts = sum(c["num_drafts"] for c in counters)
        draft_tokens = sum(c["num_draft_tokens"] for c in counters)
        accepted = [0.0] * K
        for c in counters:
            for j, n in enumerate(c["accepted_per_position"][:K]):
                accepted[j] += n
        rows.append({
            "config": label, "tok_s": [tps[(label, n)] for n in rounds], "over_plain": over_plain,
            "over_draft_model": over_dm, "drafts": drafts, "draft_tokens": draft_tokens,
            "mean_draft_length": draft_tokens / drafts if drafts else None,
            # Pooled over rounds (a round that never drafted adds nothing, and cannot divide by 0).
            "acceptance_per_position": [a / drafts for a in accepted] if drafts else None,
            "mean_acceptance_length": 1 + sum(c["num_accepted_tokens"] for c in counters) / drafts if drafts else None,
        })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS),
                    help="our configurations to run (plain and draft_model always run)")
    args = ap.parse_args()
    from tqdm import tqdm

    from vllm_hetero_spec.advise.cli import run_session

    planned = jobs(args)
    log = Path(tempfile.gettempdir()) / "same_vocab.log"  # the engines' own output
    log.write_text("")
    runs = []
    with tqdm(total=len(planned), unit="engine") as bar:
        for label, r, job in planned:
            got = run_session(f"{label} [{r}]", job, log, bar)["runs"][0]
            runs.append({"config": label, "round": r, "wall": got["wall"], "tokens": sum(got["lengths"]),
                         "counters": got.get("counters")})
    rows = summarize(runs)
    md = [f"{DRAFTER} drafting for {TARGET} (one vocabulary), {args.prompts} held-out Spec-Bench prompts, batch 1, "
          f"T = 0, {args.max_tokens} tokens each, {planned[0][2]['dtype']}; {args.rounds} rounds, each running every "
          "configuration once in turn (an engine per configuration and round). Speedup: tokens per second over the "
          "same round's plain decoding; vs draft_model: over the same round's vLLM draft_model; median "
          "[min-max] over rounds. Draft length: draft tokens per drafted step (vLLM's counters). "
          "`benchmarks/same_vocab.py`.", "",
          *table(["configuration", "speedup", "vs draft_model", "per round vs draft_model", "drafted steps",
                  "mean draft length", "acceptance per position"],
                 [[row["config"],
                   ratio_cell(statistics.median(row["over_plain"]), min(row["over_plain"]), max(row["over_plain"])),
                   ratio_cell(statistics.median(row["over_draft_model"]), min(row["over_draft_model"]),
                              max(row["over_draft_model"])),
                   " / ".join(f"{x:.3f}" for x in row["over_draft_model"]),
                   f"{row['drafts']:.0f}" if row["drafts"] else "-",
                   f"{row['mean_draft_length']:.2f}" if row["mean_draft_length"] else "-",
                   " ".join(f"{a:.2f}" for a in row["acceptance_per_position"] or []) or "-"]
                  for row in rows])]
    write_report("same_vocab", {"meta": meta(args), "rows": rows, "runs": runs}, md)


if __name__ == "__main__":
    main()
