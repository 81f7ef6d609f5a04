"""Conditional acceptance per draft position, learned from the steps that drafted it.

a_j is the probability that proposal j is accepted given proposals 1..j-1 were. A step
that drafted k for a request and saw m accepted shows m acceptances and, when m < k, one
rejection at m + 1; positions past that were never judged.

Why the counts age by *verdicts*, not by steps: a position's estimate may only move on
evidence about it. When every count faded each step, a position the budget had stopped
drafting (k = 3 and 4 on the 1.5B target, where they pay less than k = 2) drifted back to
the optimistic prior within a few dozen steps, so the budget paid to draft it again, saw
it lose again, and so on. So a position's counts fade (``memory``) only in the steps that
judged it, and keep what they learnt otherwise.

A request's own counts are different: they say how far it strays from the overall
estimate, and only for a while (a reply moves between prose and code), so they age by
steps, ``memory`` each. Aged by verdicts, one unlucky run of rejections at a request's
start made the budget stop drafting for it, which left it no way to show otherwise.

Evidence still goes stale: the prompt mix or the drafter may have changed since. So
every count also fades slowly with time (``stale_memory``, about 500 steps). That barely
moves the estimate -- accepted and tried counts shrink together -- but it shrinks the
evidence behind it, which widens the bounds of :meth:`PositionAcceptance.estimate`:
a position left alone long enough becomes worth one more look, and the budget decides
whether that look is affordable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np


class PositionAcceptance:
    """Per rule (``""`` when the engine has one), overall and per request: accepted and
    tried counts per position. A request's estimate is its own counts shrunk towards the
    overall one by ``request_weight`` pseudo-verdicts; a position with few verdicts
    leans on the one before it (conditional acceptance rarely drops with depth), the
    first on ``prior`` -- or, where ``kin`` names a related rule with verdicts of its own,
    each position on that rule's estimate there. A sampled row's rule is learnt apart from
    the same rule's greedy rows (``budget.sampled_label``); leaning on the flat prior, its
    first sampled steps valued positions 3 and 4 at 0.5 where the greedy rows had shown
    far less, and drafted k = 3-4."""

    def __init__(self, positions: int, *, memory: float = 0.97, stale_memory: float = 1 - 1 / 500,
                 request_weight: float = 4.0, prior: float = 0.5, prior_weight: float = 4.0, optimism: float = 1.0,
                 kin: Callable[[str], str | None] = lambda rule: None):
        self.positions = positions
        self.memory = memory
        self.stale_memory = stale_memory
        self.request_weight = request_weight
        self.prior = prior
        self.prior_weight = prior_weight
        self.optimism = optimism
        self.kin = kin
        self.step = 0
        # per rule: (accepted, tried), [positions] each, decayed to ``self.step``
        self.overall: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        # per request, per rule: (accepted, tried, the step they were last decayed to)
        self.per_request: dict[str, dict[str, tuple[np.ndarray, np.ndarray, int]]] = {}
        # per rule: its overall estimate as of ``self.step`` (every row of a plan reads it)
        self._overall_estimates: dict[str, np.ndarray] = {}

    def add_step(self, verdicts: Iterable[tuple[str, str, int, int]]) -> None:
        """One step's verdicts: (request, rule, proposals k, accepted m) per drafting row."""
        self.step += 1
        self._overall_estimates.clear()
        for acc, tri in self.overall.values():
            acc *= self.stale_memory
            tri *= self.stale_memory
        rows = [(req_id, rule, *self._shown(k, m)) for req_id, rule, k, m in verdicts if k > 0]
        judged: dict[str, np.ndarray] = {}
        for _, rule, _, seen in rows:
            judged[rule] = np.maximum(judged.get(rule, 0.0), seen)
        for rule, mask in judged.items():
            acc, tri = self._overall(rule)
            fade = np.where(mask > 0, self.memory, 1.0)
            acc *= fade
            tri *= fade
        for req_id, rule, won, seen in rows:
            acc, tri = self._overall(rule)
            acc += won
            tri += seen
            acc, tri = self._request_counts(req_id, rule)
            self.per_request.setdefault(req_id, {})[rule] = (acc + won, tri + seen, self.step)

    def estimate(self, req_id: str | None = None, rule: str = "", side: int = 0) -> np.ndarray:
        """a_j per position, overall or for one request. ``side`` +1 or -1: its upper or
        lower bound, ``optimism`` standard errors away, wide where verdicts are few or
        stale (a request's own counts the evidence, with its ``request_weight``)."""
        overall = self._overall_estimate(rule)
        if req_id is None or rule not in self.per_request.get(req_id, {}):
            tried = self.overall[rule][1] if rule in self.overall else np.zeros(self.positions)
            return self._bound(overall, tried + self.prior_weight, side)
        acc, tri = self._request_counts(req_id, rule)
        own = (acc + self.request_weight * overall) / (tri + self.request_weight)
        return self._bound(own, tri + self.request_weight, side)

    def _overall_estimate(self, rule: str) -> np.ndarray:
        """a_j per position over every request under ``rule``, each shrunk towards its
        prior (the position before, or ``kin``'s estimate there); computed once per step,
        as every row of a plan asks for it and the counts move only in :meth:`add_step`."""
        if rule in self._overall_estimates:
            return self._overall_estimates[rule]
        accepted, tried = self.overall.get(rule, (np.zeros(self.positions), np.zeros(self.positions)))
        kin = self.kin(rule)
        priors = self._overall_estimate(kin) if kin is not None and kin in self.overall else None
        overall = np.empty(self.positions)
        prior = self.prior
        for j in range(self.positions):
            prior = prior if priors is None else priors[j]
            overall[j] = prior = (accepted[j] + self.prior_weight * prior) / (tried[j] + self.prior_weight)
        overall.flags.writeable = False  # shared by every caller this step
        self._overall_estimates[rule] = overall
        return overall

    def _bound(self, p: np.ndarray, n: np.ndarray, side: int) -> np.ndarray:
        """``p`` moved ``side`` x ``optimism`` standard errors of a rate seen ``n`` times."""
        if not side:
            return p
        return np.clip(p + side * self.optimism * np.sqrt(p * (1.0 - p) / n), 0.0, 1.0)

    def forget(self, req_id: str) -> None:
        """A finished, aborted or preempted request."""
        self.per_request.pop(req_id, None)

    def _shown(self, k: int, accepted: int) -> tuple[np.ndarray, np.ndarray]:
        """(won, seen) masks of the positions a step's verdict shows."""
        accepted = min(accepted, k)
        won = np.zeros(self.positions)
        won[:accepted] = 1.0
        seen = np.zeros(self.positions)
        seen[: min(accepted + 1, k)] = 1.0
        return won, seen

    def _overall(self, rule: str) -> tuple[np.ndarray, np.ndarray]:
        """The counts of every request under ``rule`` (updated in place)."""
        if rule not in self.overall:
            self.overall[rule] = (np.zeros(self.positions), np.zeros(self.positions))
        return self.overall[rule]

    def _request_counts(self, req_id: str, rule: str) -> tuple[np.ndarray, np.ndarray]:
        """A request's counts under ``rule``, aged to now by ``memory`` per step."""
        if rule not in self.per_request.get(req_id, {}):
            return np.zeros(self.positions), np.zeros(self.positions)
        acc, tri, at = self.per_request[req_id][rule]
        age = self.memory ** (self.step - at)
        return acc * age, tri * age
