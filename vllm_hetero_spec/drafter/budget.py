"""Hardware-aware draft budget (DuoDecoding): as many draft tokens as fit in a target step.

With the drafter on its own cores, a step costs max(target step, drafting): drafting
less than fits leaves acceptance on the table, drafting more makes the target wait.
So k = floor(target step time / drafter time per token), kept within
[min_tokens, max_tokens] and re-evaluated every step from exponential moving averages,
so it follows load (batch size, context length, a noisy neighbour) as it changes.
"""

from __future__ import annotations

import math


class DraftBudget:
    """Online estimate of the number of draft tokens per step."""

    def __init__(self, min_tokens: int, max_tokens: int, smoothing: float = 0.3):
        if not 1 <= min_tokens <= max_tokens:
            raise ValueError(f"need 1 <= min_tokens <= max_tokens, got {min_tokens}, {max_tokens}")
        self.min_tokens = min_tokens
        self.max_tokens = max_tokens
        self.smoothing = smoothing
        self.target_s: float | None = None
        self.token_s: float | None = None

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.smoothing) * old + self.smoothing * new

    def observe_target(self, seconds: float) -> None:
        """One target step's wall time (verification, sampling, scheduling)."""
        if seconds > 0:
            self.target_s = self._ema(self.target_s, seconds)

    def observe_draft(self, seconds: float, forwards: int) -> None:
        """Drafter time spent on ``forwards`` sequential draft forwards (one token each
        for every request of the batch)."""
        if forwards > 0 and seconds > 0:
            self.token_s = self._ema(self.token_s, seconds / forwards)

    @property
    def tokens(self) -> int:
        """The budget for the next step (the maximum until both times are known)."""
        if self.target_s is None or self.token_s is None:
            return self.max_tokens
        fit = math.floor(self.target_s / self.token_s + 1e-9)  # 0.3 / 0.1 is 2.999...
        return max(self.min_tokens, min(self.max_tokens, fit))
