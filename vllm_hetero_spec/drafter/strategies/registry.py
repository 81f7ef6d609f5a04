"""Each algorithm's proposal strategy, registered once and chosen at construction.

The draft loop (``drafter/engine.py``) is the same for every algorithm: sync, one
packed forward per draft position, sample, feed the token back. What differs is how a
position is sampled and how the step's draft tokens become target-vocabulary proposals
and what verification gets with them:

- token level (``tli``, ``fsd``, ``union``): sample through the intersection map; the
  proposals are the mapped ids, q the exact distribution they were drawn from;
- string level (``slem``, lossless ``dtw``): sample freely, re-tokenize the draft text
  with the target tokenizer, verify one-hot;
- ``dtw`` faithful: as string level, plus TokenTiming's transferred probabilities;
- ``slrs``: a first target token drawn from psi (``drafter/slrs.py``), then string level.

:data:`STRATEGIES` maps each rule's name to its class; nothing else in the drafter
branches on a rule's name. An engine holds one strategy per rule it may use: its
algorithm's, or with ``algorithm: auto`` every candidate rule (``drafter/rule_choice.py``
picks one per request each step, and the engine drafts each rule's rows with its own).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import torch

from vllm_hetero_spec.drafter.messages import DraftOutput, FirstToken, StepBatch, StepDrafts
from vllm_hetero_spec.drafter.sampling import GREEDY_EPS, SamplingRows, processed_probs, sample
from vllm_hetero_spec.drafter.slrs import StringLevelProposer
from vllm_hetero_spec.drafter.token_level import RESTRICTED, draft_step
from vllm_hetero_spec.host_to_device import to_device
from vllm_hetero_spec.verify.draft_probs import DraftProbs
from vllm_hetero_spec.vocab.alignment import dtw_align_batch
from vllm_hetero_spec.vocab.dtw import transfer_probs
from vllm_hetero_spec.vocab.retokenize import propose_continuations

if TYPE_CHECKING:
    from vllm_hetero_spec.config import HeteroSettings
    from vllm_hetero_spec.drafter.engine import DraftEngine


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


class StringLevel:
    """``slem`` (and lossless ``dtw``): the drafter samples freely in its own vocabulary;
    its text is re-tokenized with the target tokenizer and verified one-hot."""

    token_level = False
    reserve_extra = 0  # KV positions beyond the draft loop's own (slrs: its first token)
    greedy_reads_q = False  # whether verification reads q in greedy rows (fsd's divergence)

    def __init__(self, engine: DraftEngine, rule: str):
        self.engine = engine
        self.rule = rule

    def draft_steps(self, budget: int) -> int:
        """Drafter forwards per step: max_draft_tokens for k target tokens, scaled down
        in proportion for a smaller budget."""
        settings = self.engine.settings
        return math.ceil(settings.max_draft_tokens * budget / settings.num_speculative_tokens)

    def sample(self, logits: torch.Tensor, rows: SamplingRows) -> Sampled:
        q = processed_probs(logits, rows)
        return Sampled(sample(q, rows), q)

    def confidence_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The untempered distribution ``draft_stop_prob`` reads (q is one-hot when greedy)."""
        return logits

    def first_tokens(self, req_ids: list[str]) -> dict[str, FirstToken]:
        """Proposals decided before the draft loop (none here)."""
        return {}

    def assemble(
        self, out: StepDrafts, batch: StepBatch, active: list[int], drafting: list[str], draft: DraftOutput,
        budget: int, first: dict[str, FirstToken],
    ) -> None:
        """Fill ``out`` (one row per batch row) from the draft loop's output."""
        active_ids = [batch.req_ids[i] for i in active]
        drafted = dict(zip(drafting, draft.ids))
        proposals = self.to_target(active_ids, [drafted.get(r, []) for r in active_ids], budget, first)
        for i, ids in zip(active, proposals):
            out.ids[i] = ids
        self.add_q(out, batch, active, draft, proposals, first)

    def add_q(
        self, out: StepDrafts, batch: StepBatch, active: list[int], draft: DraftOutput, proposals: list[list[int]],
        first: dict[str, FirstToken],
    ) -> None:
        """One-hot verification: no q."""

    def to_target(
        self, req_ids: list[str], drafts: list[list[int]], budget: int, first: dict[str, FirstToken]
    ) -> list[list[int]]:
        """Re-tokenize each request's draft text with the target tokenizer (one batched
        call); a draft ending in a special token ends in the target's EOS. A request with
        a first token proposes it, then the re-tokenized text drafted after it (within
        the remaining budget)."""
        engine = self.engine
        enc = engine.bridge.draft_encoder
        leads = [[first[r].target_id] if r in first else [] for r in req_ids]
        texts, stops = [], []
        for ids in drafts:
            stop = bool(ids) and ids[-1] in engine.draft_specials
            texts.append(b"".join(enc.bytes_of(t) for t in (ids[:-1] if stop else ids)))
            stops.append(stop)
        tails = [engine.states[r].target_tail + lead for r, lead in zip(req_ids, leads)]
        conts = propose_continuations(engine.bridge.target_encoder, tails, texts, budget)
        outs = []
        for cont, lead, stop in zip(conts, leads, stops):
            room = budget - len(lead)
            cont = cont[:room]
            if stop and len(cont) < room and engine.target_eos is not None:
                cont.append(engine.target_eos)
            outs.append(lead + cont)
        return outs


