"""Which tokens a drafter's output layer keeps under ``draft_head_tokens``
(``vocab/frequent_tokens.py``, resolved in ``drafter/runtime/config.py``), on the shipped
tokenizers: byte-level BPE ids follow their merges (Qwen2.5, SmolLM2), Gemma-3's do not."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vllm_hetero_spec.config import HeteroConfigError, HeteroSettings
from vllm_hetero_spec.drafter.runtime.config import resolve_head_tokens
from vllm_hetero_spec.vocab.frequent_tokens import head_ids, merge_ordered, read_tokenizer


def _settings(model: str, head: int) -> HeteroSettings:
    return HeteroSettings(draft_model=model, num_speculative_tokens=4, draft_head_tokens=head)


def test_merge_order_is_read_from_the_tokenizer(qwen05: str, smollm2: str, gemma: str) -> None:
    assert merge_ordered(read_tokenizer(qwen05)) and merge_ordered(read_tokenizer(smollm2))
    assert not merge_ordered(read_tokenizer(gemma))
    # The same merges with two ids swapped are no longer in order.
    shuffled = json.loads(json.dumps(read_tokenizer(smollm2)))
    vocab, (first, second) = shuffled["model"]["vocab"], shuffled["model"]["merges"][:2]
    a, b = ("".join(m.split(" ")) if isinstance(m, str) else "".join(m) for m in (first, second))
    vocab[a], vocab[b] = vocab[b], vocab[a]
    assert not merge_ordered(shuffled)


def test_the_head_keeps_the_lowest_ids_and_every_added_token(qwen05: str) -> None:
    tokenizer = read_tokenizer(qwen05)
    ids = head_ids(tokenizer, 1000, 151936)
    added = sorted(t["id"] for t in tokenizer["added_tokens"])
    assert 151645 in added  # <|im_end|>, the end of every chat turn
    assert np.array_equal(ids, np.concatenate([np.arange(1000), added]))
    assert np.array_equal(head_ids(tokenizer, 10**6, 151936), np.arange(151936))


def test_a_head_is_kept_whole_unless_asked_and_covers_at_most_the_vocabulary(qwen05: str, smollm2: str,
                                                                            gemma: str) -> None:
    assert HeteroSettings.__dataclass_fields__["draft_head_tokens"].default == 0
    assert resolve_head_tokens(_settings(gemma, 0)) == (0, "the whole vocabulary")
    assert resolve_head_tokens(_settings(qwen05, 65536))[0] == 65536
    assert resolve_head_tokens(_settings(smollm2, 4096))[0] == 4096
    assert resolve_head_tokens(_settings(smollm2, 10**6))[0] == 0  # covers the vocabulary


def test_a_head_the_tokenizer_cannot_rank_is_refused_naming_the_key(gemma: str) -> None:
    with pytest.raises(HeteroConfigError, match="draft_head_tokens: 4096 .* set it to 0"):
        resolve_head_tokens(_settings(gemma, 4096))
