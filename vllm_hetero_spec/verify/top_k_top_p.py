"""Top-k then top-p on the target's logits without sorting the vocabulary.

vLLM 0.32.0 without Triton (its CPU build) applies top-p by sorting every row over the
whole vocabulary, top-k or not. On the verification path that is (k + 1) rows per
request: on a large vocabulary (Gemma-3's) with top-k and top-p set, the sorts can cost
more than the target's forwards (docs/architecture.md, "Top-k/top-p without a sort on
CPU"). When every row has a top-k, only its k largest logits can survive, so top-p needs
only those: one partial top-k over the vocabulary, then the same masks on a [rows,
max k] slice.

The result is vLLM's: a logit survives top-k when it is at least the row's k-th
largest (ties at the boundary survive, as in vLLM); top-p then drops the smallest
survivors while the probability mass below them is at most 1 - p, keeping at least
one. Rows whose ties would not fit in the slice, a row with top-p but no top-k, or a
top-k too large to gain from go to vLLM's own function, those rows alone.

Rows with neither filter are common in a batch that has filtered ones: vLLM resets
top-k and top-p of every greedy request (``SamplingParams``), so one greedy request
beside a top-k one used to send the whole batch to the full sort. On such a row vLLM's
sort masks only the tokens of probability exactly 0 (the cumulative mass below them
is 0 <= 1 - p); one softmax finds them (its sum runs in index order, not sorted
order, so a token whose probability is a float32 denormal may round the other way).

Top-p's cut is vLLM's only where vLLM's sort cannot place it elsewhere, so two kinds
of row are handed to vLLM's own function, on the same logits:
- a tie across the cut: which of equal logits vLLM drops first is the order its
  unstable sort leaves them in (a function of the row alone, but not of index order),
  and plain decoding keeps what that order keeps; equal logits are common in bf16;
- a cumulative mass within a relative :data:`_CUT_TOLERANCE` of 1 - p: vLLM sums over
  the whole vocabulary in another order, so its last bits may fall on the other side.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

# Below this share of the vocabulary a partial top-k beats a full sort comfortably.
_MAX_SHARE = 0.125
# Relative to 1 - p: far above float32 rounding of a softmax and a cumsum.
_CUT_TOLERANCE = 1e-4

TopKTopP = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor | None], torch.Tensor]


def top_k_top_p_without_sort(
    logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None, fallback: TopKTopP
) -> torch.Tensor:
    """``logits`` [rows, vocab] masked to -inf outside top-k then top-p (in place, like
    vLLM's); ``k`` [rows] integer, ``p`` [rows] float; ``fallback`` is vLLM's function.

    Each row takes the cheapest path that gives vLLM's mask: a top-k slice, one softmax
    (neither filter), or vLLM's own sort. Host syncs: one to sort the rows into paths,
    then the slice's three (the largest k, whether boundary ties overflow the slice,
    whether a row's top-p cut is fragile), as vLLM's own CPU top-k path makes; only used
    where vLLM itself runs without Triton."""
    if p is None or logits.shape[0] == 0:
        return fallback(logits, k, p)  # top-k alone: vLLM's path needs no sort
    vocab = logits.shape[-1]
    k_rows = torch.full_like(p, vocab, dtype=torch.long) if k is None else k.to(torch.long)
    sliced = (k_rows >= 1) & (k_rows <= _MAX_SHARE * vocab)  # [rows]
    unfiltered = (k_rows >= vocab) & (p >= 1)  # [rows]
    path = torch.where(sliced, 0, torch.where(unfiltered, 1, 2)).tolist()
    if all(x == 0 for x in path):
        return _top_k_slice(logits, k_rows, p, fallback)

    def sorted_rows(x: torch.Tensor, kk: torch.Tensor, pp: torch.Tensor) -> torch.Tensor:
        return fallback(x, None if k is None else kk, pp)

    for kind, apply in enumerate((functools.partial(_top_k_slice, fallback=fallback), _zero_mass, sorted_rows)):
        rows = [r for r, x in enumerate(path) if x == kind]
        if rows:
            index = torch.tensor(rows, device=logits.device)
            logits[index] = apply(logits[index], k_rows[index], p[index])  # indexing copies the rows
    return logits


def _zero_mass(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Rows with neither filter: vLLM's sort masks the tokens of probability 0."""
    return logits.masked_fill_(logits.softmax(dim=-1) == 0, float("-inf"))


def _top_k_slice(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor, fallback: TopKTopP) -> torch.Tensor:
    """Rows whose top-k is a small share of the vocabulary: top-p on a [rows, max k]
    slice of one partial top-k."""
    k_max = int(k.max())
    # One more than the slice holds: more than k_max logits are >= a row's k-th largest
    # exactly when its (k_max + 1)-th largest is, so boundary ties that would overflow
    # the slice show here, without a pass over the whole vocabulary.
    top, idx = logits.topk(k_max + 1, dim=-1)  # [rows, k_max + 1], descending
    kth = top.gather(1, (k - 1).unsqueeze(1))  # [rows, 1]
    if bool((top[:, k_max:] >= kth).any()):
        return fallback(logits, k, p)
    ascending, idx = top[:, :k_max].flip(-1), idx[:, :k_max].flip(-1)
    ascending = ascending.masked_fill(ascending < kth, float("-inf"))
    below = ascending.softmax(dim=-1).cumsum(dim=-1)  # [rows, k_max] mass up to and including each
    cut = 1 - p.unsqueeze(1)
    drop = below <= cut
    drop[:, -1] = False
    fragile = _fragile_cut(ascending, below, cut, drop)  # [rows]
    rows = fragile.nonzero().squeeze(1) if bool(fragile.any()) else None
    theirs = None if rows is None else fallback(logits[rows], k[rows], p[rows])  # indexing copies the rows
    ascending.masked_fill_(drop, float("-inf"))
    out = logits.fill_(float("-inf")).scatter_(1, idx, ascending)
    if theirs is not None:
        out[rows] = theirs
    return out


def _fragile_cut(ascending: torch.Tensor, below: torch.Tensor, cut: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:
    """[rows] bool: rows whose top-p cut vLLM's full sort may place differently.
    ``ascending`` [rows, n] the top-k survivors in ascending order (-inf below the
    k-th), ``below`` their cumulative mass, ``cut`` [rows, 1] = 1 - p, ``drop`` the
    dropped prefix."""
    n_drop = drop.sum(dim=1, keepdim=True)  # [rows, 1]: drop is a prefix (below rises)
    last = ascending.gather(1, (n_drop - 1).clamp(min=0))
    first = ascending.gather(1, n_drop.clamp(max=ascending.shape[1] - 1))
    tie = (n_drop > 0) & (last == first) & torch.isfinite(first)
    near = ((below - cut).abs() <= _CUT_TOLERANCE * cut) & torch.isfinite(ascending)
    return tie.squeeze(1) | near.any(dim=1)
