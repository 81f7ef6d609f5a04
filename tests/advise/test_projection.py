"""The projection ``advise`` reports, checked against step timings recorded on this
project's machines (``benchmarks/results/step_anatomy*.json``, written by
``benchmarks/step_anatomy.py``): SmolLM2-135M drafting ``tli`` for Qwen2.5-Coder-1.5B
at k = 1, 2, 4, batch 1 and 8, with each run's measured speedup over plain decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_hetero_spec.advise.projection import (
    Phased, StepCosts, at_length, best, best_at_lengths, decode_steps, expected_tokens, speedup)

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
ROWS = json.loads((RESULTS / "step_anatomy.json").read_text())["rows"]


def _costs(row: dict, host: bool = True) -> StepCosts:
    return StepCosts({row["k"]: row["v"]}, row["c"], row["bridge_ms"] / row["plain_step_ms"] if host else 0.0)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"b{r['batch']}-k{r['k']}")
def test_the_projection_is_the_anatomys_limit(row: dict) -> None:
    """Decode steps only, no host work: exactly the limit the anatomy derived."""
    assert expected_tokens(row["acceptance_per_position"], row["k"]) == pytest.approx(row["E"])
    assert speedup(row["acceptance_per_position"], _costs(row, host=False), row["k"]) == pytest.approx(row["limit"])


@pytest.mark.parametrize("row", [r for r in ROWS if r["batch"] == 1], ids=lambda r: f"k{r['k']}")
def test_at_batch_1_it_projects_the_measured_speedup(row: dict) -> None:
    """Where the median step is the run (batch 1), the projection with the bridge counted
    is within 6% of the speedup measured end to end."""
    projected = speedup(row["acceptance_per_position"], _costs(row), row["k"])
    assert abs(projected / row["speedup"] - 1) < 0.06, (projected, row["speedup"])


def test_the_best_length_and_plain_when_nothing_pays() -> None:
    acceptance = [0.8, 0.6, 0.4, 0.2]
    cheap = StepCosts({1: 1.02, 2: 1.04, 3: 1.06, 4: 1.08}, draft_forward=0.1)
    chosen = best(acceptance, cheap)
    assert chosen.k == 3 and chosen.speedup == max(chosen.by_k.values()) > 2.0  # the 4th position costs more than it adds
    dear = StepCosts({1: 1.5, 2: 1.9, 3: 2.3, 4: 2.7}, draft_forward=0.4)
    assert best(acceptance, dear).k == 0 and best(acceptance, dear).speedup == 1.0
    # A run that is mostly prefill gains little whatever the decode steps gain.
    prefill = StepCosts(cheap.verify, cheap.draft_forward, prefill=180.0)
    assert 1.0 < best(acceptance, prefill, groups=[[21]]).speedup < 1.06
    with pytest.raises(ValueError, match="2 positions"):
        expected_tokens([0.5, 0.2], 3)


def test_prefill_and_reading_weigh_less_as_replies_grow() -> None:
    """Paid once per request, prefill and the drafter's reading dilute with the output's
    length: the speedup rises towards the steady state's ``E(k) / step`` and never
    passes it."""
    acceptance = [0.7, 0.5]
    costs = StepCosts({1: 1.1, 2: 1.2}, draft_forward=0.1, prefill=20.0, reading=30.0)
    steady = speedup(acceptance, costs, 2)
    assert steady == pytest.approx(expected_tokens(acceptance, 2) / 1.4)
    by_length = [at_length(acceptance, costs, 2, 1, n) for n in (16, 64, 256, 1024, 16384)]
    assert by_length == sorted(by_length) and by_length[0] < 1.0 < by_length[2]
    assert by_length[-1] < steady and by_length[-1] == pytest.approx(steady, rel=0.01)
    chosen = best_at_lengths(acceptance, costs, 1, (64, 256, 1024))
    assert set(chosen.by_length) == {64, 256, 1024} and chosen.by_length[64] == at_length(acceptance, costs, chosen.k, 1, 64)


def test_a_reply_runs_through_its_early_phase_then_the_steady_one() -> None:
    """Nothing accepted before output token 10, everything after: from the prefill's one
    token, 9 steps of one token reach token 10, then 20 tokens take 10 steps of two."""
    phased = Phased((0.0,), (1.0,), switch=10)
    assert decode_steps(phased, 1, 29) == pytest.approx(19.0)
    assert decode_steps(phased, 1, 5) == pytest.approx(decode_steps([0.0], 1, 5)) == 5.0  # early throughout
    assert decode_steps(Phased((0.6, 0.3), (0.6, 0.3), 24), 2, 200) == pytest.approx(decode_steps([0.6, 0.3], 2, 200))
    assert expected_tokens(phased, 1) == 2.0  # the steady state is the late phase
    # a long reply's speedup approaches the late phase's; a short one stays near the early one's
    costs = StepCosts({2: 1.2}, draft_forward=0.1)
    rising = Phased((0.5, 0.2), (0.8, 0.6), 24)
    assert at_length([0.5, 0.2], costs, 2, 1, 16) == pytest.approx(at_length(rising, costs, 2, 1, 16))
    assert at_length(rising, costs, 2, 1, 64) < at_length(rising, costs, 2, 1, 1024) < speedup([0.8, 0.6], costs, 2)
