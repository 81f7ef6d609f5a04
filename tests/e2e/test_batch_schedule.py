"""vLLM's batch-size schedule (``num_speculative_tokens_per_batch_size``) caps what the
plugin drafts per step: a batch size it schedules at k = 0 drafts nothing, not even
the budget's warm-up, while batch 1 under the same config drafts; and
``sampled_speculative_tokens`` caps sampled requests the same way, even at a batch size
the schedule lets draft. ``advise`` writes both where its measurements say drafting never
pays.

One engine, a fixed budget (it drafts k = 3 on every step it may): eight greedy and four
sampled (T = 1) requests of one length at once (batch 12, capped at 0), then the same
twelve one at a time in the same engine (batch 1: the schedule allows 3, and the sampled
cap 0 holds for the sampled ones).

The engine drafts with ``dtw`` under its paper-faithful transfer (``dtw_verify:
faithful``, TokenTiming's transferred probabilities: lossless at T = 0 only), a setting
of the engine that had an engine of its own in ``test_e2e_rules.py``: its greedy rows,
drafted alone at batch 1, must be token for token the batch's, which the schedule kept
undrafted (the target's own decoding in this engine). What that gives up: two of the ten
bridge-stress prompts, and a reference from another engine (the rules' target alone);
an undrafted row of this engine is the target's own output, so a transfer that changed
a greedy token still fails the test. The schedule's claims do not depend on the rule.

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

TOKENS = 24
#: Greedy rows: the first eight bridge-stress prompts (code, CJK, emoji, whitespace runs...).
GREEDY_ROWS = 8


@pytest.fixture(scope="module")
def run(hub_home: Path) -> dict[str, Any]:
    spec = {"method": "hetero", "model": UPSTREAM_IDS["smollm2-135m"], "num_speculative_tokens": 3, "algorithm": "dtw",
            "dtw_verify": "faithful", "draft_budget": "fixed",
            "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 1024, 0]], "sampled_speculative_tokens": 0}
    return unwrap(run_isolated({
        "target": UPSTREAM_IDS["gemma3-270m"], "prompts": BRIDGE_STRESS[:GREEDY_ROWS] + BRIDGE_STRESS[:4],
        "temperatures": [0.0] * GREEDY_ROWS + [1.0] * 4, "solo": list(range(GREEDY_ROWS + 4)), "max_tokens": TOKENS,
        "ignore_eos": True, "max_model_len": 512, "warmup": False,
        "enforce_eager": True,  # start sooner; flags are not the subject
        "speculative_config": spec}, env=offline_env(hub_home), lease_cores=1))


def test_a_batch_size_scheduled_at_zero_drafts_nothing(run: dict[str, Any]) -> None:
    """Batch 12 drafts on at most one step (the engine may run a step for the first
    request before the others reach it); the same greedy requests alone draft on every
    decode step, and at T = 0 both give the same tokens (dtw faithful is exact there)."""
    assert run["num_drafts"] <= 1 and run["fallbacks"] == 0, run
    greedy_solo = run["solo_num_drafts_each"][:GREEDY_ROWS]
    assert all(n >= TOKENS // 4 for n in greedy_solo), run  # at most 4 tokens a step
    assert sum(run["solo_num_accepted_each"][:GREEDY_ROWS]) > 0, run  # drafts were accepted: identity means something
    for prompt, batch, alone in zip(BRIDGE_STRESS, run["token_ids"], run["solo_token_ids"][:GREEDY_ROWS]):
        assert alone == batch, f"dtw faithful, batch 1: output differs for prompt {prompt!r}"


def test_sampled_requests_capped_at_zero_draft_nothing(run: dict[str, Any]) -> None:
    """At batch 1, where the schedule allows k = 3 and greedy requests draft on every
    step, sampled requests under ``sampled_speculative_tokens: 0`` draft nothing."""
    assert run["solo_num_drafts_each"][GREEDY_ROWS:] == [0] * 4 and run["fallbacks"] == 0, run
    assert all(len(ids) == TOKENS for ids in run["solo_token_ids"][GREEDY_ROWS:])
    assert all(n > 0 for n in run["solo_num_drafts_each"][:GREEDY_ROWS])
