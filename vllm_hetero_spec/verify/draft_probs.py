"""Draft distributions q in compact form: rows over a small support, never dense over
the target vocabulary.

A drafted position's q is nonzero only where the drafter can propose: the target ids of
the vocabulary intersection for the token-level algorithms (``tli``, ``fsd``, ``union``:
one support shared by every row), the candidates of ``slrs``'s first token, or the one
proxy token of faithful ``dtw`` (a support per row). So a step's q is ``probs [R, S]``
over ``support`` instead of ``[B, K, V_target]``: for SmolLM2 -> Qwen2.5 the shared
support is about a third of the target vocabulary, and the per-row supports are a few
entries. Positions without a row (greedy rows, ``slrs``'s string-level tail, ``slem``)
are one-hot at their proposal, which is exactly how verification treats them.

The rule (``verify/rules.py``) reads q in two ways only: its value at the proposed
token, for every position, and the dense row at the one position per request where a
rejection is resolved (``fsd``'s divergence also needs dense rows). Both are computed on
the device from the compact form, without a host sync.

Invariant: each support row is sorted ascending; a per-row support is padded to the
common width by repeating its last id with probability 0, which keeps it sorted and
adds nothing when scattered.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_hetero_spec.host_to_device import to_device


@dataclass
class DraftProbs:
    """q rows of one step.

    Attributes:
        probs: ``[R, S]`` float32, row r is one drafted position's q on ``support``.
        support: ``[S]`` int64 target ids shared by every row, or ``[R, S]`` per row.
    """

    probs: torch.Tensor
    support: torch.Tensor

    @property
    def shared(self) -> bool:
        return self.support.dim() == 1

    @property
    def num_rows(self) -> int:
        return int(self.probs.shape[0])

    @property
    def nbytes(self) -> int:
        return self.probs.nbytes + self.support.nbytes

    def to(self, device: torch.device) -> "DraftProbs":
        return DraftProbs(self.probs.to(device), self.support.to(device))

    def at(self, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """``[N]`` q of row ``rows[n]`` at target id ``tokens[n]`` (0 off the support)."""
        if self.shared:
            col = torch.searchsorted(self.support, tokens).clamp(max=self.support.shape[0] - 1)
            hit = self.support.index_select(0, col) == tokens
            value = self.probs.reshape(-1).index_select(0, rows * self.probs.shape[1] + col)
        else:
            support = self.support.index_select(0, rows)
            col = torch.searchsorted(support, tokens.unsqueeze(1)).clamp(max=support.shape[1] - 1)
            hit = support.gather(1, col).squeeze(1) == tokens
            value = self.probs.index_select(0, rows).gather(1, col).squeeze(1)
        return torch.where(hit, value, torch.zeros_like(value))

    def dense(self, rows: torch.Tensor, vocab: int) -> torch.Tensor:
        """``[N, vocab]`` the rows ``rows`` over the whole target vocabulary."""
        out = self.probs.new_zeros(rows.shape[0], vocab)
        picked = self.probs.index_select(0, rows)
        if self.shared:
            return out.index_copy_(1, self.support, picked)
        return out.scatter_add_(1, self.support.index_select(0, rows), picked)

    def take(self, rows: list[int]) -> "DraftProbs":
        """The rows ``rows`` only, in that order."""
        index = to_device(rows, torch.long, self.probs.device)
        support = self.support if self.shared else self.support.index_select(0, index)
        return DraftProbs(self.probs.index_select(0, index), support)

    @staticmethod
    def cat(parts: list["DraftProbs"]) -> "DraftProbs":
        """The rows of ``parts`` one after the other: on their shared support when they
        all have the same one, else per row (a shared support repeated on each of its
        rows, as when ``auto`` mixes ``tli`` and ``slrs`` rows; narrower supports padded
        to the widest)."""
        first = parts[0]
        if all(p.shared and p.support is first.support for p in parts):
            return DraftProbs(torch.cat([p.probs for p in parts]), first.support)
        parts = [DraftProbs(p.probs, p.support.expand(p.num_rows, -1)) if p.shared else p for p in parts]
        width = max(p.probs.shape[1] for p in parts)
        probs, support = [], []
        for p in parts:
            pad = width - p.probs.shape[1]
            probs.append(torch.nn.functional.pad(p.probs, (0, pad)))
            support.append(torch.cat([p.support, p.support[:, -1:].expand(-1, pad)], dim=1))
        return DraftProbs(torch.cat(probs), torch.cat(support))
