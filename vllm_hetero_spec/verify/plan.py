"""Per-request verification inputs beyond what vLLM's draft-probability slot carries.

vLLM hands the rejection sampler the draft tokens and (through ``_draft_probs``) the
draft distributions, re-ordered to the batch as it stands at verification. ``union``'s
forced rejections and ``fsd``'s per-request thresholds have no slot there, so the
proposer records them per request id at proposal time and the sampler lays them out
for the verify-time batch order, the same way vLLM matches ``_draft_probs`` rows by
request id (the batch may be reordered or condensed in between).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from vllm_hetero_spec.verify.rules import FuzzyAcceptance


@dataclass
class VerifyPlan:
    """What one proposal step decided per request.

    Attributes:
        force_reject: request id -> per-position flags (``union``: the drafted token is
            not in the target vocabulary). Requests without forced rejections are absent.
        fsd_threshold: request id -> tau, or ``None`` when the algorithm is not ``fsd``.
        divergence / topk: the ``fsd`` divergence and its k.
    """

    force_reject: dict[str, list[bool]] = field(default_factory=dict)
    fsd_threshold: dict[str, float] | None = None
    divergence: str = "js"
    topk: int = 10

    def block(self, req_ids: Sequence[str], k: int) -> tuple[torch.Tensor | None, FuzzyAcceptance | None]:
        """``[B, K]`` forced rejections and the fuzzy test for the rows ``req_ids``.

        A request the plan does not know (it was not drafted for at that step) gets no
        forced rejection and tau = 0, i.e. plain lossless verification.
        """
        force = None
        if self.force_reject:
            force = torch.zeros(len(req_ids), k, dtype=torch.bool)
            for row, req_id in enumerate(req_ids):
                flags = self.force_reject.get(req_id, [])[:k]
                force[row, : len(flags)] = torch.tensor(flags, dtype=torch.bool)
        fuzzy = None
        if self.fsd_threshold is not None:
            tau = torch.tensor([self.fsd_threshold.get(r, 0.0) for r in req_ids], dtype=torch.float64)
            fuzzy = FuzzyAcceptance(tau, self.divergence, self.topk)
        return force, fuzzy
