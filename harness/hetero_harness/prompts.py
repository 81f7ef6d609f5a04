"""Prompt sets for the main job, benchmarks and tests."""

from __future__ import annotations

import json
import os
from pathlib import Path

# 240 Spec-Bench prompts (Apache-2.0), shipped in the repository: data/spec_bench/README.md.
SPEC_BENCH = Path(os.environ.get("SPEC_BENCH_PATH", Path(__file__).resolve().parents[2] / "data/spec_bench/question.jsonl"))


def spec_bench_questions(n: int, per_category: int = 1) -> list[str]:
    """First turns of Spec-Bench, round-robin over categories so a small ``n`` still
    mixes translation, summarization, QA, math, RAG, coding and writing."""
    by_cat: dict[str, list[str]] = {}
    with open(SPEC_BENCH) as f:
        for line in f:
            row = json.loads(line)
            by_cat.setdefault(row["category"], []).append(row["turns"][0])
    out: list[str] = []
    i = 0
    while len(out) < n:
        added = False
        for qs in by_cat.values():
            for q in qs[i * per_category : (i + 1) * per_category]:
                if len(out) < n:
                    out.append(q)
                    added = True
        if not added:
            break
        i += 1
    return out


# Benchmarks' held-out prompts: Spec-Bench questions the tests and tuning never used, no
# longer than this (longer ones make a batch-1 run prefill-bound).
MAX_CHARS = 1200


def held_out_questions(n: int, skip: int) -> list[str]:
    """``n`` Spec-Bench questions of at most :data:`MAX_CHARS` characters, past the first ``skip``."""
    pool = [q for q in spec_bench_questions(240)[skip:] if len(q) <= MAX_CHARS]
    if len(pool) < n:
        raise SystemExit(f"only {len(pool)} held-out questions of <= {MAX_CHARS} characters; lower --skip")
    return pool[:n]


def chat_prompts(tokenizer_path: str, questions: list[str]) -> list[str]:
    """Questions wrapped in the target's chat template when it has one."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    if not getattr(tok, "chat_template", None):
        return questions
    return [
        tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in questions
    ]


# Short texts that stress the vocabulary bridge: code, prose, CJK, emoji, accents and
# long whitespace runs, at different lengths.
BRIDGE_STRESS = [
    "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n",
    "The history of the printing press begins",
    "日本の首都は東京です。中国的首都是北京。",
    "Emoji test 😀🎉👍🏽: the party was",
    "Le café de la gare était fermé, alors nous sommes allés à la crêperie où",
    "a          b\n\n\n\t\t\tc        ",
    "Translate to German: The weather is nice today.\nGerman:",
    "1, 1, 2, 3, 5, 8, 13,",
    "<html>\n  <body>\n    <p>Hello</p>",
    "Q: What is the capital of France?\nA:",
]
