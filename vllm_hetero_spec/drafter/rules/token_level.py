"""The token-level draft rules (``tli``, ``union``, ``fsd``): each draft token is carried
one to one into the target vocabulary through the intersection map
(``mapped_sampling.py``), with the exact distribution it was drawn from as q."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from vllm_hetero_spec.config import HeteroSettings, request_fsd_threshold
from vllm_hetero_spec.drafter.messages import DraftOutput, FirstToken, StepBatch, StepDrafts
from vllm_hetero_spec.drafter.request_state import RequestState
from vllm_hetero_spec.drafter.sampling import SamplingRows
from vllm_hetero_spec.drafter.rules.base import Sampled, DraftRule
from vllm_hetero_spec.drafter.rules.mapped_sampling import RESTRICTED, draft_step


class TokenLevel(DraftRule):
    """``tli`` and ``union``: sample through the intersection map (``tli`` only among
    shared tokens, ``union`` freely, its absent tokens proposed as placeholders and
    rejected); q is the exact distribution each token was drawn from, on the target
    vocabulary."""

    token_level = True

    def draft_steps(self, budget: int) -> int:
        return budget

    def sample(self, logits: torch.Tensor, rows: SamplingRows) -> Sampled:
        mapped = draft_step(logits, rows, self.ctx.intersection, self.rule)
        return Sampled(mapped.ids, mapped.q, mapped.target_ids, mapped.absent, mapped.verify_q)

    def confidence_logits(self, logits: torch.Tensor) -> torch.Tensor:
        if self.rule not in RESTRICTED:
            return logits
        return logits.masked_fill(self.ctx.intersection.draft_mask.logical_not(), float("-inf"))

    def assemble(
        self, out: StepDrafts, batch: StepBatch, active: list[int], states: list[RequestState], drafting: list[str],
        draft: DraftOutput, budget: int, first: dict[str, FirstToken],
    ) -> None:
        out.q = draft.q
        out.q_index = [[] for _ in batch.req_ids]
        for j, i in enumerate(active):
            out.ids[i] = draft.ids[j]
            if draft.q is not None:
                out.q_index[i] = draft.q_index[j]
            if any(draft.absent[j]):
                out.force_reject[i] = draft.absent[j]
        if out.q is None:
            out.q_index = []


class Fsd(TokenLevel):
    """``fsd``: drafted as ``tli``; verification also applies the divergence test with
    each request's threshold."""

    greedy_reads_q = True

    @classmethod
    def divergence(cls, settings: HeteroSettings) -> tuple[str, int] | None:
        return settings.fsd_divergence, settings.fsd_topk

    @classmethod
    def request_threshold(cls, settings: HeteroSettings, extra_args: Mapping[str, Any] | None) -> float:
        """A request's tau: its ``extra_args`` value, else the configured one. Raises
        ``ValueError`` for a bad request argument."""
        return request_fsd_threshold(extra_args, settings.fsd_threshold)

    def assemble(
        self, out: StepDrafts, batch: StepBatch, active: list[int], states: list[RequestState], drafting: list[str],
        draft: DraftOutput, budget: int, first: dict[str, FirstToken],
    ) -> None:
        super().assemble(out, batch, active, states, drafting, draft, budget, first)
        out.fsd_threshold = [p.fsd_threshold for p in batch.params]
