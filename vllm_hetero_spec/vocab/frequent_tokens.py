"""A drafter's most frequent tokens, read from its tokenizer: the rows its output layer keeps
under ``draft_head_tokens``.

Computing a drafter's logits over its ``n`` most frequent tokens only (why:
``drafter/runtime/draft_head.py``) is FR-Spec's idea (Zhao et al., 2025). Which
tokens are frequent needs no corpus in a byte-level BPE tokenizer whose ids follow its
merge order: a BPE merge is learned in order of pair frequency, so lower ids are the more
frequent tokens. :func:`merge_ordered` checks that a tokenizer is such; one whose ids do
not follow its merges (Gemma-3's) gives no such ranking, and the setting is refused for it
at start-up.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np

# The merges checked: enough to tell an ordered vocabulary from a shuffled one.
_CHECKED_MERGES = 1000


def merge_ordered(tokenizer: dict) -> bool:
    """Whether ``tokenizer`` (a ``tokenizer.json``) is BPE with ids in merge order:
    the tokens its first merges make have increasing ids."""
    model = tokenizer.get("model") or {}
    vocab, merges = model.get("vocab"), model.get("merges")
    if model.get("type") != "BPE" or not isinstance(vocab, dict) or not merges:
        return False
    ids = []
    for merge in merges[:_CHECKED_MERGES]:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        ids.append(vocab.get(left + right, -1))
    return min(ids) >= 0 and all(b > a for a, b in zip(ids, ids[1:]))


def head_ids(tokenizer: dict, n: int, vocab_size: int) -> np.ndarray:
    """The ids an output layer of ``n`` tokens keeps, sorted: the ``n`` lowest, and every
    added token (end-of-turn and other specials sit at the end of the vocabulary, and a
    drafter that cannot propose its end-of-turn token loses the last step of every
    turn). All of ``vocab_size`` when ``n`` covers it."""
    added = [t["id"] for t in tokenizer.get("added_tokens", []) if 0 <= t.get("id", -1) < vocab_size]
    return np.union1d(np.arange(min(n, vocab_size)), np.asarray(added, dtype=np.int64)).astype(np.int64)


@lru_cache(maxsize=4)
def read_tokenizer(folder: str) -> dict | None:
    """``folder``'s ``tokenizer.json``, parsed once per process (``None``: it has none)."""
    path = Path(folder).expanduser() / "tokenizer.json"
    if not path.is_file():
        return None
    with open(path) as f:
        return json.load(f)
