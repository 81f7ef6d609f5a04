"""The projected speedup of speculative decoding from a step's measured parts.

A plain decoding step costs 1 (the unit). A speculative step that drafts ``k`` tokens
costs ``v(k)`` -- the target at ``k + 1`` positions per request, the rejection sampler,
bookkeeping -- plus ``k * f`` draft forwards of ``c`` each (``f``: forwards per drafted
position, above 1 for the string-level rules' re-tokenized drafts) and ``h``, the
bridge and the proposer's host work. It emits ``E(k) = 1 + r_1 + ... + r_k`` tokens per
request, ``r_i`` the share of steps whose position ``i`` was accepted (vLLM's
per-position counters are cumulative: position ``i`` counts only when ``1..i-1`` did).
A run's prefill costs the same either way, so with ``p`` the prefill's share of a
plain run the speedup is ``1 / (p + (1 - p) * (v(k) + k f c + h) / E(k))``.

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
        draft_forward: ``c``: one draft forward for the whole batch.
        host: ``h``: per drafting step, the bridge and the proposer's host work.
        prefill_share: ``p``: the share of a plain run spent outside decode steps.
    """

    verify: dict[int, float]
    draft_forward: float
    host: float = 0.0
    prefill_share: float = 0.0


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


def speedup(acceptance: Sequence[float], costs: StepCosts, k: int, forwards_per_position: float = 1.0) -> float:
    """The projected speedup over plain decoding of drafting ``k`` tokens every step."""
    if k == 0:
        return 1.0
    step = costs.verify[k] + k * forwards_per_position * costs.draft_forward + costs.host
    decode = step / expected_tokens(acceptance, k)
    return 1.0 / (costs.prefill_share + (1.0 - costs.prefill_share) * decode)


def best(acceptance: Sequence[float], costs: StepCosts, forwards_per_position: float = 1.0) -> Projection:
    """The draft length the measured costs favour (0, plain, when none pays), as the
    adaptive budget would settle on it."""
    by_k = {0: 1.0}
    for k in sorted(costs.verify):
        if 0 < k <= len(acceptance):
            by_k[k] = speedup(acceptance, costs, k, forwards_per_position)
    k = max(by_k, key=lambda n: by_k[n])
    return Projection(k, by_k[k], by_k)
