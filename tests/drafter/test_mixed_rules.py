"""``algorithm: auto`` in the drafting engine: a batch whose rows name different rules
(real SmolLM2 drafter, Qwen tokenizer). Each row must get exactly what its rule gives it
alone -- the same proposals and the same q rows -- which is what keeps every row as
lossless in a mixed batch as under its rule alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from vllm_hetero_spec.config import HeteroConfigError, HeteroSettings, parse_settings
from vllm_hetero_spec.drafter.batch_drafter import BatchDrafter
from vllm_hetero_spec.drafter.messages import RequestParams, StepBatch, StepDrafts
from vllm_hetero_spec.vocab.bridge import load_tokenizer
from hetero_harness.prompts import BRIDGE_STRESS

TARGET_VOCAB = 151936

ROWS = [  # (request id, rule, sampling): the tli rows apart, so rule order is not batch order
    ("g-tli", "tli", RequestParams()),
    ("g-slem", "slem", RequestParams()),
    ("s-tli", "tli", RequestParams(temperature=1.0, seed=3)),
    ("s-slrs", "slrs", RequestParams(temperature=0.8, top_p=0.95, seed=5)),
]


@pytest.fixture(scope="module")
def engine(smollm2: str, qwen05: str) -> BatchDrafter:
    # float32: a differently packed batch rounds the same then (bf16 may flip a near-tie).
    settings = HeteroSettings(algorithm="auto", draft_model=smollm2, draft_tokenizer=smollm2, num_speculative_tokens=4,
                              max_draft_tokens=4, draft_kv_pool_mb=64, draft_dtype="float32")
    return BatchDrafter(settings, qwen05, TARGET_VOCAB)


@pytest.fixture(scope="module")
def prompts(qwen05: str) -> list[np.ndarray]:
    tok = load_tokenizer(qwen05)
    return [np.array(tok.encode(p), dtype=np.int32) for p in BRIDGE_STRESS[: len(ROWS)]]


def _q_rows(drafts: StepDrafts, row: int) -> torch.Tensor | None:
    index = [j for j in drafts.q_rows_of(row) if j >= 0]
    if not index:
        return None
    return drafts.q.dense(torch.tensor(index), TARGET_VOCAB)


def test_each_row_drafts_what_its_rule_alone_drafts(engine: BatchDrafter, prompts: list[np.ndarray]) -> None:
    params = [dataclasses.replace(p, rule=rule) for _, rule, p in ROWS]
    req_ids = [r for r, _, _ in ROWS]
    engine.reset()
    mixed = engine.step(StepBatch(req_ids, prompts, params, 4))
    assert all(mixed.ready) and all(mixed.ids)
    for i, req_id in enumerate(req_ids):
        engine.reset()
        alone = engine.step(StepBatch([req_id], [prompts[i]], [params[i]], 4))
        assert mixed.ids[i] == alone.ids[0], req_id
        got, want = _q_rows(mixed, i), _q_rows(alone, 0)
        assert (got is None) == (want is None), req_id
        if want is not None:
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    # Sampled rows carry q (tli: every position; slrs: its first token), greedy rows none.
    assert _q_rows(mixed, 2).shape[0] == len(mixed.ids[2])
    assert _q_rows(mixed, 3).shape[0] == 1
    assert _q_rows(mixed, 0) is None and _q_rows(mixed, 1) is None


def test_a_row_without_a_rule_takes_its_kinds_first_candidate(engine: BatchDrafter) -> None:
    assert engine.rule_of(RequestParams()) == "slem"
    assert engine.rule_of(RequestParams(temperature=0.7)) == "tli"
    with pytest.raises(ValueError, match="fsd"):
        engine.rule_of(RequestParams(rule="fsd"))


def test_auto_takes_lossless_candidates_only(smollm2: str) -> None:
    base = {"method": "hetero", "model": smollm2, "num_speculative_tokens": 4}
    settings, _ = parse_settings(base)
    assert settings.algorithm == "auto"
    assert settings.auto_greedy == ("slem", "tli") and settings.auto_sampled == ("tli", "slrs")
    with pytest.raises(HeteroConfigError, match="'auto_sampled'.*rules from"):
        parse_settings({**base, "auto_sampled": ["tli", "fsd"]})
    with pytest.raises(HeteroConfigError, match="'auto_greedy'"):
        parse_settings({**base, "auto_greedy": []})
    with pytest.raises(HeteroConfigError, match="'dtw_verify'.*lossless"):
        parse_settings({**base, "auto_greedy": ["dtw"], "dtw_verify": "faithful"})
