"""Small helpers the benchmark scripts share for their JSON and markdown reports."""

from __future__ import annotations

import statistics


def median(xs: list[float | None]) -> float | None:
    """Median of the measured values (runs that lack the figure are skipped)."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x: float | None, spec: str) -> str:
    """``x`` formatted for a table cell, ``-`` when not measured."""
    return "-" if x is None else format(x, spec)
