"""A tensor-parallel target (TP = 2, two CPU worker processes): rank 0 drafts with a
whole drafter in its process and broadcasts its drafts and q rows. Every rank must
verify the same proposals, so T = 0 output stays the target's own.

The Gemma pair (Gemma-3-270M's one KV head is replicated on both ranks; SmolLM2 drafts
whole on rank 0, in one-rank process groups the other rank joins the creation of). The
reference is the session's target alone (``conftest.gemma_alone``, TP = 1): the TP
engine is held to the output of the unsharded target, which a user expects.

What this gives up, and why the claims stand:
- a core per rank: both ranks' workers run on one core the module leases
  (``VLLM_CPU_OMP_THREADS_BIND`` names it for both, and the process's affinity holds
  every thread there), so another module's engine runs on the other core. They are still
  two processes, sharded and exchanging their collectives, which is what is claimed here;
  only the pace changes.
- a TP = 2 engine without speculation of its own (one start fewer). A TP = 2 target sums
  its row-parallel layers in another order than TP = 1, so a near-tie of the argmax could
  break apart without any fault of ours; on these prompts at float32 it does not, and a
  difference would fail the test, not pass it.
- a second TP = 2 engine with the drafter in a Ray actor (one start of two worker
  processes fewer). Under TP the Ray path differs from this one only on rank 0, where
  the drafts come from: the actor's drafting, faults and sampled rows are the Ray
  module's (``test_ray_executor.py``, at TP = 1), and every rank verifying rank 0's
  drafts is this module's and ``tests/drafter/test_tensor_parallel_drafts.py``'s
  (a real two-rank group), whatever rank 0's host. What is no longer run is a Ray actor
  started from a worker of a TP = 2 engine.
"""

from __future__ import annotations

import pytest

from _gemma_pair import GREEDY, Rows, job, prompts
from hetero_harness.cores import lease
from hetero_harness.evaluation import run_isolated, unwrap

#: Unseeded rows at T = 1 beside the greedy ones, as long, so that every step samples.
T1 = Rows("t1", 4, tokens=GREEDY.max_tokens)


def _job(target: str, smollm2: str, groups: list[Rows]) -> dict:
    spec = {"method": "hetero", "model": smollm2, "num_speculative_tokens": 3, "algorithm": "tli",
            "draft_budget": "fixed"}
    return {**job(target, prompts(target), [("tp", None, g) for g in groups], spec), "tensor_parallel_size": 2}


@pytest.fixture(scope="module")
def plain(gemma_alone) -> dict:
    return unwrap(gemma_alone.results()["greedy"])


@pytest.fixture(scope="module")
def inprocess(gemma: str, smollm2: str) -> dict:
    """The in-process drafter, with unseeded T = 1 rows in the same batch: with
    VLLM_HETERO_SPEC_CHECK_RANKS=1 every step's sampled tokens and proposals are compared
    across the ranks (an all-gather of a digest)."""
    with lease(1) as held:
        core = held.cores[0]
        return run_isolated(_job(gemma, smollm2, [GREEDY, T1]), core=core,
                            env={"VLLM_CPU_OMP_THREADS_BIND": f"{core}|{core}", "VLLM_HETERO_SPEC_CHECK_RANKS": "1"})


def test_tp2_inprocess_identical_to_target_alone(plain: dict, inprocess: dict) -> None:
    n = len(plain["token_ids"])
    assert inprocess["token_ids"][:n] == plain["token_ids"]
    assert inprocess["num_accepted_tokens"] > 0


def test_tp2_ranks_agree_at_t1_without_seeds(inprocess: dict) -> None:
    """Sampling without seeds draws from each rank's global RNG (the verifier's unseeded
    uniforms and noise, vLLM's bonus tokens): the drafter must neither draw from it nor
    shift it on one rank only."""
    ranks = inprocess["worker_metrics"]
    assert len(ranks) == 2 and inprocess["num_accepted_tokens"] > 0, (ranks, inprocess["num_accepted_tokens"])
    assert all(r["rank_checks"] > 10 for r in ranks), ranks
    assert all(r["rank_mismatches"] == 0 for r in ranks), ranks
