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

from vllm_hetero_spec.host_to_device import to_device

# vLLM's own threshold (``SamplingParams``): a temperature below it is greedy.
GREEDY_EPS = 1e-5

# Below this share of the vocabulary a partial top-k beats a full sort comfortably.
_TOP_K_SHARE = 0.125


@dataclass
class SamplingRows:
    """Per-row sampling settings for a batch of draft positions, on the device, with
    the host-side facts that choose the code path.

    Attributes:
        temperature: ``[B]`` float; below :data:`GREEDY_EPS` means greedy.
        top_k: ``[B]`` int; <= 0 means off.
        top_p: ``[B]`` float; >= 1 means off.
        generators: per row its own random stream (a seeded request), or ``None``: the
            row draws from ``shared`` with the other unseeded rows, in one launch.
        host: the settings as host lists ``(temperature, top_k, top_p)``.
        shared: the unseeded rows' stream (``None``: torch's global one, for tests).
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    generators: list[torch.Generator | None]
    host: tuple[list[float], list[int], list[float]]
    shared: torch.Generator | None = None

    @classmethod
    def build(
        cls, temperature: list[float], top_k: list[int], top_p: list[float],
        generators: list[torch.Generator | None], device: torch.device, shared: torch.Generator | None = None,
    ) -> "SamplingRows":
        """The settings on ``device`` in one host-to-device copy (top-k travels as a
        float32, exact for any vocabulary size below 2**24)."""
        settings = to_device([temperature, top_k, top_p], torch.float32, device)
        return cls(
            settings.select(0, 0), settings.select(0, 1).long(), settings.select(0, 2), list(generators),
            (list(temperature), list(top_k), list(top_p)), shared,
        )

    def head(self, n: int) -> "SamplingRows":
        """The first ``n`` rows (views: no copy)."""
        temp, top_k, top_p = self.host
        return SamplingRows(
            self.temperature.narrow(0, 0, n), self.top_k.narrow(0, 0, n), self.top_p.narrow(0, 0, n),
            self.generators[:n], (temp[:n], top_k[:n], top_p[:n]), self.shared,
        )

    def select(self, rows: list[int]) -> "SamplingRows":
        """The settings of ``rows`` (repeats allowed), in that order."""
        temp, top_k, top_p = self.host
        return SamplingRows.build(
            [temp[r] for r in rows], [top_k[r] for r in rows], [top_p[r] for r in rows],
            [self.generators[r] for r in rows], self.temperature.device, self.shared,
        )

    def generator(self, row: int) -> torch.Generator | None:
        """The stream row ``row`` draws from."""
        own = self.generators[row]
        return own if own is not None else self.shared

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
        scaled = _top_k_top_p(scaled, rows)
    probs = scaled.softmax(dim=-1)
    if rows.any_greedy:
        onehot = torch.zeros_like(probs).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy.unsqueeze(1), onehot, probs)
    return probs


def _top_k_top_p(scaled: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
    """``scaled`` ``[B, V]`` with -inf outside each row's top-k, then outside the
    smallest prefix of those whose mass reaches top-p (the top token always stays).

    When every sampling row has a top-k (greedy rows count as top-1: they become one-hot
    anyway) and the largest is a small share of the vocabulary, only the top-k slice is
    ranked (one partial top-k instead of a sort of the vocabulary, the drafter's largest
    cost at T > 0 with top-k set); otherwise the whole row is sorted.

    Not ``verify/top_k_top_p.py``: that one reproduces vLLM's masks on the target exactly
    (boundary ties included) and may sync with the host to check them; q only has to be
    the distribution the drafter samples from, and a draft step must not sync."""
    vocab = scaled.shape[1]
    temp, top_k, _ = rows.host
    ks = [1 if t < GREEDY_EPS else k for t, k in zip(temp, top_k)]
    if min(ks) > 0 and max(ks) <= _TOP_K_SHARE * vocab:
        ranked, order = scaled.topk(max(ks), dim=-1)  # [B, k_max], descending
        k = torch.where(rows.greedy, torch.ones_like(rows.top_k), rows.top_k)
    else:
        ranked, order = scaled.sort(dim=-1, descending=True)
        k = torch.where(rows.top_k > 0, rows.top_k, torch.full_like(rows.top_k, vocab))
    rank = torch.arange(ranked.shape[1], device=scaled.device).unsqueeze(0)
    drop = rank >= k.unsqueeze(1)
    probs = ranked.masked_fill(drop, float("-inf")).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    drop = (drop | (mass_before >= rows.top_p.unsqueeze(1))) & (rank > 0)
    return torch.full_like(scaled, float("-inf")).scatter_(1, order, ranked.masked_fill(drop, float("-inf")))


def sample(probs: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
    """One token per row from ``probs`` ``[B, V]`` by the exponential race: the noise of
    every row is drawn in one launch from the shared stream, then a seeded row's is
    redrawn from its own generator (one launch per seeded row, as vLLM's sampler does).
    A batch of seeded rows only skips the shared launch: it drew vocabulary-wide noise
    that every row then overwrote, a visible share of a seeded batch's drafting time
    (docs/drafter.md, "What is ours, and why": Evidence). An all-greedy batch
    (one-hot rows) draws nothing."""
    if rows.all_greedy:
        return probs.argmax(dim=-1)
    noise = torch.empty_like(probs)
    if any(gen is None for gen in rows.generators):
        noise.exponential_(generator=rows.shared)
    for i, gen in enumerate(rows.generators):
        if gen is not None:
            noise.select(0, i).exponential_(generator=gen)
    return (probs / noise).argmax(dim=-1)
