"""The projection ``advise`` reports, checked against step timings recorded on this
project's machines (``benchmarks/results/step_anatomy*.json``, written by
``benchmarks/step_anatomy.py``): SmolLM2-135M drafting ``tli`` for Qwen2.5-Coder-1.5B
at k = 1, 2, 4, batch 1 and 8, with each run's measured speedup over plain decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_hetero_spec.advise.projection import StepCosts, best, expected_tokens, speedup

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
    prefill = StepCosts(cheap.verify, cheap.draft_forward, prefill_share=0.9)
    assert 1.0 < best(acceptance, prefill).speedup < 1.06
    with pytest.raises(ValueError, match="2 positions"):
        expected_tokens([0.5, 0.2], 3)
