"""Each proposal step's timing, as ``advise`` reads it from the proposer.

The proposer runs once per engine step, between two verifications, so the time from the
end of one proposal to the start of the next is the target's step (its forward over the
rows and the drafts proposed, the rejection sampler, vLLM's bookkeeping), and a
proposal's own span is the drafting. A step is *steady* when nobody joined the batch
and nobody is prefilling -- the same test as the draft budget's (``policy/budget.py``),
so a prefill never passes for the cost of verifying drafts. Every proposal is one
engine step, so the log also counts the steps a run took.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class StepTiming:
    """One step. ``tokens``: the positions the target verified (the rows plus the drafts
    the previous proposal sent); ``k``: the longest draft this proposal sent."""

    rows: int
    tokens: int
    k: int
    target_s: float
    propose_s: float
    steady: bool


class StepLog:
    """Collects :class:`StepTiming` records; the proposer calls :meth:`add` once a step."""

    def __init__(self) -> None:
        self.steps: list[StepTiming] = []
        self._last: tuple[list[str], int, float] | None = None  # req ids, drafts sent, end

    def add(self, start: float, end: float, req_ids: list[str], sampled: list[int], proposed: list[int]) -> None:
        """A proposal that ran from ``start`` to ``end`` for ``req_ids``, after the
        target sampled ``sampled[i]`` tokens for row ``i`` (0: still prefilling), and
        sent ``proposed[i]`` drafts."""
        k = max(proposed, default=0)
        if self._last is None:  # the first since a clear: its target step was not seen
            self.steps.append(StepTiming(len(req_ids), 0, k, 0.0, end - start, False))
        else:
            last_ids, drafted, last_end = self._last
            steady = set(req_ids) <= set(last_ids) and all(s > 0 for s in sampled)
            self.steps.append(StepTiming(len(req_ids), len(last_ids) + drafted, k, start - last_end, end - start,
                                         steady))
        self._last = (list(req_ids), sum(proposed), end)

    def clear(self) -> None:
        self.steps.clear()
        self._last = None

    def as_dicts(self) -> list[dict]:
        return [asdict(s) for s in self.steps]
