"""Speculative verification as pure tensor functions over a batch of drafts.

Every lossless rule of this project reduces to standard speculative sampling
(Leviathan et al.): accept draft x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the
first rejection emit a sample of normalize(max(p_i - q_i, 0)); if all are accepted emit
the bonus token sampled from p_{K}. With q one-hot at x_i this is exactly SLEM's
"accept while the target's own sample equals the proposal": accept with probability
p(x), otherwise a sample of p conditioned on != x -- the same joint law of emitted
tokens, drawn with one uniform per position instead of one full-vocabulary sample.

Two extensions keep that shape:

- ``force_reject`` (``union``): the drafter sampled a token the target vocabulary does
  not have, so p is 0 there and the position is rejected outright; q is the draft's mass
  on target-representable tokens *without* renormalization (``q_in``), so the residual
  normalize(max(p - q_in, 0)) makes the position's law exactly p.
- ``fuzzy`` (``fsd``): a position whose divergence D(p_i, q_i) is at most the row's
  threshold tau is accepted outright; otherwise the standard test above runs. tau = 0
  switches the fuzzy test off for that row, so float rounding in D can never accept a
  draft the lossless rule would not. Fuzzy acceptance never takes a token with
  p(x) = 0: those are the target's hard constraints (top-k/top-p cut, banned words,
  grammar, min_tokens), which a speed/quality trade must not break.

Everything here is batched (no Python loop over requests or positions) and reads the
target's rows where vLLM puts them (``[T, V]``, one row per verified position) and q in
compact form (``verify/draft_probs.py``): nothing ``[B, K, V]`` is built except for
``fsd``'s divergence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_hetero_spec.verify.divergence import divergence
from vllm_hetero_spec.verify.draft_probs import DraftProbs

PLACEHOLDER = -1


@dataclass(frozen=True)
class FuzzyAcceptance:
    """The fsd test: accept a position outright where D(p, q) <= the row's threshold.

    Attributes:
        threshold: ``[B]`` tau per row (>= 0; 0 disables the fuzzy test for that row).
        divergence: a name from ``verify.divergence.DIVERGENCE_NAMES``.
        topk: k of the ``*_topk`` divergences.
    """

    threshold: torch.Tensor
    divergence: str = "js"
    topk: int = 10


def accepted_lengths(accept: torch.Tensor, num_draft: torch.Tensor) -> torch.Tensor:
    """Number of leading accepted positions per row. ``accept`` is ``[B, K]`` bool;
    positions at or beyond ``num_draft`` never count."""
    k = accept.shape[1]
    valid = torch.arange(k, device=accept.device).unsqueeze(0) < num_draft.unsqueeze(1)
    return (accept & valid).int().cumprod(dim=1).sum(dim=1)


@dataclass(frozen=True)
class BlockQ:
    """The draft distributions of a verified block: ``index [B, K]`` is the row of
    ``probs`` holding each position's q, or -1 where the proposal is one-hot (drawn
    with certainty: ``slem``'s text, greedy rows, ``slrs``'s string-level tail)."""

    probs: DraftProbs
    index: torch.Tensor


def verify_tokens(
    draft_ids: torch.Tensor,
    num_draft: torch.Tensor,
    flat_index: torch.Tensor,
    target_probs: torch.Tensor,
    q: BlockQ | None,
    bonus_ids: torch.Tensor,
    exact: torch.Tensor,
    uniform: torch.Tensor,
    race_noise: torch.Tensor,
    noise_rows: torch.Tensor,
    force_reject: torch.Tensor | None = None,
    fuzzy: FuzzyAcceptance | None = None,
    target_choice: torch.Tensor | None = None,
) -> torch.Tensor:
    """Verify a batch of drafts laid out as vLLM lays out the target's rows.

    Args:
        draft_ids: ``[B, K]`` target-vocabulary proposals (padding anywhere >= num_draft).
        num_draft: ``[B]`` proposals per row (0..K).
        flat_index: ``[B, K]`` the row of ``target_probs`` scoring each position (any
            valid row for padding).
        target_probs: ``[T, V]`` target distributions after temperature/top-k/top-p
            (an all-greedy batch without ``fuzzy`` may pass logits: nothing reads p).
        q: the draft distributions, or ``None`` when every proposal is one-hot.
        bonus_ids: ``[B]`` token sampled from the target after the last draft.
        exact: ``[B]`` bool, rows verified by equality with ``target_choice`` (greedy
            rows, and seeded ones: ``verify/seeded.py``).
        uniform: ``[B, K]`` U(0,1) draws for the acceptance tests (read in the other
            rows only).
        race_noise: ``[N, V]`` Exp(1) draws for sampling the residual at the rejection,
            for the rows ``noise_rows`` ``[N]`` (every row with drafts not in ``exact``;
            the other rows never sample a residual).
        force_reject: ``[B, K]`` bool, positions rejected whatever p and q say (a union
            draft outside the target vocabulary). A non-greedy row needs its real q
            (``q_in``) at such a position, or its residual would be wrong.
        fuzzy: the fsd test, applied before the standard one; needs ``q``.
        target_choice: ``[T]`` the target's own token per row, read by the ``exact``
            rows: the argmax of its logits for a greedy row, as vLLM takes it (a float32
            softmax can tie logits that differ), the position's seeded sample for a
            seeded row; ``None`` when no row is exact.

    Returns:
        ``[B, K + 1]`` emitted tokens: accepted drafts, then the corrected or bonus token,
        then ``PLACEHOLDER``.
    """
    if q is None and fuzzy is not None:
        raise ValueError("fuzzy acceptance needs the draft distributions (draft_probs)")
    b, k = draft_ids.shape
    device = target_probs.device
    vocab = target_probs.shape[1]
    safe_ids = draft_ids.clamp(min=0).long()
    flat_rows = flat_index.flatten()
    p_x = target_probs.reshape(-1).index_select(0, flat_rows * vocab + safe_ids.flatten()).view(b, k)
    if q is None:
        q_x = torch.ones_like(p_x)
    else:
        has_q = q.index >= 0
        q_at = q.probs.at(q.index.clamp(min=0).flatten(), safe_ids.flatten()).view(b, k).to(p_x.dtype)
        q_x = torch.where(has_q, q_at, torch.ones_like(p_x))
    # Strict: a uniform of exactly 0 must not accept a token the target rules out.
    accept = uniform * q_x < p_x
    if target_choice is not None:
        choice_at = target_choice.index_select(0, flat_rows).view(b, k)
        accept = torch.where(exact.unsqueeze(1), choice_at == draft_ids, accept)
    if fuzzy is not None:
        tau = fuzzy.threshold.to(target_probs.dtype).unsqueeze(1)
        q_block = _dense_q(q, safe_ids.flatten(), vocab).view(b, k, vocab).to(target_probs.dtype)
        p_block = target_probs.index_select(0, flat_rows).view(b, k, vocab)
        close = divergence(fuzzy.divergence, p_block, q_block, fuzzy.topk) <= tau
        accept |= close & (tau > 0) & (p_x > 0)
    if force_reject is not None:
        accept &= force_reject.logical_not()
    n_acc = accepted_lengths(accept, num_draft)

    pos = n_acc.clamp(max=max(k - 1, 0))
    if k == 0:
        recovered = bonus_ids
    else:
        # Rows outside noise_rows are exact, or have no drafts (recovered unused).
        recovered = _at(choice_at, pos) if target_choice is not None else bonus_ids
        if noise_rows.shape[0] > 0:
            at = pos.index_select(0, noise_rows)
            p_rej = target_probs.index_select(0, _at(flat_index.index_select(0, noise_rows), at))
            x_rej = _at(safe_ids.index_select(0, noise_rows), at)
            q_sel = None if q is None else BlockQ(q.probs, _at(q.index.index_select(0, noise_rows), at).unsqueeze(1))
            # In place from here: [N, V] tensors are the step's largest.
            residual = _dense_q(q_sel, x_rej, vocab).to(p_rej.dtype).neg_().add_(p_rej).clamp_(min=0.0)
            # p == q leaves no residual; rejection then has probability zero, so any
            # fallback is unreachable in law -- use p to stay well defined.
            empty = residual.sum(dim=1, keepdim=True) <= 0
            residual.addcmul_(p_rej, empty.to(residual.dtype))
            sampled = residual.div_(race_noise).argmax(dim=1)
            chosen = recovered.index_copy(0, noise_rows, sampled)
            recovered = torch.where(exact, recovered, chosen) if target_choice is not None else chosen
    last = torch.where(n_acc < num_draft, recovered, bonus_ids)

    cols = torch.arange(k, device=device).unsqueeze(0)
    accepted = torch.where(cols < n_acc.unsqueeze(1), draft_ids.long(), PLACEHOLDER)
    out = torch.cat([accepted, torch.full((b, 1), PLACEHOLDER, dtype=torch.long, device=device)], dim=1)
    return out.scatter_(1, n_acc.unsqueeze(1), last.long().unsqueeze(1))


def _at(x: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """``x[r, col[r]]`` for every row r of ``[R, C]`` ``x``."""
    return x.gather(1, col.unsqueeze(1)).squeeze(1)


def _dense_q(q: BlockQ | None, tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[N, vocab]`` q at positions ``q.index`` (flattened to ``[N]``): the compact row
    expanded, or one-hot at ``tokens`` ``[N]`` where a position has no row."""
    if q is None:
        return torch.zeros(tokens.shape[0], vocab, device=tokens.device).scatter_(1, tokens.unsqueeze(1), 1.0)
    index = q.index.flatten()
    has = (index >= 0).unsqueeze(1)
    dense = q.probs.dense(index.clamp(min=0), vocab).mul_(has)
    return dense.scatter_add_(1, tokens.unsqueeze(1), has.logical_not().to(dense.dtype))


