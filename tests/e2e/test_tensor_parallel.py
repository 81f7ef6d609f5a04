"""A tensor-parallel target (TP = 2, two CPU worker processes): in process every rank
runs a whole drafter of its own (SmolLM2's 9 heads do not divide by 2, so a sharded
drafter could not even be built) and must draft exactly what the others draft; with a
Ray actor (one for the whole engine) rank 0 broadcasts its drafts and q rows. Every
rank must verify the same proposals, so T = 0 output stays identical to the same
TP = 2 engine without speculation."""

from __future__ import annotations

import pytest

from vllm_hetero_spec.harness.evaluation import run_isolated
from vllm_hetero_spec.harness.prompts import BRIDGE_STRESS


# The CPU build binds each worker's threads to its own cores; this machine has one NUMA node.
ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}


def _job(target: str, spec: dict | None) -> dict:
    return {
        "target": target, "prompts": BRIDGE_STRESS[:4], "max_tokens": 16, "temperature": 0.0,
        "max_model_len": 512, "speculative_config": spec, "warmup": False, "tensor_parallel_size": 2,
    }


@pytest.fixture(scope="module")
def plain(qwen05: str) -> dict:
    return run_isolated(_job(qwen05, None), env=ENV)


@pytest.mark.parametrize("executor", ["inprocess", "ray"])
def test_tp2_identical_to_target_alone(qwen05: str, smollm2: str, plain: dict, executor: str) -> None:
    spec = {"method": "hetero", "model": smollm2, "num_speculative_tokens": 3, "algorithm": "tli",
            "executor": executor}
    result = run_isolated(_job(qwen05, spec), env=ENV)
    assert result["token_ids"] == plain["token_ids"]
    assert result["num_accepted_tokens"] > 0


def test_tp2_ranks_agree_at_t1_without_seeds(qwen05: str, smollm2: str) -> None:
    """Sampling without seeds draws from each rank's global RNG (the verifier's unseeded
    uniforms and noise, vLLM's bonus tokens): the drafter must neither draw from it nor
    shift it on one rank only. With VLLM_HETERO_SPEC_CHECK_RANKS=1 every step's sampled
    tokens and proposals are compared across the ranks (an all-gather of a digest)."""
    spec = {"method": "hetero", "model": smollm2, "num_speculative_tokens": 3, "algorithm": "tli"}
    job = {**_job(qwen05, spec), "temperature": 1.0, "max_tokens": 24}
    result = run_isolated(job, env={**ENV, "VLLM_HETERO_SPEC_CHECK_RANKS": "1"})
    ranks = result["worker_metrics"]
    assert len(ranks) == 2 and result["num_accepted_tokens"] > 0, (ranks, result["num_accepted_tokens"])
    assert all(r["rank_checks"] > 10 for r in ranks), ranks
    assert all(r["rank_mismatches"] == 0 for r in ranks), ranks
