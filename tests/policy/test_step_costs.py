"""The step costs the adaptive budget learns (``policy/step_costs.py``), on their own:
the target's curve over the tokens a step runs and the linear fit behind the proposer's
price, fed known step times, so what each price must be is known."""

from __future__ import annotations

import numpy as np
import pytest

from scipy.optimize import nnls

from vllm_hetero_spec.policy.step_costs import DraftCost, LinearFit, TargetCost, _nonnegative_solve


def test_linear_fit_recovers_a_line_and_forgets() -> None:
    fit = LinearFit(memory=0.8)
    for x in (2, 5, 9, 2, 5, 9):
        fit.add(x, 1.0 + 0.5 * x)
    np.testing.assert_allclose(fit.coef, [1.0, 0.5], atol=1e-3)
    for _ in range(60):
        fit.add(3, 10.0)
        fit.add(7, 12.0)
    np.testing.assert_allclose(fit.coef, [8.5, 0.5], atol=1e-2)


def test_target_cost_curve() -> None:
    """Measured sizes as measured, a dip included (a CPU's curve need not rise); between
    sizes interpolated; beyond them rising at least as steeply as the secant from the
    smallest size on the curve's rising fit; below them flat. During the warm-up, first
    steps (which may carry one-time costs) stand in, fitted to rise."""
    cost = TargetCost(memory=0.5)
    cost.add(2, 0.29 + 0.5)
    cost.add(3, 0.24 + 0.5)
    assert cost.predict(2) == cost.predict(3) == pytest.approx(0.765)  # first steps, pooled
    for tokens, seconds in [(1, 0.22), (2, 0.29), (3, 0.24), (8, 0.30), (16, 0.37)]:
        if tokens not in (2, 3):
            cost.add(tokens, seconds + 0.5)  # a first step's one-time cost: not priced
        cost.add(tokens, seconds)
    assert cost.predict(1) == pytest.approx(0.22) and cost.predict(16) == pytest.approx(0.37)
    assert cost.predict(2) == pytest.approx(0.29) and cost.predict(3) == pytest.approx(0.24)
    assert cost.predict(2.5) == pytest.approx(0.265) and cost.predict(12) == pytest.approx(0.335)
    secant = (0.37 - 0.22) / 15
    assert cost.predict(32) >= 0.37 + secant * 16 - 1e-9
    assert cost.predict(0.5) == pytest.approx(0.22)
    assert cost.slope(8, 16) == pytest.approx(0.07 / 8) and cost.slope(2, 3) == 0.0


def test_a_size_not_run_follows_the_machine() -> None:
    """The machine slows by 20% while the policy runs only 2-token steps: the price of a
    plain step follows (one level for every size), instead of keeping the price of the
    moment it was last run -- a stale price let the budget draft on the 0.5B target at
    T = 1 where drafting lost."""
    cost = TargetCost(memory=0.9)
    for _ in range(40):
        cost.add(1, 0.160)
        cost.add(2, 0.180)
    for _ in range(40):
        cost.add(2, 0.180 * 1.2)
    assert cost.predict(2) == pytest.approx(0.180 * 1.2, rel=0.02)
    assert cost.predict(1) > 0.160 * 1.15  # most of the drift (a mean per size alone: none)


def test_one_noisy_step_moves_every_size_alike() -> None:
    """A slow step moves the level, which prices every size alike, so it cannot make one
    size look cheap next to another; the sizes' own costs average many steps."""
    cost = TargetCost(memory=0.9)
    for _ in range(40):
        cost.add(1, 0.160)
        cost.add(2, 0.180)
    before = cost.predict(2) / cost.predict(1)
    cost.add(1, 0.240)
    assert cost.predict(1) > 0.160
    # The ratio moves 1.3% (the size's own mean takes its small share); with a mean per
    # size alone (memory 0.9) it moved 5%, enough to flip a choice inside the 3% margin.
    assert cost.predict(2) / cost.predict(1) == pytest.approx(before, rel=0.02)


def test_an_overpriced_size_is_priced_again() -> None:
    """The plain step's first steps ran during a slow patch (twice its cost). The policy
    then never runs k = 0, so that price would last for ever: after ``stale_after``
    steps the size counts as unpriced (worth a probe), and its next step sets it to the
    lower of the two."""
    cost = TargetCost(memory=0.9, stale_after=50)
    cost.add(1, 0.5)
    cost.add(1, 0.5)
    for _ in range(60):
        cost.add(3, 0.30)
    assert not cost.priced(1) and cost.priced(3)
    assert cost.predict(1) > 0.35  # still at its old price
    cost.add(1, 0.25)
    assert cost.priced(1) and cost.predict(1) == pytest.approx(0.25, rel=0.05)


