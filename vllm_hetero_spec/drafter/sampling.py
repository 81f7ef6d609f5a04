"""Draft-side sampling that also returns the exact distribution it sampled from.

For lossless rejection sampling (TLI) the verifier must receive q exactly as the token
was drawn: same mask, same temperature, same top-k/top-p. So this module turns logits
into that processed distribution once and samples from the same tensor.

Everything runs on the logits' device. Which code path a batch takes (any greedy row,
any top-k/top-p) is decided from the requests' settings on the host, never by reading a
device tensor back, so a draft step needs no host sync here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# vLLM's own threshold (``SamplingParams``): a temperature below it is greedy.
GREEDY_EPS = 1e-5


@dataclass
class SamplingRows:
    """Per-row sampling settings for a batch of draft positions, on the device, with
    the host-side facts that choose the code path.

    Attributes:
        temperature: ``[B]`` float; below :data:`GREEDY_EPS` means greedy.
        top_k: ``[B]`` int; <= 0 means off.
        top_p: ``[B]`` float; >= 1 means off.
        generators: per row its random stream (``None``: the global one).
        host: the settings as host lists ``(temperature, top_k, top_p)``.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    generators: list[torch.Generator | None]
    host: tuple[list[float], list[int], list[float]]

    @classmethod
    def build(
        cls, temperature: list[float], top_k: list[int], top_p: list[float],
        generators: list[torch.Generator | None], device: torch.device,
    ) -> "SamplingRows":
        return cls(
            torch.tensor(temperature, dtype=torch.float32, device=device),
            torch.tensor(top_k, dtype=torch.long, device=device),
            torch.tensor(top_p, dtype=torch.float32, device=device),
            list(generators),
            (list(temperature), list(top_k), list(top_p)),
        )

    def select(self, rows: list[int]) -> "SamplingRows":
        """The settings of ``rows`` (repeats allowed), in that order."""
        temp, top_k, top_p = self.host
        return SamplingRows.build(
            [temp[r] for r in rows], [top_k[r] for r in rows], [top_p[r] for r in rows],
            [self.generators[r] for r in rows], self.temperature.device,
        )

    @property
    def greedy(self) -> torch.Tensor:
        return self.temperature < GREEDY_EPS

    @property
    def any_greedy(self) -> bool:
        return any(t < GREEDY_EPS for t in self.host[0])

    @property
    def all_greedy(self) -> bool:
        return all(t < GREEDY_EPS for t in self.host[0])

    @property
    def any_filter(self) -> bool:
        """Some sampling row uses top-k or top-p."""
        temp, top_k, top_p = self.host
        return any(t >= GREEDY_EPS and (k > 0 or p < 1) for t, k, p in zip(temp, top_k, top_p))


def processed_probs(logits: torch.Tensor, rows: SamplingRows, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Probabilities ``[B, V]`` after masking to ``allowed`` (``[V]`` bool), temperature,
    top-k and top-p; one-hot at the argmax for greedy rows."""
    logits = logits.float()
    if allowed is not None:
        logits = logits.masked_fill(allowed.logical_not(), float("-inf"))
    if rows.all_greedy:
        return torch.zeros_like(logits).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
    greedy = rows.greedy
    temp = torch.where(greedy, torch.ones_like(rows.temperature), rows.temperature)
    scaled = logits / temp.unsqueeze(1)
    if rows.any_filter:
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        rank = torch.arange(scaled.shape[1], device=scaled.device).unsqueeze(0)
        k = torch.where(rows.top_k > 0, rows.top_k, torch.full_like(rows.top_k, scaled.shape[1]))
        drop = rank >= k.unsqueeze(1)
        sorted_probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the top token always stays).
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop = (drop | (mass_before >= rows.top_p.unsqueeze(1))) & (rank > 0)
        scaled = scaled.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = scaled.softmax(dim=-1)
    if rows.any_greedy:
        onehot = torch.zeros_like(probs).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy.unsqueeze(1), onehot, probs)
    return probs


def sample(probs: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
    """One token per row from ``probs`` ``[B, V]`` by the exponential race, each row's
    noise from its own generator; an all-greedy batch (one-hot rows) draws nothing."""
    if rows.all_greedy:
        return probs.argmax(dim=-1)
    noise = torch.empty_like(probs)
    for i, gen in enumerate(rows.generators):
        noise.select(0, i).exponential_(generator=gen)
    return (probs / noise).argmax(dim=-1)
