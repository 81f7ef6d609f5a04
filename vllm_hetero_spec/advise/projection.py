"""The projected speedup of speculative decoding from a step's measured parts.

A plain decoding step costs 1 (the unit). A speculative step that drafts ``k`` tokens
costs ``v(k)`` -- the target at ``k + 1`` positions per request, the rejection sampler,
bookkeeping -- plus ``k`` draft positions of ``c`` each (a rule's own cost per position:
the string-level rules' re-tokenized drafts cost more than one forward) and ``h``, the
bridge and the proposer's host work. It emits ``E(k) = 1 + r_1 + ... + r_k`` tokens per
request, ``r_i`` the share of steps whose position ``i`` was accepted (vLLM's
per-position counters are cumulative: position ``i`` counts only when ``1..i-1`` did).
A run's prefill costs the same either way, except that the drafter reads each prompt
too: with ``p`` the prefill's share of a plain run and ``x`` the drafter's reading, in
the same units, the speedup is ``1 / (p + x + (1 - p) * (v(k) + k c + h) / E(k))``.

A request of ``L`` tokens takes ``L - 1`` plain decode steps but, drafting, about
``(L - 1) / E(k)`` -- about, because its last step emits only what is left. Where the
outputs' lengths are known, :func:`decode_steps` counts the expected steps exactly and
``(L - 1) / E(k)`` becomes that count (for short outputs the difference is large: at
``L = 12`` and ``E = 2.1``, 6 steps rather than 5.2).

Pure arithmetic on measured numbers: ``advise`` measures them on the user's machine and
prompts; ``tests/advise/test_projection.py`` checks the formula against the step
anatomy recorded by ``benchmarks/step_anatomy.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepCosts:
    """One batch size's step costs on one machine, in plain-step units.

    Attributes:
        verify: per draft length ``k``, ``v(k)``: a speculative step without drafting.
        draft_forward: ``c``: one draft position for the whole batch.
        host: ``h``: per drafting step, the bridge and the proposer's host work.
        prefill_share: ``p``: the share of a plain run spent outside decode steps.
        prefill_extra: ``x``: what drafting adds outside decode steps (the drafter reading
            each prompt), as a share of a plain run.
    """

    verify: dict[int, float]
    draft_forward: float
    host: float = 0.0
    prefill_share: float = 0.0
    prefill_extra: float = 0.0


@dataclass(frozen=True)
class Projection:
    """The best draft length for one (drafter, rule, batch, temperature) and its speedup;
    ``by_k``: the speedup at every draft length measured (``k = 0``: plain, 1.0)."""

    k: int
    speedup: float
    by_k: dict[int, float] = field(default_factory=dict)


def expected_tokens(acceptance: Sequence[float], k: int) -> float:
    """``E(k)``: tokens a request emits per step drafting ``k`` (``acceptance[i]``: the
    share of steps whose position ``i + 1`` was accepted, cumulative)."""
    if k > len(acceptance):
        raise ValueError(f"acceptance was measured at {len(acceptance)} positions, not {k}")
    return 1.0 + sum(acceptance[:k])


def decode_steps(acceptance: Sequence[float], k: int, tokens: int) -> float:
    """The expected steps drafting ``k`` takes to emit ``tokens`` tokens: each step emits
    ``j + 1`` with probability ``r_j - r_{j+1}`` (``r_0 = 1``, ``r_{k+1} = 0``), and the
    last step no more than are left."""
    r = [1.0, *acceptance[:k], 0.0]
    emit = [(j + 1, r[j] - r[j + 1]) for j in range(k + 1)]
    steps = [0.0] * (tokens + 1)
    for n in range(1, tokens + 1):
        steps[n] = 1.0 + sum(p * steps[max(n - e, 0)] for e, p in emit)
    return steps[tokens]


def group_steps(acceptance: Sequence[float], k: int, groups: Sequence[Sequence[int]]) -> float:
    """Expected decode steps drafting ``k`` for groups of requests run together (their
    output lengths): each group until its longest request ends (expected steps grow
    with the tokens to emit, so the longest request's count is the group's)."""
    return sum(decode_steps(acceptance, k, max(g) - 1) for g in groups)


def step_ratio(acceptance: Sequence[float], k: int, groups: Sequence[Sequence[int]] | None,
               tail: float = 1.0) -> float:
    """Decode steps drafting ``k`` over plain decode steps: ``1 / E(k)``, or, given the
    output lengths of each group of requests run together, the expected count
    (:func:`group_steps`) times ``tail``: how many more steps a batch took than that
    count said, measured (requests accept at different rates, and a group waits for
    its slowest)."""
    if not groups:
        return 1.0 / expected_tokens(acceptance, k)
    plain = sum(max(g) - 1 for g in groups)
    return tail * group_steps(acceptance, k, groups) / plain if plain > 0 else 1.0


def speedup(acceptance: Sequence[float], costs: StepCosts, k: int, groups: Sequence[Sequence[int]] | None = None,
            tail: float = 1.0) -> float:
    """The projected speedup over plain decoding of drafting ``k`` tokens every step
    (``groups``, ``tail``: see :func:`step_ratio`)."""
    if k == 0:
        return 1.0
    step = costs.verify[k] + k * costs.draft_forward + costs.host
    decode = step * step_ratio(acceptance, k, groups, tail)
    return 1.0 / (costs.prefill_share + costs.prefill_extra + (1.0 - costs.prefill_share) * decode)


def best(acceptance: Sequence[float], costs: StepCosts, groups: Sequence[Sequence[int]] | None = None,
         tail: float = 1.0) -> Projection:
    """The draft length the measured costs favour (0, plain, when none pays), as the
    adaptive budget would settle on it."""
    by_k = {0: 1.0}
    for k in sorted(costs.verify):
        if 0 < k <= len(acceptance):
            by_k[k] = speedup(acceptance, costs, k, groups, tail)
    k = max(by_k, key=lambda n: by_k[n])
    return Projection(k, by_k[k], by_k)
