"""Each proposal step's timing, and the one test of which steps time verification alone.

The proposer runs once per engine step, between two verifications, so the time from the
end of one proposal to the start of the next is the target's step (its forward over the
rows and the drafts proposed, the rejection sampler, vLLM's bookkeeping), and a
proposal's own span is the drafting. A step is *steady* (:func:`is_steady`) when that time
is the cost of verifying what the last proposal sent, the figure both the draft budget
(``budget.py``) and ``advise`` fit. Every proposal is one engine step, so the log also
counts the steps a run took, and what each row accepted of the drafts it was sent, at
which point of its output: acceptance rises along a reply (the drafter has more of it to
go on), so a short sample's acceptance alone would project long replies low.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass


def is_steady(req_ids: Sequence[str], last_ids: Sequence[str], sampled: Sequence[int]) -> bool:
    """Whether the step that just ran for ``req_ids`` (``sampled[i]`` tokens out for row
    ``i``, 0 while it is still prefilling), after a proposal for ``last_ids``, timed
    verification alone: nobody joined (a newcomer's prefill would pass for verification
    cost) and nobody is prefilling; a request may have finished in it."""
    return set(req_ids) <= set(last_ids) and all(s > 0 for s in sampled)


@dataclass(frozen=True)
class StepTiming:
    """One step. ``tokens``: the positions the target verified (the rows plus the drafts
    the previous proposal sent); ``verified``: per row that was sent drafts, its output
    tokens before the step, the drafts it was sent and how many of them it accepted."""

    rows: int
    tokens: int
    target_s: float
    propose_s: float
    steady: bool
    verified: tuple[tuple[int, int, int], ...] = ()


class StepLog:
    """Collects :class:`StepTiming` records; the proposer calls :meth:`add` once a step
    while ``advise`` measures (``advise/probe.py``)."""

    def __init__(self) -> None:
        self.steps: list[StepTiming] = []
        self._last: tuple[dict[str, int], float] | None = None  # drafts sent per req id, end
        self._emitted: dict[str, int] = {}  # output tokens per request so far

    def add(self, start: float, end: float, req_ids: list[str], sampled: list[int], proposed: list[int]) -> None:
        """A proposal that ran from ``start`` to ``end`` for ``req_ids``, after the
        target sampled ``sampled[i]`` tokens for row ``i`` (0: still prefilling; one
        more than it accepted of the drafts it was sent), and sent ``proposed[i]``
        drafts."""
        if self._last is None:  # the first since a clear: its target step was not seen
            self.steps.append(StepTiming(len(req_ids), 0, 0.0, end - start, False))
        else:
            sent, last_end = self._last
            verified = tuple((self._emitted.get(r, 0), sent[r], min(n - 1, sent[r]))
                             for r, n in zip(req_ids, sampled) if sent.get(r, 0) > 0 and n > 0)
            self.steps.append(StepTiming(len(req_ids), len(sent) + sum(sent.values()), start - last_end,
                                         end - start, is_steady(req_ids, list(sent), sampled), verified))
        for r, n in zip(req_ids, sampled):
            self._emitted[r] = self._emitted.get(r, 0) + n
        self._last = (dict(zip(req_ids, proposed)), end)

    def clear(self) -> None:
        self.steps.clear()
        self._last = None
        self._emitted.clear()

    def as_dicts(self) -> list[dict]:
        return [asdict(s) for s in self.steps]