def verify_block(
    draft_ids: torch.Tensor,
    num_draft: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    bonus_ids: torch.Tensor,
    greedy: torch.Tensor,
    uniform: torch.Tensor,
    race_noise: torch.Tensor,
    force_reject: torch.Tensor | None = None,
    fuzzy: FuzzyAcceptance | None = None,
) -> torch.Tensor:
    """:func:`verify_tokens` on a padded block with dense distributions (the layout of
    the rules' statistical tests and benchmarks).

    Args:
        target_probs: ``[B, K, V]``; draft_probs: ``[B, K, V]`` the exact distributions
            the drafts were sampled from, or ``None`` for one-hot proposals;
        race_noise: ``[B, V]`` (read in non-greedy rows only); the rest as in
            :func:`verify_tokens`.
    """
    if draft_probs is None and (force_reject is not None or fuzzy is not None):
        raise ValueError("force_reject and fuzzy acceptance need the draft distributions (draft_probs)")
    b, k, vocab = target_probs.shape
    device = target_probs.device
    flat_index = torch.arange(b * k, device=device).view(b, k)
    q = None
    if draft_probs is not None:
        q = BlockQ(DraftProbs(draft_probs.reshape(b * k, vocab), torch.arange(vocab, device=device)), flat_index)
    flat_probs = target_probs.reshape(b * k, vocab)
    return verify_tokens(
        draft_ids, num_draft, flat_index, flat_probs, q, bonus_ids, greedy, uniform,
        race_noise, torch.arange(b, device=device), force_reject, fuzzy, target_choice=flat_probs.argmax(dim=1),
    )
