"""Pipelined drafting (drafter/placement/pipeline.py) on the real SmolLM2 drafter and Qwen
tokenizer, in process (the Ray actor runs the same object).

A branch whose assumption came true must hand out what drafting at that moment would
have produced -- the same proposals, the same q rows (up to float rounding from a
differently packed batch), also when sampling with a seed, and the request's state
after it must draft on identically -- so pipelining changes when drafts are made, not
what they are. That is what keeps every verification rule as lossless with it as without.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from vllm_hetero_spec.config import HeteroSettings
from vllm_hetero_spec.drafter.batch_drafter import BatchDrafter
from vllm_hetero_spec.drafter.messages import RequestParams, StepBatch
from vllm_hetero_spec.drafter.placement.pipeline import PipelinedDrafter, branch_count
from vllm_hetero_spec.vocab.bridge import load_tokenizer
from hetero_harness.prompts import BRIDGE_STRESS

TARGET_VOCAB = 151936


def test_branch_count_follows_duodecoding() -> None:
    # theta = 0.5 * 0.9 = 0.45: nothing else is as likely as the top two-token path.
    assert branch_count(torch.tensor([0.5, 0.3, 0.1, 0.05]), 0.9, 4) == 1
    # theta = 0.5 * 0.4 = 0.2: the 0.3 candidate gets its own sequence.
    assert branch_count(torch.tensor([0.5, 0.3, 0.1, 0.05]), 0.4, 4) == 2
    # theta = 0.3 * 0.2 = 0.06: three more candidates beat it, capped at max_branches.
    assert branch_count(torch.tensor([0.3, 0.25, 0.2, 0.1]), 0.2, 4) == 4
    assert branch_count(torch.tensor([0.3, 0.25, 0.2, 0.1]), 0.2, 2) == 2


@pytest.fixture(scope="module")
def engines():
    """Drafting engines by (algorithm, role), loaded once for the module (loading
    dominates these tests) and freed with it."""
    cache: dict[tuple[str, str], BatchDrafter] = {}
    yield cache
    cache.clear()
    gc.collect()


def _engine(engines: dict, smollm2: str, qwen05: str, algorithm: str, role: str) -> BatchDrafter:
    """A drafting engine with no request state and zeroed counters."""
    key = (algorithm, role)
    if key not in engines:
        # float32 whatever ``draft_dtype: auto`` picks on this CPU: in bfloat16 a
        # differently packed batch rounds differently, and a near-tie's argmax can flip.
        settings = HeteroSettings(algorithm=algorithm, draft_model=smollm2, draft_tokenizer=smollm2, num_speculative_tokens=4,
                                  max_draft_tokens=4, draft_kv_pool_mb=64, draft_dtype="float32")
        engines[key] = BatchDrafter(settings, qwen05, TARGET_VOCAB)
    engine = engines[key]
    engine.reset()
    engine.stats.__init__()  # zeroed in place: the engine's draft rules hold this object
    return engine


PARAMS = {"greedy": RequestParams(), "seeded": RequestParams(temperature=1.0, seed=7)}


@pytest.fixture(scope="module")
def prompts(qwen05: str) -> list[np.ndarray]:
    tok = load_tokenizer(qwen05)
    return [np.array(tok.encode(p), dtype=np.int32) for p in BRIDGE_STRESS[:4]]


@pytest.mark.parametrize("algorithm", ["tli", "slem"])
@pytest.mark.parametrize("mode", ["greedy", "seeded"])
def test_a_hit_is_what_drafting_now_would_give(engines, smollm2, qwen05, prompts, algorithm, mode) -> None:
    pipelined = PipelinedDrafter(_engine(engines, smollm2, qwen05, algorithm, "pipelined"), max_branches=3)
    plain = _engine(engines, smollm2, qwen05, algorithm, "plain")
    req_ids = [f"r{i}" for i in range(len(prompts))]
    params = [PARAMS[mode]] * len(prompts)
    tokens = prompts
    hits = 0
    for _ in range(3):
        got = pipelined.step(StepBatch(req_ids, tokens, params, 4))
        want = plain.step(StepBatch(req_ids, tokens, params, 4))
        assert got.ids == want.ids
        assert (got.q is None) == (want.q is None)
        if want.q is not None:
            # The same proposals carry q rows, the same rows (their order in the compact
            # tensor may differ), equal up to float rounding: the branch ran in a
            # differently packed batch.
            assert [[j >= 0 for j in r] for r in got.q_index] == [[j >= 0 for j in r] for r in want.q_index]
            got_q, want_q = (d.q.take([j for r in d.q_index for j in r if j >= 0]) for d in (got, want))
            assert torch.equal(got_q.support, want_q.support)
            torch.testing.assert_close(got_q.probs, want_q.probs, rtol=1e-4, atol=1e-7)
        assert pipelined.drafter.stats.pipeline_hits == hits
        pipelined.speculate()
        # The target accepts everything and its bonus token is the first branch's (a
        # request without branches -- its likely next draft tokens are partial UTF-8,
        # no target token yet -- gets a newline).
        tokens = [
            pipelined.branches[r][0].assumed if r in pipelined.branches
            else np.concatenate([t, ids, [198]]).astype(np.int32)
            for r, t, ids in zip(req_ids, tokens, got.ids)
        ]
        hits += len(pipelined.branches)
    assert hits >= len(req_ids)


def test_a_miss_drafts_on_demand(engines, smollm2, qwen05, prompts) -> None:
    pipelined = PipelinedDrafter(_engine(engines, smollm2, qwen05, "tli", "pipelined"), max_branches=2)
    plain = _engine(engines, smollm2, qwen05, "tli", "plain")
    batch = StepBatch(["r"], prompts[:1], [RequestParams()], 4)
    first = pipelined.step(batch)
    plain.step(batch)
    pipelined.speculate()
    # The target rejected the second draft and corrected it to a token no branch assumed.
    corrected = np.concatenate([prompts[0], first.ids[0][:1], [11]]).astype(np.int32)
    assert all(len(b.assumed) != len(corrected) or not np.array_equal(b.assumed, corrected)
               for b in pipelined.branches["r"])
    nxt = StepBatch(["r"], [corrected], [RequestParams()], 4)
    assert pipelined.step(nxt).ids == plain.step(nxt).ids
    stats = pipelined.drafter.stats
    assert (stats.pipeline_hits, stats.pipeline_misses) == (0, 1)
    assert set(pipelined.drafter.states) == {"r"}  # the branches' states are gone


def test_finished_requests_take_their_branches_along(engines, smollm2, qwen05, prompts) -> None:
    pipelined = PipelinedDrafter(_engine(engines, smollm2, qwen05, "slem", "pipelined"), max_branches=3)
    pipelined.step(StepBatch(["a", "b"], prompts[:2], [RequestParams()] * 2, 4))
    pipelined.speculate()
    assert len(pipelined.drafter.states) > 2
    pipelined.keep_only({"b"})
    assert set(pipelined.branches) == {"b"}
    assert {k.split("\x00")[0] for k in pipelined.drafter.states} == {"b"}
