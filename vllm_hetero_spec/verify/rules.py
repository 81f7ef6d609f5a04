"""Speculative verification as pure tensor functions over a padded block of drafts.

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

Everything here is batched: no Python loop over requests or positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_hetero_spec.verify.divergence import divergence

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
    """Verify a padded block of drafts.

    Args:
        draft_ids: ``[B, K]`` target-vocabulary proposals (padding anywhere >= num_draft).
        num_draft: ``[B]`` proposals per row (0..K).
        target_probs: ``[B, K, V]`` target distributions after temperature/top-k/top-p
            (for greedy rows only their argmax matters).
        draft_probs: ``[B, K, V]`` the exact distributions the drafts were sampled from,
            or ``None`` for one-hot proposals (SLEM, any deterministic drafter).
        bonus_ids: ``[B]`` token sampled from the target after the last draft.
        greedy: ``[B]`` bool, rows verified by argmax equality.
        uniform: ``[B, K]`` U(0,1) draws for the acceptance tests.
        race_noise: ``[B, V]`` Exp(1) draws for sampling the residual at the rejection.
        force_reject: ``[B, K]`` bool, positions rejected whatever p and q say (a union
            draft outside the target vocabulary); needs ``draft_probs``.
        fuzzy: the fsd test, applied before the standard one; needs ``draft_probs``.

    Returns:
        ``[B, K + 1]`` emitted tokens: accepted drafts, then the corrected or bonus token,
        then ``PLACEHOLDER``.
    """
    if draft_probs is None and (force_reject is not None or fuzzy is not None):
        raise ValueError("force_reject and fuzzy acceptance need the draft distributions (draft_probs)")
    b, k = draft_ids.shape
    device = target_probs.device
    rows = torch.arange(b, device=device)
    safe_ids = draft_ids.clamp(min=0).long()
    p_x = target_probs.gather(2, safe_ids.unsqueeze(2)).squeeze(2)
    q_x = torch.ones_like(p_x) if draft_probs is None else draft_probs.gather(2, safe_ids.unsqueeze(2)).squeeze(2)
    target_argmax = target_probs.argmax(dim=2)
    accept = torch.where(greedy.unsqueeze(1), target_argmax == draft_ids, uniform * q_x <= p_x)
    if fuzzy is not None:
        tau = fuzzy.threshold.to(target_probs.dtype).unsqueeze(1)
        close = divergence(fuzzy.divergence, target_probs, draft_probs, fuzzy.topk) <= tau
        accept |= close & (tau > 0) & (p_x > 0)
    if force_reject is not None:
        accept &= ~force_reject
    n_acc = accepted_lengths(accept, num_draft)

    pos = n_acc.clamp(max=max(k - 1, 0))
    if k > 0:
        p_rej = target_probs[rows, pos]
        if draft_probs is None:
            residual = p_rej.scatter(1, safe_ids[rows, pos].unsqueeze(1), 0.0)
        else:
            residual = (p_rej - draft_probs[rows, pos]).clamp(min=0.0)
        # p == q leaves no residual; rejection then has probability zero, so any
        # fallback is unreachable in law -- use p to stay well defined.
        empty = residual.sum(dim=1, keepdim=True) <= 0
        residual = torch.where(empty, p_rej, residual)
        recovered = (residual / race_noise).argmax(dim=1)
        recovered = torch.where(greedy, target_argmax[rows, pos], recovered)
    else:
        recovered = bonus_ids
    last = torch.where(n_acc < num_draft, recovered, bonus_ids)

    out = torch.full((b, k + 1), PLACEHOLDER, dtype=torch.long, device=device)
    cols = torch.arange(k + 1, device=device).unsqueeze(0)
    out[:, :k] = torch.where(cols[:, :k] < n_acc.unsqueeze(1), draft_ids.long(), PLACEHOLDER)
    out[rows, n_acc] = last.long()
    return out
