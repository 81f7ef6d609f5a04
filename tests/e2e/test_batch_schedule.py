"""vLLM's batch-size schedule (``num_speculative_tokens_per_batch_size``) caps what the
plugin drafts per step: a batch size it schedules at k = 0 drafts nothing, not even
the budget's warm-up, while batch 1 under the same config drafts; and
``sampled_speculative_tokens`` caps sampled requests the same way, even at a batch size
the schedule lets draft. ``advise`` writes both where its measurements say drafting never
pays.

One config, two engines side by side, a fixed budget (it drafts k = 3 on every step it
may): four greedy requests of one length at once (batch 4, capped at 0), then the same
four one at a time in the same engine (batch 1, capped at 3); and the four sampled at
T = 1, one at a time (batch 1: the schedule allows 3, the sampled cap 0)."""

from __future__ import annotations

from typing import Any

import pytest

from hetero_harness.evaluation import run_isolated_many, unwrap
from hetero_harness.prompts import BRIDGE_STRESS

TOKENS = 12


@pytest.fixture(scope="module")
def runs(gemma: str, smollm2: str) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = {"method": "hetero", "model": smollm2, "num_speculative_tokens": 3, "algorithm": "tli",
            "draft_budget": "fixed", "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 1024, 0]],
            "sampled_speculative_tokens": 0}
    job = {"target": gemma, "prompts": BRIDGE_STRESS[:4], "max_tokens": TOKENS, "ignore_eos": True,
           "max_model_len": 512, "warmup": False, "enforce_eager": True,  # start sooner; flags are not the subject
           "speculative_config": spec}
    greedy, sampled = map(unwrap, run_isolated_many([
        {**job, "temperature": 0.0, "solo": list(range(4))},
        {**job, "temperature": 1.0, "batch_size": 1},
    ]))
    return greedy, sampled


def test_a_batch_size_scheduled_at_zero_drafts_nothing(runs: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """Batch 4 drafts on at most one step (the engine may run a step for the first
    request before the others reach it); the same requests alone draft on every decode
    step, and at T = 0 both give the same tokens."""
    greedy, _ = runs
    assert greedy["num_drafts"] <= 1 and greedy["fallbacks"] == 0, greedy
    assert greedy["solo_num_drafts"] >= 4 * (TOKENS // 4), greedy  # at most 4 tokens a step
    assert greedy["solo_token_ids"] == greedy["token_ids"]


def test_sampled_requests_capped_at_zero_draft_nothing(runs: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """At batch 1, where the schedule allows k = 3 and greedy requests draft on every
    step, sampled requests under ``sampled_speculative_tokens: 0`` draft nothing."""
    greedy, sampled = runs
    assert sampled["num_drafts"] == 0 and sampled["fallbacks"] == 0, sampled
    assert all(len(ids) == TOKENS for ids in sampled["token_ids"])
    assert greedy["solo_num_drafts"] > 0