class DtwFaithful(StringLevel):
    """``dtw`` with ``dtw_verify: faithful`` (TokenTiming): draft and proxy tokens are
    aligned by DTW and the matched draft token's probability becomes the proxy token's
    proposal probability (a one-entry q row)."""

    def add_q(
        self, out: StepDrafts, batch: StepBatch, active: list[int], draft: DraftOutput, proposals: list[list[int]],
        first: dict[str, FirstToken],
    ) -> None:
        engine = self.engine
        bodies = [[t for t in ids if t not in engine.draft_specials] for ids in draft.ids]
        proxies = [[t for t in ids if t != engine.target_eos] for ids in proposals]
        results = dtw_align_batch(
            bodies, proxies, engine.bridge.draft_encoder.packed, engine.bridge.target_encoder.packed,
            engine.settings.dtw_window,
        )
        out.q_index = [[-1] * len(ids) for ids in out.ids]
        support, probs = [], []
        for n, (i, ids) in enumerate(zip(active, proposals)):
            if batch.params[i].temperature < GREEDY_EPS:
                continue  # verified by argmax: q is never read
            q = transfer_probs(results[n].path, draft.token_q[n], len(ids))
            out.q_index[i] = list(range(len(probs), len(probs) + len(ids)))
            support += ids
            probs += list(q)
        if probs:
            device = self.engine.runtime.device
            out.q = DraftProbs(to_device(probs, torch.float32, device).unsqueeze(1),
                               to_device(support, torch.long, device).unsqueeze(1))


