"""``slrs``'s draft rule: each sampling request's first target token is drawn from the
drafter's string-level law psi on C (``proposer.py``, ``psi.py``), with that row as its
q; the rest of the step is re-tokenized draft text, verified one-hot."""

from __future__ import annotations

import torch

from vllm_hetero_spec.drafter.context import DraftContext
from vllm_hetero_spec.drafter.messages import DraftOutput, FirstToken, StepBatch, StepDrafts
from vllm_hetero_spec.drafter.request_state import RequestState
from vllm_hetero_spec.drafter.sampling import GREEDY_EPS, SamplingRows
from vllm_hetero_spec.drafter.rules.base import DraftRule
from vllm_hetero_spec.drafter.rules.slrs.first_token import FirstTokenSampler
from vllm_hetero_spec.verify.draft_probs import DraftProbs


class Slrs(DraftRule):
    """psi's first token, then the base draft rule's re-tokenized text."""

    reserve_extra = 8
    forward_only = False  # psi's tree costs several forwards per position

    def __init__(self, ctx: DraftContext, rule: str):
        super().__init__(ctx, rule)
        settings, bridge = ctx.settings, ctx.bridge
        self.proposer = FirstTokenSampler(
            bridge.draft_bytes, bridge.target_bytes, bridge.target_encoder, ctx.target_eos, ctx.target_vocab,
            settings.slrs_max_nodes, settings.slrs_candidates, settings.slrs_min_prob, ctx.device,
        )

    def profile(self, logits: torch.Tensor, rows: SamplingRows, budget: int) -> None:
        """The draft loop's positions, then psi's tree at its widest
        (``FirstTokenSampler.profile``)."""
        super().profile(logits, rows, budget)
        self.proposer.profile(logits, rows)

    def first_tokens(self, req_ids: list[str], states: list[RequestState]) -> dict[str, FirstToken]:
        """For each sampling request (greedy ones verify by argmax, where psi plays no
        part, and draft as slem), the first target token sampled from psi on C, that
        distribution, and whether drafting continues after it (not after EOS or a token
        the draft vocabulary cannot spell). Its draft tokens are appended to the
        request's draft so the draft loop continues from its text."""
        ctx = self.ctx
        rows = ctx.sampling_rows(states)
        sampled = [i for i, t in enumerate(rows.host[0]) if t >= GREEDY_EPS]
        if not sampled:
            return {}
        chosen = [states[i] for i in sampled]
        logits = ctx.next_logits(chosen).narrow(1, 0, len(ctx.bridge.draft_bytes))
        result = self.proposer.propose(ctx.runtime, [s.cache for s in chosen], logits, rows.select(sampled))
        ctx.stats.slrs_nodes += result.nodes
        ctx.stats.slrs_capped += result.capped
        first = {}
        for j, i in enumerate(sampled):
            tid, q = result.target_ids[j], result.q_rows[j]
            if tid is None:
                # Drafted as slem: its draft loop needs the context's last token pending.
                ctx.stats.slrs_uncovered += 1
                chosen[j].cache.truncate(len(chosen[j].draft) - 1)
                continue
            for tok in result.draft_ids[j]:
                chosen[j].draft.append_drafted(tok)
            first[req_ids[i]] = FirstToken(tid, q, bool(result.draft_ids[j]))
        return first

    def add_q(
        self, out: StepDrafts, batch: StepBatch, active: list[int], draft: DraftOutput, proposals: list[list[int]],
        first: dict[str, FirstToken],
    ) -> None:
        """q rows: psi on C at a first token drawn from it, one-hot elsewhere (slem's
        rule, exact for any proposal)."""
        out.q_index = [[-1] * len(ids) for ids in out.ids]
        rows = []
        for i, (req_id, ids) in enumerate(zip(batch.req_ids, out.ids)):
            if req_id in first and ids:
                out.q_index[i][0] = len(rows)
                rows.append(first[req_id].q)
        if rows:
            out.q = DraftProbs.cat(rows)
