"""Draft-side sampling that also returns the exact distribution it sampled from.

For lossless rejection sampling (TLI) the verifier must receive q exactly as the token
was drawn: same mask, same temperature, same top-k/top-p. So this module turns logits
into that processed distribution once and samples from the same tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GREEDY_EPS = 1e-5


@dataclass
class SamplingRows:
    """Per-row sampling settings for a batch of draft positions."""

    temperature: torch.Tensor  # [B] float; <= GREEDY_EPS means greedy
    top_k: torch.Tensor  # [B] int; <= 0 means off
    top_p: torch.Tensor  # [B] float; >= 1 means off
    generators: list[torch.Generator | None]

    @property
    def greedy(self) -> torch.Tensor:
        return self.temperature <= GREEDY_EPS


def processed_probs(logits: torch.Tensor, rows: SamplingRows, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Probabilities ``[B, V]`` after masking to ``allowed`` (``[V]`` bool), temperature,
    top-k and top-p; one-hot at the argmax for greedy rows."""
    logits = logits.float()
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    greedy = rows.greedy
    temp = torch.where(greedy, torch.ones_like(rows.temperature), rows.temperature)
    logits = logits / temp.unsqueeze(1)
    if bool(((rows.top_k > 0) | (rows.top_p < 1)).any()):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        rank = torch.arange(logits.shape[1]).unsqueeze(0)
        k = torch.where(rows.top_k > 0, rows.top_k, torch.full_like(rows.top_k, logits.shape[1]))
        drop = rank >= k.unsqueeze(1)
        sorted_probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the top token always stays).
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop |= mass_before >= rows.top_p.unsqueeze(1)
        drop[:, 0] = False
        logits = logits.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = logits.softmax(dim=-1)
    if bool(greedy.any()):
        onehot = torch.zeros_like(probs).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy.unsqueeze(1), onehot, probs)
    return probs


def sample(probs: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
    """One token per row from ``probs`` ``[B, V]``, by the exponential race so that a
    whole batch samples in one pass; seeded rows draw their noise from their generator."""
    noise = torch.empty_like(probs)
    for i, gen in enumerate(rows.generators):
        noise[i].exponential_(generator=gen)
    return (probs / noise).argmax(dim=-1)
