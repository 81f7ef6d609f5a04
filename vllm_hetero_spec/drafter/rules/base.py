"""The base draft rule, which is also ``slem``'s and lossless ``dtw``'s: the drafter
samples freely in its own vocabulary, its text is re-tokenized with the target
tokenizer, and verification is one-hot.

The other draft rules override the steps that differ (``token_level.py``, ``dtw.py``,
``slrs/rule.py``); the draft loop itself (``drafter/draft_loop.py``) is shared.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from vllm_hetero_spec.config import HeteroSettings
from vllm_hetero_spec.drafter.context import DraftContext
from vllm_hetero_spec.drafter.messages import DraftOutput, FirstToken, StepBatch, StepDrafts
from vllm_hetero_spec.drafter.request_state import RequestState
from vllm_hetero_spec.drafter.sampling import SamplingRows, processed_probs, sample
from vllm_hetero_spec.vocab.retokenize import propose_continuations


class Sampled(NamedTuple):
    """One draft position for the live rows: the sampled draft ids ``[n]``, the processed
    distribution they were drawn from ``[n, draft_vocab]``, and for token-level
    algorithms their target ids ``[n]``, which are absent ``[n]`` (union) and q carried
    onto the target vocabulary ``[n, S]`` on the intersection's support."""

    ids: torch.Tensor
    q: torch.Tensor
    target_ids: torch.Tensor | None = None
    absent: torch.Tensor | None = None
    verify_q: torch.Tensor | None = None


class DraftRule:
    """A rule's drafting draft rule. The class attributes and class methods are the
    rule's traits, which the proposer, the budget and the sampler read without an
    engine (``registry.py``)."""

    token_level = False
    reserve_extra = 0  # KV positions beyond the draft loop's own (slrs: its first token)
    greedy_reads_q = False  # whether verification reads q in greedy rows (fsd's divergence)
    forward_only = True  # drafts by one drafter forward per draft position, nothing more

    def __init__(self, ctx: DraftContext, rule: str):
        self.ctx = ctx
        self.rule = rule

    @classmethod
    def divergence(cls, settings: HeteroSettings) -> tuple[str, int] | None:
        """The divergence test verification applies on top of its rule (``fsd``'s), or None."""
        return None

    def draft_steps(self, budget: int) -> int:
        """Drafter forwards per step: max_draft_tokens for k target tokens, scaled down
        in proportion for a smaller budget."""
        settings = self.ctx.settings
        return math.ceil(settings.max_draft_tokens * budget / settings.num_speculative_tokens)

    def sample(self, logits: torch.Tensor, rows: SamplingRows) -> Sampled:
        q = processed_probs(logits, rows)
        return Sampled(sample(q, rows), q)

    def profile(self, logits: torch.Tensor, rows: SamplingRows, budget: int) -> None:
        """This rule's worst sampling for vLLM's memory profile: every draft position of
        a ``budget`` step sampled from ``logits`` ``[n, draft_vocab]``, each position's
        ids and q kept to the end and the q parts then joined, as the draft loop does."""
        ids, q_parts = [], []
        for _ in range(self.draft_steps(budget)):
            drawn = self.sample(logits, rows)
            ids.append(drawn.ids)
            if drawn.verify_q is not None:
                q_parts.append(drawn.verify_q)
        if q_parts:
            torch.cat(q_parts)

    def confidence_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The untempered distribution ``draft_stop_prob`` reads (q is one-hot when greedy)."""
        return logits

    def first_tokens(self, req_ids: list[str], states: list[RequestState]) -> dict[str, FirstToken]:
        """Proposals decided before the draft loop (none here)."""
        return {}

    def assemble(
        self, out: StepDrafts, batch: StepBatch, active: list[int], states: list[RequestState], drafting: list[str],
        draft: DraftOutput, budget: int, first: dict[str, FirstToken],
    ) -> None:
        """Fill ``out`` (one row per batch row) from the draft loop's output (``states``:
        the ``active`` rows')."""
        active_ids = [batch.req_ids[i] for i in active]
        drafted = dict(zip(drafting, draft.ids))
        tails = [s.target_tail for s in states]
        proposals = self.to_target(active_ids, tails, [drafted.get(r, []) for r in active_ids], budget, first)
        for i, ids in zip(active, proposals):
            out.ids[i] = ids
        self.add_q(out, batch, active, draft, proposals, first)

    def add_q(
        self, out: StepDrafts, batch: StepBatch, active: list[int], draft: DraftOutput, proposals: list[list[int]],
        first: dict[str, FirstToken],
    ) -> None:
        """One-hot verification: no q."""

    def to_target(
        self, req_ids: list[str], tails: list[list[int]], drafts: list[list[int]], budget: int,
        first: dict[str, FirstToken],
    ) -> list[list[int]]:
        """Re-tokenize each request's draft text with the target tokenizer (one batched
        call), after its last committed target tokens ``tails``; a draft ending in a
        special token ends in the target's EOS. A request with a first token proposes
        it, then the re-tokenized text drafted after it (within the remaining budget)."""
        ctx = self.ctx
        enc = ctx.bridge.draft_encoder
        leads = [[first[r].target_id] if r in first else [] for r in req_ids]
        texts, stops = [], []
        for ids in drafts:
            stop = bool(ids) and ids[-1] in ctx.draft_specials
            texts.append(b"".join(enc.bytes_of(t) for t in (ids[:-1] if stop else ids)))
            stops.append(stop)
        conts = propose_continuations(ctx.bridge.target_encoder, [t + lead for t, lead in zip(tails, leads)], texts,
                                      budget)
        outs = []
        for cont, lead, stop in zip(conts, leads, stops):
            room = budget - len(lead)
            cont = cont[:room]
            if stop and len(cont) < room and ctx.target_eos is not None:
                cont.append(ctx.target_eos)
            outs.append(lead + cont)
        return outs
