"""The prompts ``advise`` measures on: the user's own (jsonl), or the Spec-Bench set the
package ships (``vllm_hetero_spec/data/spec_bench``).

Acceptance depends on the traffic more than on the models, so the user's own prompts are
the point; a built-in set lets a first run need nothing. Each jsonl row holds either
``prompt`` (text sent as it is) or chat ``messages`` (rendered with the target's chat
template); Spec-Bench rows (``turns``) are read as one user message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SPEC_BENCH = Path(__file__).resolve().parents[1] / "data" / "spec_bench" / "question.jsonl"
#: Names ``--prompts`` accepts besides a file.
BUILT_IN = {"spec-bench": SPEC_BENCH}


class PromptError(ValueError):
    """A prompt file ``advise`` cannot use, with what to fix."""


def spec_bench_questions(n: int, path: Path = SPEC_BENCH, first_round: int = 0) -> list[str]:
    """First turns of Spec-Bench, round-robin over categories so a small ``n`` still
    mixes translation, summarization, QA, math, RAG, coding and writing: round ``r`` takes
    each category's ``r``-th question, starting at ``first_round``. Acceptance differs
    several-fold between categories, so a sample of whole rounds (13 prompts each) and a
    held-out set drawn from later rounds hold the same mix, and what one measures
    carries over to the other."""
    by_cat: dict[str, list[str]] = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            by_cat.setdefault(row["category"], []).append(row["turns"][0])
    out: list[str] = []
    i = first_round
    while len(out) < n:
        added = False
        for qs in by_cat.values():
            if i < len(qs) and len(out) < n:
                out.append(qs[i])
                added = True
        if not added:
            break
        i += 1
    return out


def categories(path: Path = SPEC_BENCH) -> int:
    """How many categories a round of :func:`spec_bench_questions` spans."""
    with open(path) as f:
        return len({json.loads(line)["category"] for line in f})


def as_chat(questions: list[str]) -> list[list[dict[str, str]]]:
    """Each question as a one-turn chat (a user message)."""
    return [[{"role": "user", "content": q}] for q in questions]


def _row(line_no: int, row: Any) -> str | list[dict[str, str]]:
    """One row as a text prompt or a list of chat messages."""
    if isinstance(row, dict):
        if isinstance(row.get("prompt"), str) and row["prompt"].strip():
            return row["prompt"]
        messages = row.get("messages")
        if (isinstance(messages, list) and messages
                and all(isinstance(m, dict) and isinstance(m.get("content"), str) and "role" in m for m in messages)):
            return messages
        turns = row.get("turns")
        if isinstance(turns, list) and turns and isinstance(turns[0], str):
            return as_chat(turns[:1])[0]
    raise PromptError(f"line {line_no}: expected an object with a non-empty \"prompt\" string or a \"messages\" "
                      f"list of {{\"role\", \"content\"}} objects, got {json.dumps(row)[:80]}")


def load_prompts(source: str, n: int) -> list[str | list[dict[str, str]]]:
    """The first ``n`` prompts of ``source`` (a jsonl file, or a name in :data:`BUILT_IN`).
    A built-in set is sampled across its categories."""
    if source in BUILT_IN:
        return as_chat(spec_bench_questions(n, path=BUILT_IN[source]))
    path = Path(source).expanduser()
    if not path.is_file():
        raise PromptError(f"--prompts {source}: no such file; pass a jsonl file of {{\"prompt\": ...}} or "
                          f"{{\"messages\": [...]}} rows, or one of: {', '.join(BUILT_IN)}")
    rows: list[str | list[dict[str, str]]] = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise PromptError(f"--prompts {source}, line {line_no}: not JSON ({err.msg})") from None
            rows.append(_row(line_no, row))
            if len(rows) == n:
                break
    if not rows:
        raise PromptError(f"--prompts {source} holds no prompts; add jsonl rows such as "
                          "{\"prompt\": \"Write a haiku about the sea\"}")
    return rows


def render(prompts: list[str | list[dict[str, str]]], tokenizer: Any) -> list[str]:
    """Text prompts as they are; chat messages through the target's chat template (plain
    user turns joined by blank lines where the target has none)."""
    template = getattr(tokenizer, "chat_template", None)
    out = []
    for p in prompts:
        if isinstance(p, str):
            out.append(p)
        elif template:
            out.append(tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True))
        else:
            out.append("\n\n".join(m["content"] for m in p))
    return out