def test_nonnegative_solve_matches_nnls() -> None:
    """The bounded fit's solver against SciPy's NNLS on random problems, where the bound
    binds on some coefficients and not others."""
    rng = np.random.default_rng(0)
    bound = 0
    for _ in range(300):
        a = rng.standard_normal((int(rng.integers(1, 10)), int(rng.integers(1, 7))))
        b = rng.standard_normal(len(a))
        gram, rhs = a.T @ a + 1e-6 * np.eye(a.shape[1]), a.T @ b
        want, _ = nnls(np.vstack([a, 1e-3 * np.eye(a.shape[1])]), np.concatenate([b, np.zeros(a.shape[1])]))
        np.testing.assert_allclose(_nonnegative_solve(gram, rhs), want, atol=1e-6)
        bound += int((want == 0).any() and (want > 0).any())
    assert bound > 50


def test_a_slow_step_at_a_length_no_longer_run_fades() -> None:
    """One k = 2 step paid a one-time 0.4 s among k = 1 steps of 0.1 s (a draft token
    costs 0.1 s). Unbounded, the fit read a cost per token of 0.5 s and a fixed cost of
    -0.4 s, and the k = 1 steps that followed, which cannot split the two, kept k = 2
    priced at 0.6 s for good; bounded at 0, the k = 1 steps pin the cost per token and
    the slow step fades."""
    cost = DraftCost(memory=0.9, features=3)
    for _ in range(3):
        cost.add("tli", [1, 1, 0], 0.1)
    cost.add("tli", [2, 2, 0], 0.2 + 0.4)
    for _ in range(30):
        cost.add("tli", [1, 1, 0], 0.1)
    assert cost.predict("tli", [1, 1, 0]) == pytest.approx(0.1, rel=0.05)
    assert cost.predict("tli", [2, 2, 0]) < 0.22


def test_a_step_under_half_its_price_fades_what_priced_it() -> None:
    """A first sampled draft took 557 ms where later ones took 150 (a one-time cost). The
    first cheap step fades that evidence to half a step's weight, so the price is about
    right at once, not after the dozens of steps memory alone takes; a step a little
    cheaper than its price is only averaged in."""
    cost = DraftCost(memory=0.9, features=3)
    cost.add("tli", [1, 1, 0], 0.557)
    cost.add("tli", [1, 1, 0], 0.15)
    assert cost.predict("tli", [1, 1, 0]) < 0.3  # memory alone: 0.34
    for _ in range(8):
        cost.add("tli", [1, 1, 0], 0.15)
    assert cost.predict("tli", [1, 1, 0]) < 0.167  # memory alone: 0.174
    for _ in range(20):
        cost.add("tli", [1, 1, 0], 0.15)
    cost.add("tli", [1, 1, 0], 0.10)
    assert cost.predict("tli", [1, 1, 0]) == pytest.approx(0.15 - 0.05 / cost.n, rel=0.02)


def test_a_draft_price_on_few_or_old_steps_is_not_known() -> None:
    """A key's price counts as known once its steps weigh ``evidence`` in the fit, and
    stops counting ``stale_after`` steps after it was last timed: the budget probes it."""
    cost = DraftCost(memory=0.9, features=3, evidence=3.0, stale_after=20)
    for step in range(3):
        cost.add("tli", [1, 1, 0], 0.1, step)
        assert not cost.priced("tli", step)  # three steps weigh 2.71 at memory 0.9
    cost.add("tli", [1, 1, 0], 0.1, 3)
    assert cost.priced("tli", 3) and cost.priced("tli", 23) and not cost.priced("tli", 24)
    assert not cost.priced("slem", 3)


def test_a_stale_size_is_priced_at_most_as_its_fresh_neighbours_say() -> None:
    """A size the policy stopped running keeps the price of its first steps, which may
    be dear (on the 1.5B target at T = 1 a 3-token step stayed priced at 858 ms where
    fixed k = 2 ran them at about 740, and the budget held k = 1). Once stale it is
    priced at the lower of its price and the fresh sizes' interpolation, so it is run
    again, and corrected, rather than avoided for its old price."""
    cost = TargetCost(memory=0.9, stale_after=20)
    for tokens, seconds in [(1, 0.65), (2, 0.73), (3, 0.86), (5, 0.86)] * 2:
        cost.add(tokens, seconds)
    assert cost.predict(3) == pytest.approx(0.86, rel=0.01)  # fresh: its own price, above its neighbours'
    for _ in range(12):
        for tokens, seconds in [(1, 0.65), (2, 0.73), (5, 0.86)]:
            cost.add(tokens, seconds)
    assert not cost.priced(3)
    assert cost.predict(3) == pytest.approx(0.73 + (0.86 - 0.73) / 3, rel=0.01)
    cost.add(3, 0.70)  # run again: back at the lower of its old price and this step
    assert cost.priced(3) and cost.predict(3) == pytest.approx(0.70, rel=0.01)
