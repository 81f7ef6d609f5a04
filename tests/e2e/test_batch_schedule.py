"""vLLM's batch-size schedule (``num_speculative_tokens_per_batch_size``) caps what the
plugin drafts per step: a batch size it schedules at k = 0 drafts nothing, not even
the budget's warm-up, while batch 1 under the same config drafts; and
``sampled_speculative_tokens`` caps sampled requests the same way, even at a batch size
the schedule lets draft. ``advise`` writes both where its measurements say drafting never
pays.

One engine, a fixed budget (it drafts k = 3 on every step it may): four greedy and four
sampled (T = 1) requests of one length at once (batch 8, capped at 0), then the same
eight one at a time in the same engine (batch 1: the schedule allows 3, and the sampled
cap 0 holds for the sampled ones).

The engine also runs the path of a vLLM user who names models by their Hugging Face ids:
target and drafter are named ``google/gemma-3-270m`` and
``HuggingFaceTB/SmolLM2-135M-Instruct``, resolved offline from a Hub cache holding
set-up's models under those ids (``hub_home``), as ``HF_HUB_OFFLINE=1`` users run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hetero_harness.evaluation import run_isolated, unwrap
from hetero_harness.hf_cache import UPSTREAM_IDS, offline_env
from hetero_harness.prompts import BRIDGE_STRESS

TOKENS = 12


@pytest.fixture(scope="module")
def run(hub_home: Path) -> dict[str, Any]:
    spec = {"method": "hetero", "model": UPSTREAM_IDS["smollm2-135m"], "num_speculative_tokens": 3, "algorithm": "tli",
            "draft_budget": "fixed", "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 1024, 0]],
            "sampled_speculative_tokens": 0}
    return unwrap(run_isolated({
        "target": UPSTREAM_IDS["gemma3-270m"], "prompts": BRIDGE_STRESS[:4] * 2, "temperatures": [0.0] * 4 + [1.0] * 4,
        "solo": list(range(8)), "max_tokens": TOKENS, "ignore_eos": True, "max_model_len": 512, "warmup": False,
        "enforce_eager": True,  # start sooner; flags are not the subject
        "speculative_config": spec}, env=offline_env(hub_home), lease_cores=1))


def test_a_batch_size_scheduled_at_zero_drafts_nothing(run: dict[str, Any]) -> None:
    """Batch 8 drafts on at most one step (the engine may run a step for the first
    request before the others reach it); the same greedy requests alone draft on every
    decode step, and at T = 0 both give the same tokens."""
    assert run["num_drafts"] <= 1 and run["fallbacks"] == 0, run
    greedy_solo = run["solo_num_drafts_each"][:4]
    assert all(n >= TOKENS // 4 for n in greedy_solo), run  # at most 4 tokens a step
    assert run["solo_token_ids"][:4] == run["token_ids"][:4]


def test_sampled_requests_capped_at_zero_draft_nothing(run: dict[str, Any]) -> None:
    """At batch 1, where the schedule allows k = 3 and greedy requests draft on every
    step, sampled requests under ``sampled_speculative_tokens: 0`` draft nothing."""
    assert run["solo_num_drafts_each"][4:] == [0] * 4 and run["fallbacks"] == 0, run
    assert all(len(ids) == TOKENS for ids in run["solo_token_ids"][4:])
    assert all(n > 0 for n in run["solo_num_drafts_each"][:4])
