"""The projected speedup of speculative decoding from a step's measured parts.

A plain decoding step costs 1 (the unit). A speculative step that drafts ``k`` tokens
costs ``v(k)`` -- the target at ``k + 1`` positions per request, the rejection sampler,
bookkeeping -- plus ``k`` draft positions of ``c`` each (a rule's own cost per position:
the string-level rules' re-tokenized drafts cost more than one forward) and ``h``, the
bridge and the proposer's host work. It emits ``E(k) = 1 + r_1 + ... + r_k`` tokens per
request, ``r_i`` the share of steps whose position ``i`` was accepted (vLLM's
per-position counters are cumulative: position ``i`` counts only when ``1..i-1`` did).

A group of requests run together (``b`` of them, outputs of ``L`` tokens) costs plain
decoding ``P + (L - 1)`` units: ``P`` its prefill and first token, then one decode step
per token. Drafting, it costs ``P + X + n(L) (v(k) + k c + h)``: ``X`` the drafter reading
each prompt, ``n(L)`` the expected decode steps (:func:`decode_steps`: about
``(L - 1) / E(k)``, but a last step emits only what is left; at ``L = 12`` and
``E = 2.1``, 6 steps rather than 5.2). Prefill and reading are paid once per request, the
decode steps per token, so the same pair gains more on long replies than on short ones:
:func:`speedup` takes the output lengths, and ``advise`` projects at the lengths users
generate, not only at its sample's, whose short requests weigh the reading most.
Without lengths, the steady state: ``E(k) / step``.

Acceptance itself rises along a reply: its first tokens turn from the prompt to the
answer, where a small drafter guesses worst, and later ones continue what is already
written. Measured on a short sample, one figure for every position would project long
replies low, so acceptance may come in two phases (:class:`Phased`): one over a
request's first output tokens, one past them, and :func:`decode_steps` follows a
request through both.

Pure arithmetic on measured numbers: ``advise`` measures them on the user's machine and
prompts; ``tests/advise/test_projection.py`` checks the formula against the step
anatomy recorded by ``benchmarks/step_anatomy.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepCosts:
    """One batch size's step costs on one machine, in plain decode steps.

    Attributes:
        verify: per draft length ``k``, ``v(k)``: a speculative step without drafting.
        draft_forward: ``c``: one draft position for the whole batch.
        host: ``h``: per drafting step, the bridge and the proposer's host work.
        prefill: ``P``: a group's prefill and first token, the same with or without drafting.
        reading: ``X``: what drafting adds to a group outside its decode steps (the
            drafter reading each prompt).
    """

    verify: dict[int, float]
    draft_forward: float
    host: float = 0.0
    prefill: float = 0.0
    reading: float = 0.0


@dataclass(frozen=True)
class Phased:
    """Acceptance per draft position (cumulative, as :func:`expected_tokens` takes it)
    that changes along a reply: ``early`` while a request has fewer than ``switch``
    output tokens, ``late`` (the steady state) from then on."""

    early: tuple[float, ...]
    late: tuple[float, ...]
    switch: int


#: Acceptance per draft position: one figure for every point of a reply, or two phases.
Acceptance = Sequence[float] | Phased


def steady(acceptance: Acceptance) -> Sequence[float]:
    """The acceptance a long reply settles at."""
    return acceptance.late if isinstance(acceptance, Phased) else acceptance


@dataclass(frozen=True)
class Projection:
    """The best draft length for one (drafter, rule, batch, temperature) and its speedup;
    ``by_k``: the speedup at every draft length measured (``k = 0``: plain, 1.0);
    ``by_length``: the chosen ``k``'s speedup per output length projected at."""

    k: int
    speedup: float
    by_k: dict[int, float] = field(default_factory=dict)
    by_length: dict[int, float] = field(default_factory=dict)


def expected_tokens(acceptance: Acceptance, k: int) -> float:
    """``E(k)``: tokens a request emits per step drafting ``k`` (``acceptance[i]``: the
    share of steps whose position ``i + 1`` was accepted, cumulative), in the steady
    state."""
    acceptance = steady(acceptance)
    if k > len(acceptance):
        raise ValueError(f"acceptance was measured at {len(acceptance)} positions, not {k}")
    return 1.0 + sum(acceptance[:k])


