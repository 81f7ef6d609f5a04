"""vLLM's batch-size schedule (``num_speculative_tokens_per_batch_size``) caps what the
plugin drafts per step: a batch size it schedules at k = 0 drafts nothing, not even
the budget's warm-up, while batch 1 under the same config drafts; and
``sampled_speculative_tokens`` caps sampled requests the same way. ``advise`` writes
both where its measurements say drafting never pays."""

from __future__ import annotations

from hetero_harness.evaluation import run_isolated_many, unwrap
from hetero_harness.prompts import BRIDGE_STRESS


def test_a_batch_size_scheduled_at_zero_drafts_nothing(gemma: str, smollm2: str) -> None:
    """A fixed budget (it drafts k = 3 on every step it may), four requests of one length
    at once (batch 4, capped at 0, once all four have arrived: the engine may run a
    step for the first before the others reach it), then the same four one at a time
    (batch 1, capped at 3): the first drafts on at most that one step, the second on
    every decode step, and at T = 0 both give the same tokens."""
    spec = {"method": "hetero", "model": smollm2, "num_speculative_tokens": 3, "algorithm": "tli",
            "draft_budget": "fixed", "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 1024, 0]]}
    job = {"target": gemma, "prompts": BRIDGE_STRESS[:4], "max_tokens": 12, "temperature": 0.0, "ignore_eos": True,
           "max_model_len": 512, "warmup": False, "enforce_eager": True,  # start sooner; flags are not the subject
           "speculative_config": spec}
    together, alone = map(unwrap, run_isolated_many([job, {**job, "batch_size": 1}]))
    assert together["num_drafts"] <= 1 and together["fallbacks"] == 0, together
    assert alone["num_drafts"] >= 4 * 3, alone  # 12 tokens a request, at most 4 a step
    assert together["token_ids"] == alone["token_ids"]


def test_sampled_requests_capped_at_zero_draft_nothing(gemma: str, smollm2: str) -> None:
    """A fixed budget with ``sampled_speculative_tokens: 0``: four requests at T = 1 draft
    nothing at all, the same four at T = 0 draft on every step."""
    spec = {"method": "hetero", "model": smollm2, "num_speculative_tokens": 3, "algorithm": "tli",
            "draft_budget": "fixed", "sampled_speculative_tokens": 0}
    job = {"target": gemma, "prompts": BRIDGE_STRESS[:4], "max_tokens": 12, "ignore_eos": True, "max_model_len": 512,
           "warmup": False, "enforce_eager": True, "speculative_config": spec}
    sampled, greedy = map(unwrap, run_isolated_many([{**job, "temperature": 1.0}, {**job, "temperature": 0.0}]))
    assert sampled["num_drafts"] == 0 and sampled["fallbacks"] == 0, sampled
    assert greedy["num_drafts"] >= 4 * 3, greedy
