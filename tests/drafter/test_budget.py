"""The adaptive draft budget against simulated machines whose costs and acceptance we set.

Each simulated step takes the planned k per request, draws how many proposals the
target accepts from known per-position acceptance, and charges a known step time; the
policy sees only what the proposer sees (sampled counts, wall times). The best fixed k
is computed from the same known model, so "as good as the best fixed k" and "never much
slower than plain decoding" are checked against ground truth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from vllm_hetero_spec.drafter.budget import AdaptiveBudget, FixedBudget, LinearFit, bucket_of, make_budget


@dataclass
class Machine:
    """Step time = plain (k = 0) or verify_a + verify_b * tokens + draft_a + draft_b * k."""

    plain: float
    verify_a: float
    verify_b: float
    draft_a: float
    draft_b: float

    def step_time(self, rows: int, ks: list[int]) -> tuple[float, float]:
        """(target time, proposer time) of a step."""
        k = max(ks, default=0)
        if k == 0:
            return self.plain, 0.0
        return self.verify_a + self.verify_b * (rows + sum(ks)), self.draft_a + self.draft_b * k


def expected_tokens(alpha: np.ndarray, k: int) -> float:
    return 1.0 + float(np.cumprod(alpha)[:k].sum())


def fixed_rate(machine: Machine, alphas: list[np.ndarray], k: int) -> float:
    rows = len(alphas)
    target, draft = machine.step_time(rows, [k] * rows)
    return sum(expected_tokens(a, k) for a in alphas) / (target + draft)


def simulate(policy, machine: Machine, alphas: list[np.ndarray], steps: int, seed: int = 0,
             noise: float = 0.03) -> tuple[float, list[int]]:
    """Tokens per second over ``steps`` steps, and the k chosen each step (the
    simulated clock goes on across calls with the same policy)."""
    rng = np.random.default_rng(seed)
    req_ids = [f"r{i}" for i in range(len(alphas))]
    start = clock = getattr(policy, "sim_clock", 0.0)
    tokens, chosen = 0, []
    sampled = [1] * len(req_ids)
    for _ in range(steps):
        policy.observe(clock, req_ids, sampled)
        ks = policy.plan(req_ids, [True] * len(req_ids))
        target, draft = machine.step_time(len(req_ids), ks)
        target *= 1 + noise * rng.standard_normal()
        draft *= 1 + noise * rng.standard_normal()
        policy.record(req_ids, ks, draft, clock + draft)
        clock += draft + target
        sampled = []
        for a, k in zip(alphas, ks):
            n = 0
            while n < k and rng.random() < a[n]:
                n += 1
            sampled.append(n + 1)
        tokens += sum(sampled)
        chosen.append(max(ks))
    policy.sim_clock = clock
    return tokens / (clock - start), chosen


# Shapes of the measured CPU step (1.5B target, SmolLM2 drafting): at batch 1 a plain
# step is 0.25 s and drafting is cheap relative to it; at batch 8 verification is
# compute-bound, so every fixed k loses to plain decoding.
BATCH1 = Machine(plain=0.25, verify_a=0.215, verify_b=0.010, draft_a=0.005, draft_b=0.045)
BATCH8 = Machine(plain=0.35, verify_a=0.25, verify_b=0.02, draft_a=0.01, draft_b=0.07)
ALPHA = np.array([0.6, 0.62, 0.65, 0.7, 0.7, 0.7, 0.7, 0.7])


def test_matches_the_best_fixed_k_at_batch_1() -> None:
    alphas = [ALPHA]
    best = max(fixed_rate(BATCH1, alphas, k) for k in range(1, 9))
    plain = fixed_rate(BATCH1, alphas, 0)
    assert best > 1.15 * plain  # speculation pays here
    rate, chosen = simulate(AdaptiveBudget(8), BATCH1, alphas, 600)
    assert rate >= 0.95 * best, (rate, best, np.bincount(chosen))


def test_never_much_slower_than_plain_where_every_k_loses() -> None:
    alphas = [ALPHA] * 8
    plain = fixed_rate(BATCH8, alphas, 0)
    assert all(fixed_rate(BATCH8, alphas, k) < plain for k in range(1, 9))
    rate, chosen = simulate(AdaptiveBudget(8), BATCH8, alphas, 600)
    assert rate >= 0.95 * plain, (rate, plain)
    assert np.bincount(chosen)[0] > 0.8 * len(chosen)  # mostly plain steps, a few probes


def test_follows_a_change_in_acceptance() -> None:
    """Drafts stop being accepted (say, the prompt mix changed): the policy stops
    drafting within a few dozen steps; when acceptance returns, so does drafting."""
    policy = AdaptiveBudget(8)
    _, before = simulate(policy, BATCH1, [ALPHA], 200, seed=1)
    _, bad = simulate(policy, BATCH1, [np.full(8, 0.02)], 200, seed=2)
    assert np.mean(before[-50:]) >= 1
    assert np.mean(np.array(bad[-100:]) == 0) > 0.8
    _, good = simulate(policy, BATCH1, [ALPHA], 300, seed=3)
    assert np.mean(good[-50:]) >= 1


def test_follows_a_change_in_cost() -> None:
    """The drafter gets ten times slower (a noisy neighbour): drafting stops paying."""
    policy = AdaptiveBudget(8)
    simulate(policy, BATCH1, [ALPHA], 200, seed=4)
    slow = Machine(**{**BATCH1.__dict__, "draft_b": 0.45})
    _, chosen = simulate(policy, slow, [ALPHA], 200, seed=5)
    assert np.mean(np.array(chosen[-100:]) == 0) > 0.8


def test_a_rarely_accepted_request_drafts_less() -> None:
    """Per request: a request whose drafts are never accepted drafts one token (enough
    to keep showing its acceptance) while a well-predicted one beside it drafts on."""
    policy = AdaptiveBudget(8)
    alphas = [np.full(8, 0.9), np.full(8, 0.0)]
    machine = Machine(plain=0.25, verify_a=0.2, verify_b=0.02, draft_a=0.005, draft_b=0.01)
    simulate(policy, machine, alphas, 300, seed=6)
    ks = policy.plan(["r0", "r1"], [True, True])
    assert ks[0] >= 3 and ks[1] == 1, ks


def test_warmup_explores_one_plain_and_two() -> None:
    policy = AdaptiveBudget(6)
    seen = []
    for step in range(3):
        policy.observe(float(step), ["a"], [1])
        ks = policy.plan(["a"], [True])
        policy.record(["a"], ks, 0.01, step + 0.01)
        seen.append(ks[0])
    assert seen == [1, 0, 2]


def test_rows_not_drafting_get_nothing_and_the_floor_holds() -> None:
    policy = AdaptiveBudget(4, min_tokens=2)
    assert policy.plan(["a", "b"], [True, False]) == [2, 0]  # warm-up k = 1, raised to the floor
    for _ in range(200):
        ks = policy.plan(["a"], [True])
        assert 2 <= ks[0] <= 4


def test_unsteady_steps_do_not_feed_the_cost_model() -> None:
    """A step where a request joined (its prefill ran in it) is not a verification cost."""
    policy = AdaptiveBudget(4)
    policy.record(["a"], [4], 0.1, 1.0)
    policy.observe(11.0, ["a", "b"], [2, 0])
    assert bucket_of(1) not in policy.buckets
    policy.record(["a", "b"], [4, 0], 0.1, 12.0)
    policy.observe(12.5, ["a", "b"], [3, 1])
    assert list(policy.buckets[bucket_of(2)].verify.by_size) == [6]  # 2 rows + 4 proposals


def test_acceptance_counts_the_positions_seen() -> None:
    policy = AdaptiveBudget(4, prior_accept=0.0)
    policy.record(["a"], [4], 0.0, 0.0)
    policy.observe(1.0, ["a"], [3])  # 2 accepted, the 3rd rejected, the 4th never judged
    np.testing.assert_allclose(policy.tried, [1, 1, 1, 0])
    np.testing.assert_allclose(policy.accepted, [1, 1, 0, 0])
    policy.forget("a")
    assert "a" not in policy.per_request


def test_linear_fit_recovers_a_line_and_forgets() -> None:
    fit = LinearFit(memory=0.8)
    for x in (2, 5, 9, 2, 5, 9):
        fit.add(x, 1.0 + 0.5 * x)
    np.testing.assert_allclose(fit.coef, [1.0, 0.5], atol=1e-3)
    for _ in range(60):
        fit.add(3, 10.0)
        fit.add(7, 12.0)
    np.testing.assert_allclose(fit.coef, [8.5, 0.5], atol=1e-2)


def test_fixed_always_drafts_the_maximum() -> None:
    policy = make_budget("fixed", 5)
    assert isinstance(policy, FixedBudget)
    assert policy.plan(["a", "b"], [True, False]) == [5, 0]
    assert isinstance(make_budget("adaptive", 5), AdaptiveBudget)


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError):
        AdaptiveBudget(4, min_tokens=5)
    with pytest.raises(ValueError):
        AdaptiveBudget(0)


def test_a_new_batch_size_borrows_what_is_known() -> None:
    """A batch that shrinks into a new bucket (its requests finishing) does not warm up
    from scratch with drafts that a neighbouring bucket has shown cannot pay."""
    policy = AdaptiveBudget(8)
    simulate(policy, BATCH8, [ALPHA] * 8, 200, seed=7)
    three = ["r0", "r1", "r2"]
    assert bucket_of(3) not in policy.buckets or not policy._ready(policy.buckets[bucket_of(3)])
    assert policy.plan(three, [True] * 3) == [0, 0, 0]
