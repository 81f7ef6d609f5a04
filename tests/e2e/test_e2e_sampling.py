"""T > 0 end to end: with speculation the target's output distribution is unchanged.

Hundreds of independently seeded requests of one prompt, sampled with top-k and top-p
set (so vLLM's filters reach p through our sampler); the tokens at the positions the
drafter proposes (1 and 2; position 0 comes from the prefill) are compared with the
same positions from the target alone by a two-sample chi-square test. A control shows
the test has power: the target at another temperature is detected.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from vllm_hetero_spec.harness.evaluation import run_isolated


N = 240
PROMPT = "My favourite thing about the weekend is"
FILTERS = {"top_k": 40, "top_p": 0.95}


def _sample(target: str, seed0: int, temperature: float, spec: dict | None = None) -> list[list[int]]:
    job = {
        "target": target,
        "prompts": [PROMPT] * N,
        "request_seeds": list(range(seed0, seed0 + N)),
        "max_tokens": 3,
        "temperature": temperature,
        "ignore_eos": True,
        "max_model_len": 256,
        "max_num_seqs": 64,
        "speculative_config": spec,
        "warmup": False,
        **FILTERS,
    }
    result = run_isolated(job)
    if spec is not None:
        # Otherwise a drafter that never drafts (or always fails) would pass vacuously.
        assert result["num_accepted_tokens"] > 0 and result["fallbacks"] == 0, result
        if spec.get("algorithm") == "slrs":  # psi was computed, not skipped for slem
            assert result["drafter_stats"]["slrs_tree_nodes"] > 0, result["drafter_stats"]
    return result["token_ids"]


def _pvalue(a: list[int], b: list[int]) -> float:
    """Two-sample chi-square homogeneity test; rare tokens pooled into one bin."""
    ca, cb = Counter(a), Counter(b)
    pooled = ca + cb
    common = [t for t, c in pooled.items() if c >= 10]
    rows = [[ca[t] for t in common] + [sum(ca.values()) - sum(ca[t] for t in common)],
            [cb[t] for t in common] + [sum(cb.values()) - sum(cb[t] for t in common)]]
    table = np.array(rows)
    table = table[:, table.sum(0) > 0]
    return float(chi2_contingency(table)[1])


@pytest.fixture(scope="module")
def plain_t1(gemma: str) -> list[list[int]]:
    return _sample(gemma, 0, 1.0)


@pytest.mark.parametrize("algorithm,executor", [("slem", "inprocess"), ("tli", "inprocess"), ("dtw", "inprocess"),
                                                ("slrs", "inprocess"), ("union", "inprocess"), ("fsd", "inprocess"),
                                                ("tli", "ray")])
def test_output_distribution_matches_target(gemma: str, smollm2: str, plain_t1, algorithm: str, executor: str) -> None:
    """Every lossless mode (dtw in its lossless verification mode, fsd at tau = 0);
    tli also drafting in a Ray actor, where pipelined drafts come from forked random
    streams. A fixed draft length, so that every step drafts and the test keeps its
    power (the identity tests run the adaptive budget)."""
    spec = _sample(gemma, 10_000, 1.0, {"method": "hetero", "model": smollm2, "num_speculative_tokens": 3,
                                        "algorithm": algorithm, "dtw_verify": "lossless", "executor": executor,
                                        "fsd_threshold": 0.0, "draft_budget": "fixed"})
    for pos in (1, 2):
        p = _pvalue([o[pos] for o in plain_t1], [o[pos] for o in spec])
        assert p > 1e-3, f"{algorithm}: position {pos} distribution differs from the target's (p={p:.1e})"


def test_control_detects_a_different_distribution(gemma: str, plain_t1) -> None:
    other = _sample(gemma, 20_000, 0.5)
    assert min(_pvalue([o[pos] for o in plain_t1], [o[pos] for o in other]) for pos in (1, 2)) < 1e-3
