"""Seeded requests: each token a function of the seed, its position and the target's law.

A seed is a promise of repeatable output. Speculative sampling cannot keep it as vLLM
keeps it for plain decoding (one generator per request, advanced every step): the
acceptance test reads the draft (its token and its q), and the number of draws per step
follows the draft length, so the same seed gave other tokens under another rule, another
draft length or another batch. Here a seeded request is verified by equality instead:

- the target's token at absolute position ``t`` (the index of the token in the
  sequence, prompt included) is vLLM's own seeded sample of the processed target law at
  ``t``, drawn by vLLM's sampler with a fresh generator seeded from ``(seed, t)``
  (:func:`position_seed`); the bonus token and undrafted steps are drawn the same way;
- a draft token is accepted while it equals that token, and the first mismatch emits it.

So the emitted sequence is the one plain decoding would produce with those per-position
generators, whatever was drafted, however long, in whatever batch: a function of
(seed, prompt, sampling parameters, target) only. Each token is an exact sample of the
target's law given the prefix, so this is lossless, like ``slem``'s rule. The price is
acceptance at T > 0: a proposal drawn from q is accepted with probability
sum_x q(x) p(x) instead of sum_x min(p(x), q(x)).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """One SplitMix64 output for state ``x``: consecutive positions map to unrelated seeds."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def position_seed(seed: int, position: int) -> int:
    """The generator seed of a request's token at ``position`` (63 bits: torch's range)."""
    return _splitmix64(_splitmix64(seed & _MASK64) ^ position) >> 1


def position_generators(
    rows: Sequence[int], seeds: Sequence[int], positions: Sequence[int], device: torch.device
) -> dict[int, torch.Generator]:
    """``{rows[i]: generator seeded for (seeds[i], positions[i])}`` on ``device``, the
    form vLLM's sampler takes (``SamplingMetadata.generators``)."""
    return {
        row: torch.Generator(device=device).manual_seed(position_seed(seed, pos))
        for row, seed, pos in zip(rows, seeds, positions)
    }
