"""A tensor-parallel target (TP = 2, two CPU worker processes): rank 0 drafts, in process
with a whole drafter or through a Ray actor (one for the whole engine), and broadcasts
its drafts and q rows. Every rank must verify the same proposals, so T = 0 output stays
the target's own.

The Gemma pair (Gemma-3-270M's one KV head is replicated on both ranks; SmolLM2 drafts
whole on rank 0). The reference is the session's target alone (``conftest.gemma_alone``,
TP = 1): the TP engines are held to the output of the unsharded target, which a user
expects. What this gives up: a TP = 2 engine without speculation of its own (one start
fewer). A TP = 2 target sums its row-parallel layers in another order than TP = 1, so a
near-tie of the argmax could break apart without any fault of ours; on these prompts at
float32 it does not, and a difference would fail the test, not pass it.
"""

from __future__ import annotations

import pytest

from _gemma_pair import GREEDY, Rows, job, prompts
from hetero_harness.evaluation import run_isolated, unwrap

# The CPU build binds each worker's threads to its own cores; this machine has one NUMA node.
ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
#: Unseeded rows at T = 1 beside the greedy ones, as long, so that every step samples.
T1 = Rows("t1", 4, tokens=GREEDY.max_tokens)


def _job(target: str, executor: str, smollm2: str, groups: list[Rows]) -> dict:
    spec = {"method": "hetero", "model": smollm2, "num_speculative_tokens": 3, "algorithm": "tli",
            "executor": executor, "draft_budget": "fixed"}
    return {**job(target, prompts(target), [("tp", None, g) for g in groups], spec), "tensor_parallel_size": 2}


@pytest.fixture(scope="module")
def plain(gemma_alone) -> dict:
    return unwrap(gemma_alone.results()["greedy"])


@pytest.fixture(scope="module")
def inprocess(gemma: str, smollm2: str) -> dict:
    """The in-process drafter, with unseeded T = 1 rows in the same batch: with
    VLLM_HETERO_SPEC_CHECK_RANKS=1 every step's sampled tokens and proposals are compared
    across the ranks (an all-gather of a digest)."""
    return run_isolated(_job(gemma, "inprocess", smollm2, [GREEDY, T1]),
                        env={**ENV, "VLLM_HETERO_SPEC_CHECK_RANKS": "1"}, lease_cores=None)


def test_tp2_inprocess_identical_to_target_alone(plain: dict, inprocess: dict) -> None:
    n = len(plain["token_ids"])
    assert inprocess["token_ids"][:n] == plain["token_ids"]
    assert inprocess["num_accepted_tokens"] > 0


def test_tp2_ray_identical_to_target_alone(gemma: str, smollm2: str, plain: dict) -> None:
    result = run_isolated(_job(gemma, "ray", smollm2, [GREEDY]), env=ENV, lease_cores=None)
    assert result["token_ids"] == plain["token_ids"]
    assert result["num_accepted_tokens"] > 0


def test_tp2_ranks_agree_at_t1_without_seeds(inprocess: dict) -> None:
    """Sampling without seeds draws from each rank's global RNG (the verifier's unseeded
    uniforms and noise, vLLM's bonus tokens): the drafter must neither draw from it nor
    shift it on one rank only."""
    ranks = inprocess["worker_metrics"]
    assert len(ranks) == 2 and inprocess["num_accepted_tokens"] > 0, (ranks, inprocess["num_accepted_tokens"])
    assert all(r["rank_checks"] > 10 for r in ranks), ranks
    assert all(r["rank_mismatches"] == 0 for r in ranks), ranks
