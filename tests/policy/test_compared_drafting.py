"""``auto``'s rule comparison and the draft budget together (``StepPolicy``), on a
simulated engine shaped like the 1.5B target at batch 1, T = 1 on the 2-core EPYC: a
plain step 0.59 s, tli's draft token 0.10 s, slrs's psi tree 0.35 s plus 0.07 s a token,
so tli alone is the faster rule at every k; each rule's first timed sampled draft pays a
one-time 0.4 s, as tli's first sampled draft did in a real engine (557 ms where later
ones took about 150). The budget priced tli from that step alone, left tli's turns
undrafted, and they ran at plain speed: slrs won the comparison for the whole run."""

from __future__ import annotations

import numpy as np

from _acceptance_draws import accepted_of
from vllm_hetero_spec.drafter.rules.registry import forward_only_rules
from vllm_hetero_spec.policy.step_policy import StepPolicy

PLAIN_S, TOKEN_S = 0.58, 0.01  # the target's step: PLAIN_S + TOKEN_S per token it runs
DRAFT_S = {"tli": lambda k: 0.10 * k, "slrs": lambda k: 0.35 + 0.07 * k}
ONCE_S = 0.4  # a rule's first timed sampled draft (its first came as its request joined)
ALPHA = {"tli": np.full(4, 0.6), "slrs": np.array([0.75, 0.6, 0.6, 0.6])}
INGEST_S = 0.0008  # the drafter's read of a token it has not seen


def serve(seed: int, requests: int = 5, tokens: int = 64, prompt: int = 250,
          draft_s: dict | None = None, once_s: float = ONCE_S) -> tuple[float, dict[str, int], StepPolicy]:
    """Requests one at a time at T = 1; the first is served untimed (as a server has
    before). Returns tokens per second over the rest, drafted steps per rule, the policy."""
    draft_s = draft_s or DRAFT_S
    rng = np.random.default_rng(seed)
    policy = StepPolicy(4, "adaptive", 0, None, (("slem", "tli"), ("tli", "slrs")), forward_only_rules())
    now, timed_tokens, timed_s = 0.0, 0, 0.0
    drafted: dict[str, int] = {}
    seen: dict[str, int] = {}
    for r in range(requests):
        rid, length, emitted, synced = f"r{r}", prompt + 1, 1, 0
        now += PLAIN_S + TOKEN_S * 10  # the prefill
        sampled = [1]
        while emitted < tokens:
            plan = policy.plan(now, [rid], sampled, [1.0], [length], [None], [tokens - emitted])
            k, rule = plan.lengths[0], plan.rules[0]
            draft = 0.0
            if k > 0:
                draft = draft_s[rule](k) + INGEST_S * (length - synced)
                synced = length
                seen[rule] = seen.get(rule, 0) + 1
                draft += once_s if seen[rule] == 2 else 0.0
                drafted[rule] = drafted.get(rule, 0) + (r > 0)
            policy.record(plan, [rid], sampled, [1.0], [length], [k], now, now + draft)
            n = min(accepted_of(rng, ALPHA[rule], k) + 1, tokens - emitted)
            step = draft + PLAIN_S + TOKEN_S * (1 + k)
            now += step
            if r > 0:
                timed_tokens, timed_s = timed_tokens + n, timed_s + step
            emitted, length, sampled = emitted + n, length + n, [n]
        policy.forget(rid)
    return timed_tokens / timed_s, drafted, policy


def test_each_rule_is_compared_drafting() -> None:
    """Measured as the budget ran them, tli lost the comparison to slrs in 3 of 48
    seeds (26, 37, 40; 2.03-2.06 tok/s), never drafting after the first request in two.
    Compared drafting, tli drafts in every seed and wins those three."""
    runs = [serve(seed) for seed in range(48)]
    assert all(drafted.get("tli", 0) > 0 for _, drafted, _ in runs)
    for seed in (26, 37, 40):
        _, drafted, policy = runs[seed]
        assert policy.rules.kinds["sampled"].best == "tli" and drafted["tli"] > 50, (seed, drafted)


def test_a_one_time_cost_does_not_hold_k_at_1() -> None:
    """k = 2 pays best on this engine (fixed k = 2 runs 2.31 tok/s, k = 1 2.24). With the
    one-time 0.4 s, the draft price's fit read it as a steep cost per token (a negative
    fixed cost), and the k = 1 steps that followed could not correct it: the budget held
    k = 1 (over twice as many k = 1 steps as k = 2) in 24 of 48 seeds, against 3 without
    the one-time cost, and the mean rate fell 1.3%. Bounded at 0, faded by the first step
    under half its price, and probed while it rests on few steps, the price recovers."""
    once = [serve(seed) for seed in range(48)]
    never = [serve(seed, once_s=0.0) for seed in range(48)]
    held = [seed for seed, (_, _, policy) in enumerate(once) if policy.budget.chosen[1] > 2 * policy.budget.chosen[2]]
    assert len(held) <= 8, held
    assert np.mean([rate for rate, _, _ in once]) > 0.995 * np.mean([rate for rate, _, _ in never])


def test_nothing_is_added_where_no_rule_would_draft() -> None:
    """Where the budget drafts with no candidate (every draft dearer than it gains),
    comparing rules would cost drafting that does not pay: no step is added."""
    dear = {"tli": lambda k: 2.0 + k, "slrs": lambda k: 2.0 + k}
    _, drafted, policy = serve(0, requests=3, draft_s=dear)
    assert policy.budget.exploration.compared == 0
    assert sum(drafted.values()) <= 4, drafted  # the budget's own probes, if any
