"""Enough samples to see a 0.5% bias in the acceptance rule.

The statistical battery checks every rule against its law at a power that catches
gross mistakes; a subtly inflated acceptance ratio (accept with min(1, 1.005 p/q))
moves the emitted law by about 0.25% here and passes it. Two million verified
positions in one batched call make that bias a 10-sigma event, at a false-alarm rate of
1e-4 for the exact rule.
"""

from __future__ import annotations

import pytest
import torch
from _stats import assert_follows
from scipy.stats import norm

from vllm_hetero_spec.verify.rules import verify_block

N = 2_000_000
P = torch.tensor([0.5, 0.3, 0.2])  # the target
Q = torch.tensor([0.6, 0.25, 0.15])  # the drafter: p < q on the likeliest token


@pytest.mark.slow
def test_a_half_percent_bias_in_acceptance_is_visible() -> None:
    gen = torch.Generator().manual_seed(2024)
    draft = torch.multinomial(Q, N, replacement=True, generator=gen).unsqueeze(1)
    uniform = torch.rand(N, 1, generator=gen, dtype=torch.float64)
    noise = torch.empty(N, 3).exponential_(generator=gen)
    out = verify_block(
        draft, torch.ones(N, dtype=torch.long), P.expand(N, 1, 3), Q.expand(N, 1, 3),
        torch.zeros(N, dtype=torch.long), torch.zeros(N, dtype=torch.bool), uniform, noise,
    )
    # The acceptance rate is sum(min(p, q)) exactly; its z-score at this N.
    alpha = float(torch.minimum(P, Q).sum())
    accepted = float((out[:, 0] == draft[:, 0]).double().mean())
    z = (accepted - alpha) / (alpha * (1 - alpha) / N) ** 0.5
    assert abs(z) < norm.isf(0.5e-4), f"acceptance rate {accepted:.5f} vs {alpha:.5f} (z = {z:.1f})"
    assert_follows(out[:, 0], P)
