"""One draft step of the token-level algorithms (``tli``, ``fsd``, ``union``).

Their proposals are single draft tokens carried one to one into the target vocabulary
by byte-identical strings (:class:`VocabIntersection`), so verification can use the real
draft distribution q. They differ only in what the drafter may sample:

- ``tli`` and ``fsd`` sample from the intersection-restricted, renormalized q (the
  request's temperature/top-k/top-p applied to that restricted distribution), so q is a
  proper distribution over target tokens. For ``fsd`` this also makes the divergence
  D(p, q) compare two distributions over the same tokens; the draft mass outside the
  intersection is not compared, it is simply never drafted. A greedy ``fsd`` row hands
  the verifier the drafter's untempered distribution instead of the one-hot it sampled
  from: for greedy rows q only enters the divergence (acceptance is argmax equality),
  and the target side of a greedy row is its untempered softmax too, so D compares the
  two models rather than a one-hot with a distribution (which would make any tau below
  ln 2 a no-op at temperature 0).
- ``union`` samples from the drafter's full processed distribution. A sampled token the
  target lacks is proposed as :data:`ABSENT_PLACEHOLDER` and marked ``absent``: the
  verifier must reject it (p is 0 there in the union of the vocabularies) and emit a
  sample of normalize(max(p - q_in, 0)), where q_in is the draft mass on representable
  tokens, not renormalized -- that is what :meth:`VocabIntersection.to_support_probs`
  returns for an unrestricted q.

The proposer and the sampler-level tests both draft through :func:`draft_step`, so the
tests exercise exactly the mapping the engine uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_hetero_spec.drafter.sampling import SamplingRows, processed_probs, sample
from vllm_hetero_spec.verify.draft_probs import DraftProbs
from vllm_hetero_spec.vocab.intersection import VocabIntersection

TOKEN_LEVEL = ("tli", "fsd", "union")
RESTRICTED = ("tli", "fsd")
# Any valid target id does: a forced rejection never emits it, and since drafting stops
# after an absent token, its own target logits (the next position's) are never used.
ABSENT_PLACEHOLDER = 0


@dataclass
class DraftStep:
    """One sampled token per row, with the distributions verification needs.

    Attributes:
        q: ``[n, draft_vocab]`` the processed distribution each token was sampled from.
        ids: ``[n]`` sampled draft ids.
        target_ids: ``[n]`` their target ids, :data:`ABSENT_PLACEHOLDER` where absent.
        absent: ``[n]`` bool, the sampled token has no target id (``union`` only).
        verify_q: ``[n, S]`` q carried onto the target vocabulary, on the intersection's
            support (for greedy ``fsd`` rows: the untempered model distribution, see the
            module docstring).
        support: ``[S]`` the target ids of ``verify_q``'s columns.
    """

    q: torch.Tensor
    ids: torch.Tensor
    target_ids: torch.Tensor
    absent: torch.Tensor
    verify_q: torch.Tensor
    support: torch.Tensor

    def target_q(self, vocab: int) -> torch.Tensor:
        """``[n, vocab]`` the dense form of ``verify_q`` (for tests and reports)."""
        rows = torch.arange(self.verify_q.shape[0], device=self.verify_q.device)
        return DraftProbs(self.verify_q, self.support).dense(rows, vocab)


def draft_step(logits: torch.Tensor, rows: SamplingRows, inter: VocabIntersection, algorithm: str) -> DraftStep:
    """Sample one token per row of ``logits`` ``[n, draft_vocab]`` the way ``algorithm``
    drafts, and map it into the target vocabulary."""
    if algorithm not in TOKEN_LEVEL:
        raise ValueError(f"{algorithm!r} is not a token-level algorithm ({list(TOKEN_LEVEL)})")
    q = processed_probs(logits, rows, inter.draft_mask if algorithm in RESTRICTED else None)
    ids = sample(q, rows)
    mapped = inter.draft_to_target.index_select(0, ids)
    absent = mapped < 0
    target_ids = mapped.masked_fill(absent, ABSENT_PLACEHOLDER)
    verify_q = q
    if algorithm == "fsd" and rows.any_greedy:
        model_q = logits.float().masked_fill(inter.draft_mask.logical_not(), float("-inf")).softmax(dim=-1)
        verify_q = torch.where(rows.greedy.unsqueeze(1), model_q, q)
    return DraftStep(q, ids, target_ids, absent, inter.to_support_probs(verify_q), inter.support)