class Slrs(StringLevel):
    """``slrs``: each sampling request's first target token is drawn from the drafter's
    string-level law psi on C (``drafter/slrs.py``), with that row as its q; the rest
    of the step is string level, verified one-hot."""

    reserve_extra = 8

    def __init__(self, engine: DraftEngine, rule: str):
        super().__init__(engine, rule)
        settings, bridge = engine.settings, engine.bridge
        self.proposer = StringLevelProposer(
            bridge.draft_bytes, bridge.target_bytes, bridge.target_encoder, engine.target_eos, engine.target_vocab,
            settings.slrs_max_nodes, settings.slrs_candidates, settings.slrs_min_prob, engine.runtime.device,
        )

    def first_tokens(self, req_ids: list[str]) -> dict[str, FirstToken]:
        """For each sampling request (greedy ones verify by argmax, where psi plays no
        part, and draft as slem), the first target token sampled from psi on C, that
        distribution, and whether drafting continues after it (not after EOS or a token
        the draft vocabulary cannot spell). Its draft tokens are appended to the
        request's draft so the draft loop continues from its text."""
        engine = self.engine
        rows = engine.sampling_rows(req_ids)
        sampled = [i for i, t in enumerate(rows.host[0]) if t >= GREEDY_EPS]
        if not sampled:
            return {}
        states = [engine.states[req_ids[i]] for i in sampled]
        logits = engine.next_logits([req_ids[i] for i in sampled]).narrow(1, 0, len(engine.bridge.draft_bytes))
        result = self.proposer.propose(engine.runtime, [s.cache for s in states], logits, rows.select(sampled))
        engine.stats.slrs_nodes += result.nodes
        engine.stats.slrs_capped += result.capped
        first = {}
        for j, i in enumerate(sampled):
            tid, q = result.target_ids[j], result.q_rows[j]
            if tid is None:
                # Drafted as slem: its draft loop needs the context's last token pending.
                engine.stats.slrs_uncovered += 1
                states[j].cache.truncate(len(states[j].draft) - 1)
                continue
            for tok in result.draft_ids[j]:
                states[j].draft.append_drafted(tok)
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


class TokenLevel(StringLevel):
    """``tli`` and ``union``: sample through the intersection map (``tli`` only among
    shared tokens, ``union`` freely, its absent tokens proposed as placeholders and
    rejected); q is the exact distribution each token was drawn from, on the target
    vocabulary."""

    token_level = True

    def draft_steps(self, budget: int) -> int:
        return budget

    def sample(self, logits: torch.Tensor, rows: SamplingRows) -> Sampled:
        mapped = draft_step(logits, rows, self.engine.intersection, self.rule)
        return Sampled(mapped.ids, mapped.q, mapped.target_ids, mapped.absent, mapped.verify_q)

    def confidence_logits(self, logits: torch.Tensor) -> torch.Tensor:
        if self.rule not in RESTRICTED:
            return logits
        return logits.masked_fill(self.engine.intersection.draft_mask.logical_not(), float("-inf"))

    def assemble(
        self, out: StepDrafts, batch: StepBatch, active: list[int], drafting: list[str], draft: DraftOutput,
        budget: int, first: dict[str, FirstToken],
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
    """``fsd``: drafted as ``tli``; verification also gets each request's threshold."""

    greedy_reads_q = True

    def assemble(
        self, out: StepDrafts, batch: StepBatch, active: list[int], drafting: list[str], draft: DraftOutput,
        budget: int, first: dict[str, FirstToken],
    ) -> None:
        super().assemble(out, batch, active, drafting, draft, budget, first)
        out.fsd_threshold = [p.fsd_threshold for p in batch.params]


def make_strategies(engine: DraftEngine) -> dict[str, StringLevel]:
    """The strategy of each rule the engine may use (``dtw`` by its verification mode),
    in the order :func:`engine_rules` gives them."""
    settings = engine.settings
    out: dict[str, StringLevel] = {}
    for rule in engine_rules(settings):
        if rule == "dtw" and settings.dtw_verify == "faithful":
            out[rule] = DtwFaithful(engine, rule)
        else:
            out[rule] = STRATEGIES[rule](engine, rule)
    return out


def engine_rules(settings: HeteroSettings) -> tuple[str, ...]:
    """The rules an engine drafts with: its algorithm, or for ``auto`` the candidates
    for greedy rows, then those for sampled rows (each once)."""
    if settings.algorithm != "auto":
        return (settings.algorithm,)
    return tuple(dict.fromkeys((*settings.auto_greedy, *settings.auto_sampled)))


STRATEGIES: dict[str, type[StringLevel]] = {
    "slem": StringLevel,
    "dtw": StringLevel,
    "slrs": Slrs,
    "tli": TokenLevel,
    "union": TokenLevel,
    "fsd": Fsd,
}
