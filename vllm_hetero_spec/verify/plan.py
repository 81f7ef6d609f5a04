"""One proposal step's verification inputs, keyed by request id.

The proposer fills a :class:`VerifyPlan` when it drafts; the runner's propose hook hands
it to the rejection sampler, which lays it out for the batch as it stands at
verification (vLLM may reorder or condense the batch in between, so rows are matched by
request id, as vLLM matches its own draft probabilities). It is the one route from
drafting to verification: the draft distributions in compact form, which requests must
be verified one-hot, ``union``'s forced rejections and ``fsd``'s thresholds. Which rows
are greedy is not part of it: the sampler takes that from vLLM's batch.

**Why some requests are verified one-hot.** With structured outputs, vLLM's scheduler
keeps only the grammar-valid prefix of a draft (``Scheduler.update_draft_token_ids``),
so whether a position is verified at all depends on the value drafted there: the law
of a verified proposal is q restricted to the valid tokens, not q. Verifying with q
would then bias every rule that reads a real q (``tli``, ``union``, ``fsd``, ``slrs``'s
first token; a toy case: p = (.5, .5, 0), q = (.9, 0, .1) emits (.549, .451)). One-hot
verification (accept x with probability p(x), else a sample of p conditioned on not x)
emits exactly p whatever chose x, so it is exact under any cut that depends on the
draft. Such a request keeps its proposals and loses its q rows, ``union``'s forced
rejections (its placeholder is then an ordinary one-hot proposal) and ``fsd``'s tau.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from vllm_hetero_spec.host_to_device import to_device
from vllm_hetero_spec.verify.draft_probs import DraftProbs
from vllm_hetero_spec.verify.rules import BlockQ, FuzzyAcceptance


@dataclass(frozen=True)
class BlockPlan:
    """A plan laid out for the ``B`` rows being verified.

    Attributes:
        q: the draft distributions by position, or ``None`` (all one-hot).
        force_reject: ``[B, K]`` bool, or ``None`` when nothing is forced.
        fuzzy: the fsd test, or ``None``.
    """

    q: BlockQ | None
    force_reject: torch.Tensor | None
    fuzzy: FuzzyAcceptance | None


@dataclass
class VerifyPlan:
    """What one proposal step decided per request.

    Attributes:
        q: the step's q rows (``verify/draft_probs.py``), or ``None``.
        q_index: request id -> per proposal, its row of ``q`` or -1 (one-hot).
        one_hot: requests verified one-hot whatever the rest says (grammar-cut drafts).
        force_reject: request id -> per-position flags (``union``: the drafted token is
            not in the target vocabulary). Requests without forced rejections are absent.
        fsd_threshold: request id -> tau, or ``None`` when the algorithm is not ``fsd``.
        divergence / topk: the ``fsd`` divergence and its k.
    """

    q: DraftProbs | None = None
    q_index: dict[str, list[int]] = field(default_factory=dict)
    one_hot: set[str] = field(default_factory=set)
    force_reject: dict[str, list[bool]] = field(default_factory=dict)
    fsd_threshold: dict[str, float] | None = None
    divergence: str = "js"
    topk: int = 10

    @classmethod
    def for_drafts(cls, req_ids: Sequence[str], q: DraftProbs | None, q_index: Sequence[list[int]],
                   force_reject: dict[int, list[bool]], fsd_threshold: Sequence[float] | None,
                   one_hot: set[str], divergence: str = "js", topk: int = 10) -> VerifyPlan:
        """The plan of one step's drafts, given per drafted row: ``req_ids`` [rows] whose
        drafts they are, ``q_index`` [rows][proposals] (used only when ``q`` is set),
        ``force_reject`` {row: [proposals]} and ``fsd_threshold`` [rows] (``fsd``, else
        ``None``); ``one_hot``: the requests whose drafts vLLM cuts by their grammar."""
        plan = cls(q, {}, set(one_hot), {}, None if fsd_threshold is None else {}, divergence, topk)
        for i, req_id in enumerate(req_ids):
            if q is not None:
                plan.q_index[req_id] = q_index[i]
            if i in force_reject:
                plan.force_reject[req_id] = force_reject[i]
            if fsd_threshold is not None:
                plan.fsd_threshold[req_id] = fsd_threshold[i]
        return plan

    def layout(self, req_ids: Sequence[str], num_draft: Sequence[int], k: int, device: torch.device) -> BlockPlan:
        """The plan for the rows ``req_ids`` (``num_draft`` proposals each, at most
        ``k``), its tensors on ``device``, built from host lists (no sync).

        A request the plan does not know (it was not drafted for at that step), and one
        in :attr:`one_hot`, gets no q row, no forced rejection and tau = 0: plain
        lossless one-hot verification.
        """
        own = [None if r in self.one_hot else r for r in req_ids]
        q = None
        if self.q is not None:
            index = [(self.q_index.get(r, []) + [-1] * k)[:k] for r in own]
            q = BlockQ(self.q.to(device), to_device(index, torch.long, device))
        force = None
        if self.force_reject:
            flags = [(self.force_reject.get(r, []) + [False] * k)[:k] for r in own]
            force = to_device(flags, torch.bool, device)
        fuzzy = None
        tau = [0.0 if self.fsd_threshold is None else self.fsd_threshold.get(r, 0.0) for r in own]
        # tau = 0 accepts nothing beyond the standard test: the block's divergence, a pass
        # over [rows, k, vocab], is skipped when no row's tau is above it.
        if q is not None and any(t > 0 for t in tau):
            fuzzy = FuzzyAcceptance(to_device(tau, torch.float64, device), self.divergence, self.topk)
        return BlockPlan(q, force, fuzzy)
