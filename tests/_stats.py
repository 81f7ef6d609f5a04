"""Statistical helpers shared by the tests and the GPU check (chi-square against a known law,
and between two samples)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch
from scipy.stats import chi2, chi2_contingency, chisquare

ALPHA = 1e-4


def follows_pvalue(tokens: torch.Tensor, p: torch.Tensor) -> float:
    """Chi-square p-value that ``tokens`` are draws from ``p`` (on p's support).

    Raises ``AssertionError`` if any token has probability 0 under ``p``: no amount of
    sampling noise explains that.
    """
    counts = torch.bincount(tokens, minlength=p.shape[0]).double()
    support = p > 0
    assert counts[~support].sum() == 0, "emitted a token the target gives probability 0"
    expected = p[support].double() / p[support].double().sum() * counts.sum()
    return float(chisquare(counts[support].numpy(), expected.numpy()).pvalue)


def assert_follows(tokens: torch.Tensor, p: torch.Tensor, alpha: float = ALPHA) -> None:
    pvalue = follows_pvalue(tokens, p)
    assert pvalue > alpha, f"distribution differs from target (p={pvalue:.2e})"


def conditional_pvalue(context: torch.Tensor, tokens: torch.Tensor, table: torch.Tensor, min_count: int = 100) -> float:
    """Pooled chi-square p-value that ``tokens[j] ~ table[context[j]]`` for every j.

    Contexts seen fewer than ``min_count`` times are left out, and within a context the
    cells expected fewer than 5 times are merged into one, so the chi-square
    approximation holds; the statistics of all contexts add up, as do their degrees of
    freedom.
    """
    n_ctx, v = table.shape
    counts = torch.bincount(context * v + tokens, minlength=n_ctx * v).view(n_ctx, v).double()
    support = table > 0
    assert counts[~support].sum() == 0, "emitted a token with probability 0 in its context"
    seen = counts.sum(1) >= min_count
    assert bool(seen.any()), "no context was seen often enough to test"
    counts = counts[seen]
    p = torch.where(support, table.double(), 0.0)[seen]
    expected = p / p.sum(1, keepdim=True) * counts.sum(1, keepdim=True)
    big = expected >= 5
    small = support[seen] & ~big
    merged_count = (counts * small).sum(1)
    merged_expected = (expected * small).sum(1)
    has_merged = merged_expected > 0
    stat = float(((counts - expected)[big] ** 2 / expected[big]).sum())
    stat += float(((merged_count - merged_expected)[has_merged] ** 2 / merged_expected[has_merged]).sum())
    dof = int(big.sum()) + int(has_merged.sum()) - int(seen.sum())
    assert dof > 0, "every tested context is deterministic"
    return float(chi2.sf(stat, dof))


def tv_from(tokens: torch.Tensor, p: torch.Tensor) -> float:
    """Total variation between the empirical law of ``tokens`` and ``p``."""
    freq = torch.bincount(tokens, minlength=p.shape[0]).double() / tokens.numel()
    return 0.5 * float((freq - p.double()).abs().sum())


def two_sample_pvalue(a: list[int], b: list[int]) -> float:
    """Two-sample chi-square homogeneity test of two token samples (tokens seen fewer
    than 10 times in both together pooled into one bin)."""
    ca, cb = Counter(a), Counter(b)
    pooled = ca + cb
    common = [t for t, c in pooled.items() if c >= 10]
    rows = [[ca[t] for t in common] + [sum(ca.values()) - sum(ca[t] for t in common)],
            [cb[t] for t in common] + [sum(cb.values()) - sum(cb[t] for t in common)]]
    table = np.array(rows)
    table = table[:, table.sum(0) > 0]
    return float(chi2_contingency(table)[1])
