"""How many more tokens a request in flight will emit, learnt from the replies that ended.

The draft budget spreads a draft state's catch-up (a new request's prompt, or what a
request emitted while it drafted nothing) over the steps that will live on it. A fixed
guess of those steps is wrong both ways: a batch of 8 long replies that stayed at k = 0
for a while fell a token behind per row per step, and its catch-up, spread over a guess
far shorter than the replies still had to run, kept drafting from ever starting where it
paid; a batch of short replies is the opposite case. What the engine's own traffic shows
is the better guess: of the replies that ended, those longer than what a request has
emitted so far say how much further it goes.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class ReplyLengths:
    """The lengths (output tokens) of the last ``keep`` replies that ended, and each request's
    output so far. A request dropped by the engine (finished, aborted or preempted) counts as
    ended; a preempted one that resumes starts counting again, so it only looks young."""

    def __init__(self, keep: int = 64, least: int = 4):
        self.least = least  # replies longer than a request's output needed to project it
        self.ended: deque[int] = deque(maxlen=keep)
        self.emitted: dict[str, int] = {}  # per request in flight: output tokens so far

    def add(self, req_ids: list[str], sampled: list[int]) -> None:
        """One step's output: ``sampled[i]`` tokens for ``req_ids[i]``."""
        for req_id, n in zip(req_ids, sampled):
            if n > 0:
                self.emitted[req_id] = self.emitted.get(req_id, 0) + n

    def end(self, req_id: str) -> None:
        """A request left the engine; its output so far is a reply's length."""
        n = self.emitted.pop(req_id, 0)
        if n > 0:
            self.ended.append(n)

    def to_go(self, req_ids: list[str]) -> list[float | None]:
        """Per request, the mean of what the ended replies longer than its output so far
        ran beyond it (the tokens it can expect to emit still); ``None`` where fewer than
        ``least`` such replies are known."""
        if len(self.ended) < self.least:
            return [None] * len(req_ids)
        ended = np.fromiter(self.ended, dtype=np.float64)  # [replies]
        beyond = ended[None, :] - np.array([self.emitted.get(r, 0) for r in req_ids], dtype=np.float64)[:, None]
        longer = beyond > 0  # [rows, replies]
        count = longer.sum(1)
        mean = np.where(longer, beyond, 0.0).sum(1) / np.maximum(count, 1)
        return [float(m) if c >= self.least else None for m, c in zip(mean, count)]
