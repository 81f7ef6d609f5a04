"""The token-level intersection (TLI) of two vocabularies.

Two tokens are "the same" when they stand for the same bytes. A draft token whose bytes
are also one target token can be proposed to the target directly; every other draft
token is masked out before the drafter samples (the TLI paper's Algorithm 2), or, for the
union baseline, proposed and rejected.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VocabIntersection:
    """Id maps between a draft and a target vocabulary restricted to shared byte strings.

    Attributes:
        draft_to_target: ``[draft_vocab]`` int64, the target id of each draft id, -1 if
            the draft token's bytes are not a single target token.
        draft_mask: ``[draft_vocab]`` bool, True where ``draft_to_target >= 0``.
        shared_draft_ids / shared_target_ids: the pairs, aligned, for scatter/gather.
        support: ``[S]`` the distinct shared target ids, sorted: where a q carried onto
            the target vocabulary can be nonzero (``verify/draft_probs.py``).
        support_col: ``[len(shared_draft_ids)]`` each pair's column in ``support``.
    """

    draft_to_target: torch.Tensor
    draft_mask: torch.Tensor
    shared_draft_ids: torch.Tensor
    shared_target_ids: torch.Tensor
    support: torch.Tensor
    support_col: torch.Tensor
    target_vocab_size: int

    def to(self, device: torch.device) -> "VocabIntersection":
        """The same maps on ``device`` (the drafter's), so mapping needs no transfer."""
        return dataclasses.replace(
            self,
            draft_to_target=self.draft_to_target.to(device),
            draft_mask=self.draft_mask.to(device),
            shared_draft_ids=self.shared_draft_ids.to(device),
            shared_target_ids=self.shared_target_ids.to(device),
            support=self.support.to(device),
            support_col=self.support_col.to(device),
        )

    @property
    def size(self) -> int:
        return int(self.shared_draft_ids.numel())

    @classmethod
    def build(cls, draft_bytes: list[bytes | None], target_bytes: list[bytes | None]) -> "VocabIntersection":
        """Match tokens by exact bytes. Empty strings and special tokens never match.

        When a tokenizer has two ids for the same bytes (rare, e.g. duplicated added
        tokens), the lowest target id wins so the map stays a function.
        """
        by_bytes: dict[bytes, int] = {}
        for tid, b in enumerate(target_bytes):
            if b and b not in by_bytes:
                by_bytes[b] = tid
        d2t = torch.full((len(draft_bytes),), -1, dtype=torch.int64)
        for did, b in enumerate(draft_bytes):
            if b:
                tid = by_bytes.get(b)
                if tid is not None:
                    d2t[did] = tid
        mask = d2t >= 0
        shared_draft = torch.nonzero(mask).flatten()
        shared_target = d2t[shared_draft]
        support, support_col = torch.unique(shared_target, sorted=True, return_inverse=True)
        return cls(d2t, mask, shared_draft, shared_target, support, support_col, len(target_bytes))

    def to_support_probs(self, draft_probs: torch.Tensor) -> torch.Tensor:
        """Carry ``[..., draft_vocab]`` probabilities onto ``[..., S]``, the probability
        of proposing each target token of :attr:`support` (zero elsewhere in the target
        vocabulary).

        Mass on non-shared draft ids is dropped, not renormalized: for a distribution
        restricted to the intersection (tli) nothing is lost; for an unrestricted one
        (union) the result is the draft mass on target-representable tokens, which is
        the q that union's verification needs. Draft ids with the same bytes (rare
        duplicated added tokens) map to one target id and their mass adds up.
        """
        out = draft_probs.new_zeros(*draft_probs.shape[:-1], self.support.shape[0])
        return out.index_add_(-1, self.support_col, draft_probs.index_select(-1, self.shared_draft_ids))
