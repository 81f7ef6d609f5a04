"""The hardware-aware draft budget: as many draft tokens as fit in a target step."""

from __future__ import annotations

import pytest

from vllm_hetero_spec.drafter.budget import DraftBudget


def test_unknown_times_give_the_maximum() -> None:
    budget = DraftBudget(1, 6)
    assert budget.tokens == 6
    budget.observe_target(0.2)
    assert budget.tokens == 6  # the draft side is still unknown


def test_ratio_of_target_step_to_draft_token() -> None:
    budget = DraftBudget(1, 8, smoothing=1.0)
    budget.observe_target(0.30)
    budget.observe_draft(0.40, 4)  # 0.1 s per token
    assert budget.tokens == 3


@pytest.mark.parametrize("target,draft,expected", [(10.0, 0.1, 6), (0.01, 1.0, 2)])
def test_bounded_by_config(target: float, draft: float, expected: int) -> None:
    budget = DraftBudget(2, 6, smoothing=1.0)
    budget.observe_target(target)
    budget.observe_draft(draft, 1)
    assert budget.tokens == expected


def test_follows_load() -> None:
    """A slower drafter (say, a noisy neighbour on its cores) shrinks the budget
    within a few steps, and it grows back when the drafter speeds up again."""
    budget = DraftBudget(1, 8)
    for _ in range(10):
        budget.observe_target(0.45)
        budget.observe_draft(0.05, 1)
    assert budget.tokens == 8
    for _ in range(10):
        budget.observe_draft(0.2, 1)
    assert budget.tokens == 2
    for _ in range(10):
        budget.observe_draft(0.1, 1)
    assert budget.tokens == 4


def test_ignores_empty_observations_and_checks_bounds() -> None:
    budget = DraftBudget(1, 4, smoothing=1.0)
    budget.observe_target(0.3)
    budget.observe_draft(0.0, 0)  # a step served from the pipeline: no forwards
    assert budget.tokens == 4
    with pytest.raises(ValueError):
        DraftBudget(5, 4)
