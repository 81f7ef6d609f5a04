"""One proposal step's verification inputs, keyed by request id.

The proposer fills a :class:`VerifyPlan` when it drafts; the runner's propose hook hands
it to the rejection sampler, which lays it out for the batch as it stands at
verification (vLLM may reorder or condense the batch in between, so rows are matched by
request id, as vLLM matches its own draft probabilities). It is the one route from
drafting to verification: the draft distributions in compact form, which requests are
verified greedily (so no random draws are made for them), ``union``'s forced rejections
and ``fsd``'s thresholds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from vllm_hetero_spec.verify.draft_probs import DraftProbs
from vllm_hetero_spec.verify.rules import BlockQ, FuzzyAcceptance


@dataclass(frozen=True)
class BlockPlan:
    """A plan laid out for the ``B`` rows being verified.

    Attributes:
        q: the draft distributions by position, or ``None`` (all one-hot).
        force_reject: ``[B, K]`` bool, or ``None`` when nothing is forced.
        fuzzy: the fsd test, or ``None``.
        sampled: host list of the rows verified stochastically (drafts, not greedy).
    """

    q: BlockQ | None
    force_reject: torch.Tensor | None
    fuzzy: FuzzyAcceptance | None
    sampled: list[int]


@dataclass
class VerifyPlan:
    """What one proposal step decided per request.

    Attributes:
        q: the step's q rows (``verify/draft_probs.py``), or ``None``.
        q_index: request id -> per proposal, its row of ``q`` or -1 (one-hot).
        greedy: the requests verified by argmax equality.
        force_reject: request id -> per-position flags (``union``: the drafted token is
            not in the target vocabulary). Requests without forced rejections are absent.
        fsd_threshold: request id -> tau, or ``None`` when the algorithm is not ``fsd``.
        divergence / topk: the ``fsd`` divergence and its k.
    """

    q: DraftProbs | None = None
    q_index: dict[str, list[int]] = field(default_factory=dict)
    greedy: set[str] = field(default_factory=set)
    force_reject: dict[str, list[bool]] = field(default_factory=dict)
    fsd_threshold: dict[str, float] | None = None
    divergence: str = "js"
    topk: int = 10

    def layout(self, req_ids: Sequence[str], num_draft: Sequence[int], k: int, device: torch.device) -> BlockPlan:
        """The plan for the rows ``req_ids`` (``num_draft`` proposals each, at most
        ``k``), its tensors on ``device``, built from host lists (no sync).

        A request the plan does not know (it was not drafted for at that step) gets no
        q row, no forced rejection and tau = 0: plain lossless one-hot verification.
        """
        sampled = [row for row, (r, n) in enumerate(zip(req_ids, num_draft)) if n > 0 and r not in self.greedy]
        q = None
        if self.q is not None:
            index = [(self.q_index.get(r, []) + [-1] * k)[:k] for r in req_ids]
            q = BlockQ(self.q.to(device), torch.tensor(index, dtype=torch.long, device=device))
        force = None
        if self.force_reject:
            flags = [(self.force_reject.get(r, []) + [False] * k)[:k] for r in req_ids]
            force = torch.tensor(flags, dtype=torch.bool, device=device)
        fuzzy = None
        if self.fsd_threshold is not None and q is not None:
            tau = [self.fsd_threshold.get(r, 0.0) for r in req_ids]
            fuzzy = FuzzyAcceptance(torch.tensor(tau, dtype=torch.float64, device=device), self.divergence, self.topk)
        return BlockPlan(q, force, fuzzy, sampled)
