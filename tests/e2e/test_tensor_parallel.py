"""A tensor-parallel target (TP = 2, two CPU worker processes): rank 0 drafts, in process
with a whole drafter (SmolLM2's 9 heads do not divide by 2, so a sharded drafter could
not even be built) or through a Ray actor (one for the whole engine), and broadcasts its
drafts and q rows. Every rank must verify the same proposals, so T = 0 output stays
identical to the same TP = 2 engine without speculation."""

from __future__ import annotations

import pytest

from hetero_harness.evaluation import run_isolated
from hetero_harness.prompts import BRIDGE_STRESS


# The CPU build binds each worker's threads to its own cores; this machine has one NUMA node.
ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}


def _job(target: str, spec: dict | None, temperatures: list[float]) -> dict:
    return {
        "target": target, "prompts": BRIDGE_STRESS[: len(temperatures)], "max_tokens": 24,
        "temperatures": temperatures, "max_model_len": 512, "speculative_config": spec, "warmup": False,
        "tensor_parallel_size": 2,
        "enforce_eager": True,  # start sooner; default flags: test_e2e_greedy, test_serving
    }


GREEDY = [0.0] * 4
# The in-process engine also samples, unseeded, at T = 1 (four more requests in the same
# batch; an engine of its own would cost a minute of start-up): with
# VLLM_HETERO_SPEC_CHECK_RANKS=1 every step's sampled tokens and proposals are compared
# across the ranks (an all-gather of a digest).
MIXED = GREEDY + [1.0] * 4


def _spec(smollm2: str, executor: str) -> dict:
    return {"method": "hetero", "model": smollm2, "num_speculative_tokens": 3, "algorithm": "tli",
            "executor": executor}


@pytest.fixture(scope="module")
def plain(qwen05: str) -> dict:
    return run_isolated(_job(qwen05, None, GREEDY), env=ENV)


@pytest.fixture(scope="module")
def inprocess(qwen05: str, smollm2: str) -> dict:
    return run_isolated(_job(qwen05, _spec(smollm2, "inprocess"), MIXED),
                        env={**ENV, "VLLM_HETERO_SPEC_CHECK_RANKS": "1"})


def test_tp2_inprocess_identical_to_target_alone(plain: dict, inprocess: dict) -> None:
    assert inprocess["token_ids"][:4] == plain["token_ids"]
    assert inprocess["num_accepted_tokens"] > 0


def test_tp2_ray_identical_to_target_alone(qwen05: str, smollm2: str, plain: dict) -> None:
    result = run_isolated(_job(qwen05, _spec(smollm2, "ray"), GREEDY), env=ENV)
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
