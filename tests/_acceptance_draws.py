"""A step's verdicts drawn from a known acceptance, shared by the policy tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def accepted_of(rng: np.random.Generator, alpha: Sequence[float] | np.ndarray, k: int) -> int:
    """How many of k proposals the target accepts, drawn from conditional acceptance ``alpha``."""
    n = 0
    while n < k and rng.random() < alpha[n]:
        n += 1
    return n
