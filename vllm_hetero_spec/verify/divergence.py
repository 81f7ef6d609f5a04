"""Divergences between a target and a draft distribution, for fuzzy verification (fsd).

All take ``p`` (target) and ``q`` (draft) of the same shape ``[..., V]`` over the target
vocabulary and return ``[...]`` in nats. They are pure and batched: the sampler computes
one value per draft position of the whole block in one call.

- ``kl``: KL(p || q), +inf where q is 0 on a token p can emit (a draft that cannot
  produce what the target wants is never "close").
- ``js``: Jensen-Shannon, in [0, ln 2]; symmetric and always finite (the default).
- ``tv``: total variation, in [0, 1].
- ``*_topk``: the same divergence between p and q conditioned on the union of the top-k
  tokens of p and of q (zero-probability tokens never count as top-k). The long tail
  of a 150k vocabulary then cannot dominate a comparison of what either model would
  actually pick.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

Divergence = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) = sum p log(p / q), with 0 log 0 = 0 and +inf where q = 0 < p."""
    return (torch.xlogy(p, p) - torch.xlogy(p, q)).sum(dim=-1).clamp(min=0.0)


def js(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence: mean KL of p and q to their midpoint."""
    m = (p + q) / 2
    return (0.5 * (kl(p, m) + kl(q, m))).clamp(max=math.log(2.0))


def tv(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Total variation distance, half the L1 distance."""
    return 0.5 * (p - q).abs().sum(dim=-1)


def _top_mask(x: torch.Tensor, k: int) -> torch.Tensor:
    idx = x.topk(min(k, x.shape[-1]), dim=-1).indices
    return torch.zeros_like(x, dtype=torch.bool).scatter_(-1, idx, True) & (x > 0)


def restrict_to_topk(p: torch.Tensor, q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """p and q conditioned on the union of their top-k supports (each renormalized)."""
    keep = _top_mask(p, k) | _top_mask(q, k)
    p_s, q_s = p * keep, q * keep
    return p_s / p_s.sum(dim=-1, keepdim=True), q_s / q_s.sum(dim=-1, keepdim=True)


BASE: dict[str, Divergence] = {"js": js, "kl": kl, "tv": tv}
DIVERGENCE_NAMES: tuple[str, ...] = (*BASE, *(f"{name}_topk" for name in BASE))


def divergence(name: str, p: torch.Tensor, q: torch.Tensor, topk: int) -> torch.Tensor:
    """``name`` from :data:`DIVERGENCE_NAMES`; ``topk`` is used by the ``*_topk`` ones."""
    if name not in DIVERGENCE_NAMES:
        raise ValueError(f"unknown divergence {name!r}; choose one of {list(DIVERGENCE_NAMES)}")
    base = name.removesuffix("_topk")
    if base != name:
        p, q = restrict_to_topk(p, q, topk)
    return BASE[base](p, q)
