"""Python face of the compiled alignment core (``cython_ext/alignment.pyx``).

Packs each tokenizer's token bytes once into a flat table; per step only id arrays
(and offsets derived from them by numpy gathers) cross into the compiled code. There is
deliberately no pure-Python fallback: a missing build must fail loudly, not run slowly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vllm_hetero_spec import _alignment

__all__ = ["PackedVocab", "DtwResult", "dtw_align_batch", "common_prefix", "compiled_module"]

compiled_module = _alignment


@dataclass(frozen=True)
class PackedVocab:
    """All token byte strings of one vocabulary in one buffer; token t spans
    ``data[offsets[t]:offsets[t+1]]`` (empty for specials and unknown ids)."""

    data: np.ndarray  # uint8
    offsets: np.ndarray  # int64, len(vocab) + 1

    @classmethod
    def build(cls, token_bytes: list[bytes | None]) -> "PackedVocab":
        lens = np.fromiter((len(b or b"") for b in token_bytes), dtype=np.int64, count=len(token_bytes))
        offsets = np.zeros(len(token_bytes) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        data = np.frombuffer(b"".join(b or b"" for b in token_bytes), dtype=np.uint8)
        return cls(np.ascontiguousarray(data), offsets)

    def spans(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.offsets[ids], self.offsets[ids + 1]


@dataclass(frozen=True)
class DtwResult:
    """One request's alignment: ``path`` rows are (draft index, proxy index) from (0, 0)
    to (n-1, m-1); ``cost`` is the summed Levenshtein cost (-1: no path in the band)."""

    path: np.ndarray
    cost: int


def _pack(seqs: list[list[int]], vocab: PackedVocab) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lens = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    req = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(lens, out=req[1:])
    ids = np.fromiter((t for s in seqs for t in s), dtype=np.int64, count=int(req[-1]))
    start, end = vocab.spans(ids)
    return start, end, req


def dtw_align_batch(
    draft: list[list[int]], proxy: list[list[int]], draft_vocab: PackedVocab, target_vocab: PackedVocab, window: int
) -> list[DtwResult]:
    """DTW (Levenshtein cost between token strings, Sakoe-Chiba band ``window``; <= 0
    means no band) for every request of a step in one compiled, GIL-free call."""
    a_start, a_end, a_req = _pack(draft, draft_vocab)
    b_start, b_end, b_req = _pack(proxy, target_vocab)
    paths, offsets, costs = _alignment.dtw_batch(
        draft_vocab.data, a_start, a_end, a_req, target_vocab.data, b_start, b_end, b_req, int(window)
    )
    return [DtwResult(paths[offsets[r] : offsets[r + 1]], int(costs[r])) for r in range(len(draft))]


def common_prefix(a: list[int], b: list[int]) -> int:
    """Longest common prefix of two id lists (the realignment overlap)."""
    return int(_alignment.common_prefix(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)))
