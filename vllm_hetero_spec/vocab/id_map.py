"""The bridge of a pair whose vocabularies agree id for id: an id map, no re-tokenization.

Two vocabularies agree id for id when almost every id spells the same bytes in both:
the same tokenizer, or a near-same one -- an embedding padded further, a few tokens
added or respelled (the R1-Distill Qwen models next to Qwen2.5, which vLLM's
``draft_model`` refuses for their differing sizes). For such a pair the drafter's
context is the target's committed ids themselves, the way vLLM's ``draft_model`` reads
them: no text round trip per step, and the drafter sees exactly the tokens the target
chose, not its own tokenizer's canonical spelling of their text (which can differ, and
then costs a KV rollback). The few ids the two spell differently are carried by their
text: the draft id with the same bytes, else the draft tokenizer's encoding of them.
Drafts still reach the target through the byte-level intersection (``intersection.py``),
which maps a shared id to itself and a respelled one to its counterpart.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

#: At most this share of the target's ids may differ for the pair to count as near-same.
MAX_DIFFERING_SHARE = 0.01
#: ...or this many, for small vocabularies.
MIN_DIFFERING_ALLOWED = 64


@dataclass(frozen=True)
class IdMap:
    """Target ids to draft ids for a pair that agrees id for id.

    Attributes:
        differing: the target ids the draft spells differently or lacks, each with the
            draft ids that spell its text (empty for an id with no text: padding).
        plain: ``[target_size]`` bool, True where an id maps to itself; ids at or past
            the target's table size map to nothing.
    """

    differing: dict[int, tuple[int, ...]]
    plain: np.ndarray

    @classmethod
    def detect(
        cls,
        draft_bytes: Sequence[bytes | None],
        target_bytes: Sequence[bytes | None],
        encode: Callable[[bytes], list[int]],
    ) -> "IdMap | None":
        """The map, or ``None`` when more than :data:`MAX_DIFFERING_SHARE` of the
        target's ids with text (at least :data:`MIN_DIFFERING_ALLOWED`) differ.

        ``*_bytes``: each id's text, control tokens spelled literally (as the bridge's
        encoders hold them), ``None`` for an id without text; ``encode``: the draft
        tokenizer's encoding of a byte string (no special prefix)."""
        n_draft = len(draft_bytes)
        n_text = sum(b is not None for b in target_bytes)
        allowed = max(MIN_DIFFERING_ALLOWED, int(MAX_DIFFERING_SHARE * n_text))
        # Ids the draft spells otherwise or lacks; an id without text in the target
        # (padding) maps to itself where the draft has no text for it either.
        differ = [t for t, b in enumerate(target_bytes)
                  if t >= n_draft or draft_bytes[t] != b]
        if not n_text or sum(target_bytes[t] is not None for t in differ) > allowed:
            return None
        by_bytes: dict[bytes, int] = {}
        for d, b in enumerate(draft_bytes):
            if b:
                by_bytes.setdefault(b, d)
        differing: dict[int, tuple[int, ...]] = {}
        for t in differ:
            text = target_bytes[t]
            if text is None:
                differing[t] = ()
            else:
                differing[t] = (by_bytes[text],) if text in by_bytes else tuple(encode(text))
        plain = np.ones(len(target_bytes), dtype=bool)
        plain[list(differing)] = False
        return cls(differing, plain)

    def to_draft(self, ids: np.ndarray) -> np.ndarray:
        """``[n]`` target ids -> the draft ids standing for the same text (one each,
        save the few differing ids, which may take none or several)."""
        ids = np.asarray(ids, dtype=np.int64)
        inside = ids < len(self.plain)
        if inside.all() and self.plain[ids].all():
            return ids.copy()
        out: list[int] = []
        for t in ids.tolist():
            if t < len(self.plain):
                out.extend(self.differing.get(t, (t,)))
        return np.asarray(out, dtype=np.int64)


class MappedTokens:
    """A request's draft ids under an :class:`IdMap`: the committed target ids mapped,
    then the tokens drafted since. The id-map counterpart of ``AlignedTokens``, with
    the part of its interface the engine and the draft loop use."""

    def __init__(self, id_map: IdMap):
        self.id_map = id_map
        self._ids = np.zeros(64, dtype=np.int64)
        self.n = 0
        self.n_committed = 0  # ids standing for committed target tokens; the rest are drafts

    @property
    def ids(self) -> np.ndarray:
        return self._ids[: self.n]

    @property
    def nbytes(self) -> int:
        return self._ids.nbytes

    def __len__(self) -> int:
        return self.n

    def commit(self, target_ids: np.ndarray) -> int:
        """Append newly committed target ids (replacing the drafts). Returns how many
        leading ids are unchanged -- the drafts the target accepted stay -- so the
        caller rolls its KV cache back to there."""
        new = self.id_map.to_draft(target_ids)
        drafted = self._ids[self.n_committed : self.n]
        m = min(len(new), len(drafted))
        differ = np.flatnonzero(new[:m] != drafted[:m])
        kept = self.n_committed + (int(differ[0]) if len(differ) else m)
        end = self.n_committed + len(new)
        if end > len(self._ids):
            self._ids = np.concatenate([self._ids, np.zeros(max(end, 2 * len(self._ids)) - len(self._ids), np.int64)])
        self._ids[self.n_committed : end] = new
        self.n = self.n_committed = end
        return kept

    def append_drafted(self, tid: int) -> None:
        """Record a token the drafter produced (kept by the next :meth:`commit` only if
        the target commits the same id)."""
        if self.n == len(self._ids):
            self._ids = np.concatenate([self._ids, np.zeros(len(self._ids), np.int64)])
        self._ids[self.n] = tid
        self.n += 1

    def fork(self) -> "MappedTokens":
        """An independent copy (the map is shared)."""
        other = copy.copy(self)
        other._ids = self._ids.copy()
        return other