def _emissions(acceptance: Sequence[float], k: int) -> list[tuple[int, float]]:
    """A step drafting ``k`` emits ``j + 1`` tokens with probability ``r_j - r_{j+1}``
    (``r_0 = 1``, ``r_{k+1} = 0``)."""
    if k > len(acceptance):
        raise ValueError(f"acceptance was measured at {len(acceptance)} positions, not {k}")
    r = [1.0, *acceptance[:k], 0.0]
    return [(j + 1, r[j] - r[j + 1]) for j in range(k + 1)]


def decode_steps(acceptance: Acceptance, k: int, tokens: int, start: int = 1) -> float:
    """The expected steps drafting ``k`` takes to emit ``tokens`` tokens, the request
    having ``start`` output tokens before the first (its prefill's): each step emits
    what :func:`_emissions` says for the request's point in its reply, and the last step
    no more than are left."""
    phased = acceptance if isinstance(acceptance, Phased) else Phased(tuple(acceptance), tuple(acceptance), 0)
    early, late = _emissions(phased.early, k), _emissions(phased.late, k)
    steps = [0.0] * (tokens + 1)  # steps[n]: the expected steps to emit the last n tokens
    for n in range(1, tokens + 1):
        emit = early if start + tokens - n < phased.switch else late
        steps[n] = 1.0 + sum(p * steps[max(n - e, 0)] for e, p in emit)
    return steps[tokens]


def group_steps(acceptance: Acceptance, k: int, groups: Sequence[Sequence[int]]) -> float:
    """Expected decode steps drafting ``k`` for groups of requests run together (their
    output lengths): each group until its longest request ends (expected steps grow
    with the tokens to emit, so the longest request's count is the group's)."""
    return sum(decode_steps(acceptance, k, max(g) - 1) for g in groups)


def speedup(acceptance: Acceptance, costs: StepCosts, k: int, groups: Sequence[Sequence[int]] | None = None,
            tail: float = 1.0) -> float:
    """The projected speedup over plain decoding of drafting ``k`` tokens every step, for
    groups of requests run together (each group's output lengths; it runs until its
    longest ends), or in the steady state without ``groups``. ``tail``: how many more
    decode steps a batch took than the expected count, measured (requests accept at
    different rates, and a group waits for its slowest)."""
    if k == 0:
        return 1.0
    step = costs.verify[k] + k * costs.draft_forward + costs.host
    if not groups:
        return expected_tokens(acceptance, k) / step
    plain = sum(costs.prefill + max(g) - 1 for g in groups)
    drafting = sum(costs.prefill + costs.reading for _ in groups) + tail * group_steps(acceptance, k, groups) * step
    return plain / drafting


def at_length(acceptance: Acceptance, costs: StepCosts, k: int, batch: int, tokens: int,
              tail: float = 1.0) -> float:
    """:func:`speedup` for one group of ``batch`` requests of ``tokens`` output tokens each."""
    return speedup(acceptance, costs, k, [[tokens] * batch], tail)


def best(acceptance: Acceptance, costs: StepCosts, groups: Sequence[Sequence[int]] | None = None,
         tail: float = 1.0) -> Projection:
    """The draft length the measured costs favour (0, plain, when none pays), as the
    adaptive budget would settle on it."""
    by_k = {0: 1.0}
    for k in sorted(costs.verify):
        if 0 < k <= len(steady(acceptance)):
            by_k[k] = speedup(acceptance, costs, k, groups, tail)
    k = max(by_k, key=lambda n: by_k[n])
    return Projection(k, by_k[k], by_k)


def best_at_lengths(acceptance: Acceptance, costs: StepCosts, batch: int, lengths: Sequence[int],
                    tail: float = 1.0) -> Projection:
    """The draft length with the best geometric mean of the speedups at ``lengths``
    (output tokens per request, ``batch`` requests together): one config serves replies
    of every length, so it is chosen for the mix, and each length's speedup is reported."""
    def at(k: int, tokens: int) -> float:
        return at_length(acceptance, costs, k, batch, tokens, tail)

    by_k = {0: 1.0}
    for k in sorted(costs.verify):
        if 0 < k <= len(steady(acceptance)):
            by_k[k] = math.exp(sum(math.log(max(at(k, n), 1e-9)) for n in lengths) / len(lengths))
    k = max(by_k, key=lambda n: by_k[n])
    return Projection(k, by_k[k], by_k, {n: at(k, n) for n in lengths})
