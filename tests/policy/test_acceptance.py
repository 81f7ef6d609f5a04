"""Per-position acceptance: what each verdict shows, how evidence ages, and its bounds."""

from __future__ import annotations

import numpy as np
import pytest

from _acceptance_draws import accepted_of
from vllm_hetero_spec.policy.acceptance import PositionAcceptance


def test_a_verdict_shows_the_positions_judged() -> None:
    """k = 4 with 2 accepted: two acceptances and one rejection; the 4th was never judged."""
    accept = PositionAcceptance(4, memory=1.0, stale_memory=1.0)
    accept.add_step([("a", "", 4, 2)])
    accepted, tried = accept.overall[""]
    np.testing.assert_allclose(tried, [1, 1, 1, 0])
    np.testing.assert_allclose(accepted, [1, 1, 0, 0])
    accept.add_step([("a", "", 2, 5)])  # more accepted than proposed counts as all of them
    np.testing.assert_allclose(accept.overall[""][0], [2, 2, 0, 0])


def test_an_estimate_is_read_once_per_step_and_follows_each_step() -> None:
    """Every row of a plan reads the overall estimate, so it is computed once a step; a
    step's verdicts must move it (a sampled rule's through its greedy kin too), and no
    reader may change the copy the others share."""
    accept = PositionAcceptance(2, memory=1.0, stale_memory=1.0, kin=lambda rule: "g" if rule == "s" else None)
    accept.add_step([("a", "g", 1, 0)])
    greedy, sampled = accept.estimate(rule="g"), accept.estimate(rule="s")
    assert accept.estimate(rule="g") is greedy
    with pytest.raises(ValueError):
        greedy[0] = 1.0
    accept.add_step([("a", "g", 1, 1), ("a", "g", 1, 1)])
    assert accept.estimate(rule="g")[0] > greedy[0] and accept.estimate(rule="s")[0] > sampled[0]


def test_a_position_not_drafted_keeps_what_it_learnt() -> None:
    """Position 3 was judged poor; the budget then drafts 2 for 150 steps. Its estimate
    must stay poor: aged per step, it had drifted back to the optimistic prior within a
    few dozen steps, and the budget paid to draft it again and again."""
    accept = PositionAcceptance(4)
    rng = np.random.default_rng(0)
    truth = [0.7, 0.7, 0.2, 0.2]
    for _ in range(60):
        accept.add_step([("a", "", 4, accepted_of(rng, truth, 4))])
    judged = accept.estimate()[2]
    assert judged < 0.35
    for _ in range(150):
        accept.add_step([("a", "", 2, 2 if rng.random() < 0.49 else 1)])
    # Only the slow staleness moves it, towards position 2's: aged per step (0.97, the rule
    # before), its counts were gone and it stood at position 2's 0.7.
    assert accept.estimate()[2] < judged + 0.1 < 0.45


def test_bounds_widen_with_few_or_stale_verdicts() -> None:
    """The bounds hold the estimate between them, narrow as verdicts come in, and widen
    again while a position is left alone: what makes it worth another look."""
    accept = PositionAcceptance(2)
    widths = []
    for step in range(40):
        accept.add_step([("a", "", 1, step % 2)])
        if step in (1, 39):
            widths.append(accept.estimate(side=1)[0] - accept.estimate(side=-1)[0])
    assert widths[1] < widths[0]
    low, mid, high = (accept.estimate(side=s)[0] for s in (-1, 0, 1))
    assert low < mid < high
    for _ in range(1000):
        accept.add_step([])
    assert accept.estimate(side=1)[0] - accept.estimate(side=-1)[0] > 1.5 * widths[1]
    assert accept.estimate()[0] == pytest.approx(mid, abs=0.02)  # stale, not changed


def test_a_request_s_own_counts_fade_by_steps() -> None:
    """A request's run of rejections pulls its estimate down, then fades by steps even
    while it drafts nothing, so it is not silenced for the rest of its reply."""
    accept = PositionAcceptance(2)
    for _ in range(40):
        accept.add_step([("other", "", 2, 1)])
    for _ in range(4):
        accept.add_step([("a", "", 1, 0)])
    low = accept.estimate("a")[0]
    assert low < accept.estimate()[0] - 0.15
    for _ in range(150):
        accept.add_step([])
    assert accept.estimate("a")[0] == pytest.approx(accept.estimate()[0], abs=0.05)
    accept.forget("a")
    assert "a" not in accept.per_request


def test_a_rule_with_few_verdicts_leans_on_its_kin() -> None:
    """A sampled rule with no verdicts of its own starts at its greedy kin's estimate per
    position (not the flat prior, which valued deep positions at 0.5 and made the first
    sampled steps draft k = 3-4), and moves to its own verdicts as they come; a rule
    without kin keeps the flat prior."""
    accept = PositionAcceptance(4, kin=lambda rule: "tli" if rule == "tli@sampled" else None)
    rng = np.random.default_rng(1)
    truth = [0.6, 0.4, 0.25, 0.15]
    for _ in range(200):
        accept.add_step([("a", "tli", 4, accepted_of(rng, truth, 4))])
    greedy = accept.estimate(rule="tli")
    np.testing.assert_allclose(accept.estimate(rule="tli@sampled"), greedy)
    np.testing.assert_allclose(accept.estimate(rule="slem"), [0.5] * 4)
    for _ in range(200):
        accept.add_step([("b", "tli@sampled", 4, 1 if rng.random() < 0.5 else 0)])
    sampled = accept.estimate(rule="tli@sampled")
    assert sampled[0] == pytest.approx(0.5, abs=0.1)
    assert sampled[1] < 0.15  # its own rejections at position 2, far below the greedy 0.4
