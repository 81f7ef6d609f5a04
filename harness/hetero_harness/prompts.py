"""Prompt sets for the main job, benchmarks and tests."""

from __future__ import annotations

from vllm_hetero_spec.advise.prompts import as_chat, render, spec_bench_questions

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

    return render(as_chat(questions), AutoTokenizer.from_pretrained(tokenizer_path))


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
