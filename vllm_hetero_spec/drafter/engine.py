"""The drafting engine: per-request draft state, one packed draft loop per step.

It knows nothing of vLLM's runner, so the same object drafts in the engine's process
(``executor: inprocess``) or inside a Ray actor on CPU cores (``executor: ray``). Each
:meth:`DraftEngine.step` takes the committed target tokens of the rows to draft and,
per request, (1) feeds the newly committed tokens to the request's draft-side
tokenization as text (look-behind realignment, KV rollback), (2) runs the drafter for
all requests at once, and (3) returns target-vocabulary proposals -- re-tokenized draft
text for ``slem`` and ``dtw``, intersection-mapped ids with their exact draft
distribution for the token-level algorithms (``tli``, ``fsd``, ``union``), and for
``slrs`` a first target token sampled from the drafter's string-level law psi
(``drafter/slrs.py``) followed by re-tokenized draft text -- with what verification
needs beyond the ids (q rows, ``union``'s forced rejections, ``fsd``'s thresholds).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from vllm_hetero_spec.alignment import dtw_align_batch
from vllm_hetero_spec.config import HeteroSettings
from vllm_hetero_spec.drafter.paged_kv import PagedCache, PoolExhausted
from vllm_hetero_spec.drafter.runtime import DraftModelRuntime, RuntimeConfig
from vllm_hetero_spec.drafter.sampling import GREEDY_EPS, SamplingRows, processed_probs, sample
from vllm_hetero_spec.drafter.slrs import StringLevelProposer
from vllm_hetero_spec.drafter.token_level import RESTRICTED, TOKEN_LEVEL, draft_step
from vllm_hetero_spec.dtw import transfer_probs
from vllm_hetero_spec.vocab.bridge import VocabBridge
from vllm_hetero_spec.vocab.retokenize import AlignedTokens, propose_continuations, sync_batch

_TARGET_TAIL = 4  # committed target tokens re-encoded with the draft text (slem)


@dataclass(frozen=True)
class RequestParams:
    """A request's sampling settings, as the drafter needs them (read from vLLM's
    ``SamplingParams`` by the proposer, which alone sees the runner)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    fsd_threshold: float = 0.0


@dataclass
class RequestState:
    """What the drafter knows about one request between steps."""

    text: bytearray
    n_target: int
    target_tail: list[int]
    draft: AlignedTokens
    cache: PagedCache
    generator: torch.Generator | None
    params: RequestParams

    def fork(self) -> "RequestState":
        """An independent copy (KV cache shared copy-on-write, tokenization and random
        stream), so a speculative continuation can be drafted without touching this state."""
        gen = None
        if self.generator is not None:
            gen = torch.Generator(device=self.generator.device).set_state(self.generator.get_state())
        return RequestState(
            bytearray(self.text), self.n_target, list(self.target_tail), self.draft.fork(),
            self.cache.fork(), gen, self.params,
        )


@dataclass
class StepBatch:
    """One step's rows to draft: each request's committed target tokens (prompt and
    output) and its sampling settings; ``budget`` caps the target tokens proposed."""

    req_ids: list[str]
    tokens: list[np.ndarray]
    params: list[RequestParams]
    budget: int


@dataclass
class StepDrafts:
    """One step's proposals, per row of the :class:`StepBatch`.

    Attributes:
        ids: target-vocabulary proposals (possibly empty).
        q: per row ``[len(ids), target_vocab]`` float32 proposal distributions, or
            ``None`` for the whole step when the algorithm verifies one-hot (``slem``,
            lossless ``dtw``).
        force_reject: ``union``: per row with an absent proposal, which positions.
        fsd_threshold: ``fsd``: per row its tau; ``None`` for other algorithms.
        ready: per row, False when there was nothing to draft from yet.
    """

    ids: list[list[int]]
    q: list[np.ndarray] | None
    force_reject: dict[int, list[bool]] = field(default_factory=dict)
    fsd_threshold: list[float] | None = None
    ready: list[bool] = field(default_factory=list)

    def select(self, rows: list[int]) -> "StepDrafts":
        """The drafts of ``rows`` only, renumbered in that order."""
        where = {r: i for i, r in enumerate(rows)}
        return StepDrafts(
            [self.ids[r] for r in rows],
            None if self.q is None else [self.q[r] for r in rows],
            {where[r]: f for r, f in self.force_reject.items() if r in where},
            None if self.fsd_threshold is None else [self.fsd_threshold[r] for r in rows],
            [self.ready[r] for r in rows],
        )

    @staticmethod
    def concat(parts: list["StepDrafts"]) -> "StepDrafts":
        """Rows of ``parts`` (at least one, all from the same algorithm) one after the other."""
        out = StepDrafts([], None if parts[0].q is None else [], {}, None, [])
        if parts[0].fsd_threshold is not None:
            out.fsd_threshold = []
        for part in parts:
            base = len(out.ids)
            out.ids += part.ids
            if out.q is not None:
                out.q += part.q
            out.force_reject.update({base + r: f for r, f in part.force_reject.items()})
            if out.fsd_threshold is not None:
                out.fsd_threshold += part.fsd_threshold
            out.ready += part.ready
        return out


@dataclass
class DraftOutput:
    """One draft loop's result for the active requests (see ``DraftEngine._draft``)."""

    ids: list[list[int]]
    token_q: list[list[float]]
    q_rows: list[torch.Tensor]
    absent: list[list[bool]]


class FirstToken(NamedTuple):
    """An ``slrs`` request's first proposal this step: the target token, the psi row it
    was drawn from, and whether drafting continues after it (not after EOS or a token
    the draft vocabulary cannot spell)."""

    target_id: int
    q: torch.Tensor
    continues: bool


@dataclass
class DrafterStats:
    """Counters exposed to benchmarks and metrics (see ``metrics.COUNTERS``).

    The ``ray_*``, ``pipeline_*`` and ``budget_*`` counters stay zero in process; with
    the Ray executor the drafting counters come from the actor and the rest are kept
    by the client (``drafter/ray_executor.py``)."""

    steps: int = 0
    bridge_s: float = 0.0
    draft_s: float = 0.0
    draft_forwards: int = 0
    proposed: int = 0
    realign_mismatches: int = 0
    fallbacks: int = 0
    undrafted: int = 0
    pool_full: int = 0
    pool_bytes: int = 0
    slrs_nodes: int = 0
    slrs_capped: int = 0
    slrs_uncovered: int = 0
    request_states: int = 0
    state_bytes: int = 0
    pipeline_hits: int = 0
    pipeline_misses: int = 0
    pipeline_branches: int = 0
    pipeline_s: float = 0.0
    pipeline_errors: int = 0
    actor_idle_s: float = 0.0
    ray_wait_s: float = 0.0
    ray_target_s: float = 0.0
    ray_timeouts: int = 0
    ray_restarts: int = 0
    ray_undrafted_steps: int = 0
    budget_sum: int = 0

    def as_metrics(self) -> dict[str, float]:
        """The counters under their ``hetero:*`` metric names."""
        return {
            "steps": self.steps,
            "bridge_seconds": self.bridge_s,
            "draft_seconds": self.draft_s,
            "proposed_tokens": self.proposed,
            "realign_mismatches": self.realign_mismatches,
            "fallbacks": self.fallbacks,
            "undrafted_requests": self.undrafted,
            "pool_full_requests": self.pool_full,
            "slrs_tree_nodes": self.slrs_nodes,
            "slrs_capped_candidates": self.slrs_capped,
            "slrs_uncovered_requests": self.slrs_uncovered,
            "pipeline_hits": self.pipeline_hits,
            "pipeline_misses": self.pipeline_misses,
            "pipeline_branches": self.pipeline_branches,
            "pipeline_errors": self.pipeline_errors,
            "ray_wait_seconds": self.ray_wait_s,
            "ray_timeouts": self.ray_timeouts,
            "ray_restarts": self.ray_restarts,
            "ray_undrafted_steps": self.ray_undrafted_steps,
        }


class DraftEngine:
    """Draft state and drafting for every request of one engine."""

    def __init__(
        self, settings: HeteroSettings, target_tokenizer: str, target_vocab: int, tensor_parallel_size: int = 1,
        seed: int = 0,
    ):
        self.settings = settings
        self.seed = seed
        self.k = settings.num_speculative_tokens
        self.runtime = DraftModelRuntime(
            RuntimeConfig(settings.draft_model, getattr(torch, settings.draft_dtype), settings.draft_kv_pool_mb,
                          tensor_parallel_size=tensor_parallel_size)
        )
        self.bridge = VocabBridge.build(settings.draft_tokenizer, target_tokenizer, self.runtime.vocab_size, target_vocab)
        self.intersection = self.bridge.intersection.to(self.runtime.device)
        self.target_vocab = target_vocab
        self.states: dict[str, RequestState] = {}
        self.stats = DrafterStats()
        self._draft_specials = {
            tid for tid, b in enumerate(self.bridge.draft_encoder.token_bytes) if b is None
        } | set(self.bridge.draft_tokenizer.all_special_ids)
        self._target_eos = self.bridge.target_tokenizer.eos_token_id
        self.string_level = None
        if settings.algorithm == "slrs":
            self.string_level = StringLevelProposer(
                self.bridge.draft_bytes,
                self.bridge.target_bytes,
                self.bridge.target_encoder,
                self._target_eos,
                target_vocab,
                settings.slrs_max_nodes,
                settings.slrs_candidates,
                settings.slrs_min_prob,
            )

    # -- request lifetime -------------------------------------------------------------

    def drop(self, req_id: str) -> None:
        """Forget a finished, aborted or preempted request (rebuilt if it resumes),
        giving its KV blocks back to the pool."""
        state = self.states.pop(req_id, None)
        if state is not None:
            state.cache.release()

    forget = drop

    def keep_only(self, live: set[str]) -> None:
        """Forget every request not in ``live``."""
        for req_id in [r for r in self.states if r not in live]:
            self.drop(req_id)

    def reset(self) -> None:
        """Forget every request (their state may be inconsistent after a failure)."""
        self.keep_only(set())

    def fork(self, src: str, dst: str) -> None:
        """State ``dst`` as an independent copy of ``src`` (a speculative branch)."""
        self.drop(dst)
        self.states[dst] = self.states[src].fork()

    def move(self, src: str, dst: str) -> None:
        """State ``src`` becomes ``dst``'s (an adopted branch)."""
        self.drop(dst)
        self.states[dst] = self.states.pop(src)

    def snapshot_stats(self) -> DrafterStats:
        """A copy of the counters with the current state size filled in."""
        self.stats.request_states = len(self.states)
        self.stats.state_bytes = sum(s.cache.nbytes + s.draft.nbytes + len(s.text) for s in self.states.values())
        self.stats.pool_bytes = self.runtime.pool.used_bytes
        return dataclasses.replace(self.stats)

    # -- per-step work ----------------------------------------------------------------

    def step(
        self, batch: StepBatch, speculative: bool = False, stop: Callable[[], bool] | None = None
    ) -> StepDrafts:
        """Sync every row with its committed tokens and draft them (one packed loop).
        A ``speculative`` step (``drafter/pipeline.py``) is left out of the per-step
        counters, which describe the drafts vLLM actually received; ``stop`` ends its
        draft loop early (shorter drafts are still valid drafts)."""
        t0 = time.perf_counter()
        req_ids = batch.req_ids
        budget = max(1, min(batch.budget, self.k))
        ready = self.sync(req_ids, batch.tokens, batch.params)
        ready = self._reserve(req_ids, ready, budget)
        active = [i for i, ok in enumerate(ready) if ok]
        active_ids = [req_ids[i] for i in active]
        t1 = time.perf_counter()
        first = self._first_tokens(active_ids) if self.string_level is not None else {}
        drafting = [r for r in active_ids if r not in first or first[r].continues]
        draft = self._draft(drafting, budget, stop)
        t2 = time.perf_counter()
        out = StepDrafts([[] for _ in req_ids], None, ready=ready)
        algorithm = self.settings.algorithm
        if algorithm in TOKEN_LEVEL:
            out.q = [np.zeros((0, self.target_vocab), np.float32) for _ in req_ids]
            for j, i in enumerate(active):
                out.ids[i] = draft.ids[j]
                if draft.ids[j]:
                    out.q[i] = draft.q_rows[j].cpu().numpy()
                if any(draft.absent[j]):
                    out.force_reject[i] = draft.absent[j]
            if algorithm == "fsd":
                out.fsd_threshold = [p.fsd_threshold for p in batch.params]
        else:
            drafted = dict(zip(drafting, draft.ids))
            proposals = self._to_target(active_ids, [drafted.get(r, []) for r in active_ids], budget, first)
            for i, ids in zip(active, proposals):
                out.ids[i] = ids
            if algorithm == "dtw" and self.settings.dtw_verify == "faithful":
                rows = self._dtw_probs(draft, proposals)
                out.q = [np.zeros((0, self.target_vocab), np.float32) for _ in req_ids]
                for i, q in zip(active, rows):
                    out.q[i] = q
            if self.string_level is not None:
                out.q = [self._first_token_probs(r, ids, first).numpy() for r, ids in zip(req_ids, out.ids)]
        if not speculative:
            t3 = time.perf_counter()
            self.stats.steps += 1
            self.stats.undrafted += len(req_ids) - len(active)
            self.stats.bridge_s += (t1 - t0) + (t3 - t2)
            self.stats.draft_s += t2 - t1
            self.stats.proposed += sum(len(o) for o in out.ids)
        return out

    def next_logits(self, req_ids: list[str]) -> torch.Tensor:
        """The drafter's logits ``[n, draft_vocab]`` after each request's current draft
        tokens (feeding what is not cached yet; each request must have a token pending,
        as after :meth:`sync`)."""
        states = [self.states[r] for r in req_ids]
        pending = [s.draft.ids[s.cache.length :].tolist() for s in states]
        self.stats.draft_forwards += 1
        return self.runtime.forward([s.cache for s in states], pending)

    def _new_state(self, req_id: str, params: RequestParams, n_target: int) -> RequestState:
        draft = AlignedTokens(self.bridge.draft_encoder, self.bridge.draft_prefix_ids, self.settings.lookbehind)
        gen = torch.Generator(device=self.runtime.device).manual_seed(self._stream_seed(req_id, params, n_target))
        return RequestState(bytearray(), 0, [], draft, self.runtime.new_cache(), gen, params)

    def _stream_seed(self, req_id: str, params: RequestParams, n_target: int) -> int:
        """The seed of a request's draft random stream, never vLLM's global RNG: the
        target's sampling draws from that on every TP rank, and the drafter must
        neither shift it nor depend on it. A seeded request's stream depends on its
        seed, an unseeded one's on the engine's seed and its id (the same on every
        rank). Both also depend on where the state is (re)built, so a request rebuilt
        after preemption or a failure continues with fresh draws instead of replaying
        the ones its committed tokens were drafted with."""
        base = f"seed:{params.seed}" if params.seed is not None else f"engine:{self.seed}:{req_id}"
        digest = hashlib.blake2b(f"{base}:{n_target}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") & ((1 << 63) - 1)

    def sync(self, req_ids: list[str], tokens: list[np.ndarray], params: list[RequestParams]) -> list[bool]:
        """Append newly committed target tokens as text and realign every request's
        draft tokens (one batched re-tokenization). Per request, returns False when
        there is nothing to draft from yet (e.g. the text so far is one incomplete
        UTF-8 character and the drafter adds no prefix token)."""
        states = []
        for req_id, toks, p in zip(req_ids, tokens, params):
            state = self.states.get(req_id)
            if state is None or state.n_target > len(toks):
                self.drop(req_id)
                state = self.states[req_id] = self._new_state(req_id, p, len(toks))
            new = toks[state.n_target :].tolist()
            state.text += b"".join(self.bridge.target_encoder.bytes_of(t) for t in new)
            state.n_target = len(toks)
            state.target_tail = (state.target_tail + new)[-_TARGET_TAIL:]
            states.append(state)
        before = sum(s.draft.mismatches for s in states)
        kept = sync_batch([s.draft for s in states], [s.text for s in states])
        self.stats.realign_mismatches += sum(s.draft.mismatches for s in states) - before
        ready = []
        for state, n_kept in zip(states, kept):
            state.cache.truncate(n_kept)
            n_ids = len(state.draft)
            if n_ids and state.cache.length >= n_ids:
                # Everything is cached but we need logits at the last token: recompute it.
                state.cache.truncate(n_ids - 1)
            ready.append(n_ids > 0)
        return ready

    def _draft_steps(self, budget: int) -> int:
        """Drafter forwards per step: slem-style algorithms draft max_draft_tokens for k
        target tokens, and a smaller budget scales that down in proportion."""
        if self.settings.algorithm in TOKEN_LEVEL:
            return budget
        return math.ceil(self.settings.max_draft_tokens * budget / self.k)

    def _reserve(self, req_ids: list[str], ready: list[bool], budget: int) -> list[bool]:
        """Reserve KV blocks for this step's writes (pending tokens, drafts, and for
        slrs its first token's spelling) before any forward, so that a full pool
        leaves a request undrafted this step instead of failing mid-loop."""
        extra = self._draft_steps(budget) + (8 if self.string_level is not None else 0)
        out = []
        for req_id, ok in zip(req_ids, ready):
            if ok:
                state = self.states[req_id]
                try:
                    copies = state.cache.reserve(len(state.draft) + extra)
                except PoolExhausted:
                    self.stats.pool_full += 1
                    ok = False
                else:
                    if copies:
                        self.runtime.pool.copy_blocks([c[0] for c in copies], [c[1] for c in copies])
            out.append(ok)
        return out

    def _sampling_rows(self, req_ids: list[str]) -> SamplingRows:
        params = [self.states[r].params for r in req_ids]
        return SamplingRows.build(
            [p.temperature for p in params], [p.top_k for p in params], [p.top_p for p in params],
            [self.states[r].generator for r in req_ids], self.runtime.device,
        )

    def _draft(self, req_ids: list[str], budget: int, stop: Callable[[], bool] | None = None) -> DraftOutput:
        """Run the packed draft loop: per request the proposals (draft ids for slem and
        dtw, target ids for the token-level algorithms), each token's probability under
        the distribution it was sampled from, and for the token-level algorithms the full
        ``[n, target_vocab]`` q rows and which proposals the target lacks (union)."""
        algorithm = self.settings.algorithm
        token_level = algorithm in TOKEN_LEVEL
        n_steps = self._draft_steps(budget)
        drafts: list[list[int]] = [[] for _ in req_ids]
        proposals: list[list[int]] = [[] for _ in req_ids]
        absent: list[list[bool]] = [[] for _ in req_ids]
        token_q: list[list[float]] = [[] for _ in req_ids]
        probs: list[list[torch.Tensor]] = [[] for _ in req_ids]
        if not req_ids:
            return DraftOutput(drafts, token_q, [], absent)
        states = [self.states[r] for r in req_ids]
        rows = self._sampling_rows(req_ids)
        inter = self.intersection
        stop_prob = self.settings.draft_stop_prob
        live = list(range(len(req_ids)))
        for step in range(n_steps):
            caches = [states[i].cache for i in live]
            pending = [states[i].draft.ids[states[i].cache.length :].tolist() for i in live]
            logits = self.runtime.forward(caches, pending)[:, : inter.draft_to_target.numel()]
            self.stats.draft_forwards += 1
            sub = rows if len(live) == len(req_ids) else rows.select(live)
            if token_level:
                mapped = draft_step(logits, sub, inter, algorithm)
                q, sampled = mapped.q, mapped.ids
            else:
                q = processed_probs(logits, sub)
                sampled = sample(q, sub)
            pick = sampled.unsqueeze(1)
            cols = [sampled, q.gather(1, pick).squeeze(1)]
            if token_level:
                cols += [mapped.target_ids, mapped.absent]
            if stop_prob > 0:
                # Confidence from the untempered draft distribution (q is one-hot when greedy).
                raw = logits.masked_fill(inter.draft_mask.logical_not(), float("-inf")) if algorithm in RESTRICTED else logits
                cols.append(raw.softmax(dim=-1).gather(1, pick).squeeze(1))
            # The step's one host transfer: what the bridge and the loop's control need.
            host = torch.stack([c.double() for c in cols], dim=1).cpu().tolist()
            still = []
            for j, i in enumerate(live):
                tok, tok_q = int(host[j][0]), host[j][1]
                drafts[i].append(tok)
                token_q[i].append(tok_q)
                if token_level:
                    is_absent = bool(host[j][3])
                    proposals[i].append(int(host[j][2]))
                    absent[i].append(is_absent)
                    probs[i].append(mapped.target_q[j])
                    if is_absent:
                        continue  # union: rejected for sure, so nothing after it can be accepted
                if tok in self._draft_specials:
                    continue
                states[i].draft.append_drafted(tok)
                if stop_prob > 0 and host[j][-1] < stop_prob:
                    continue
                still.append(i)
            live = still
            if not live or step == n_steps - 1 or (stop is not None and stop()):
                break
        if token_level:
            return DraftOutput(proposals, token_q, [torch.stack(p) if p else torch.empty(0) for p in probs], absent)
        return DraftOutput(drafts, token_q, [], absent)

    def _to_target(
        self, req_ids: list[str], drafts: list[list[int]], budget: int, first: dict[str, FirstToken] | None = None
    ) -> list[list[int]]:
        """slem/dtw/slrs: re-tokenize each request's draft text with the target tokenizer
        (one batched call); a draft ending in a special token ends in the target's EOS.
        A request with an ``slrs`` first token proposes it, then the re-tokenized text
        drafted after it (within the remaining budget)."""
        first = first or {}
        enc = self.bridge.draft_encoder
        leads = [[first[r].target_id] if r in first else [] for r in req_ids]
        texts, stops = [], []
        for ids in drafts:
            stop = bool(ids) and ids[-1] in self._draft_specials
            texts.append(b"".join(enc.bytes_of(t) for t in (ids[:-1] if stop else ids)))
            stops.append(stop)
        tails = [self.states[r].target_tail + lead for r, lead in zip(req_ids, leads)]
        conts = propose_continuations(self.bridge.target_encoder, tails, texts, budget)
        outs = []
        for cont, lead, stop in zip(conts, leads, stops):
            room = budget - len(lead)
            cont = cont[:room]
            if stop and len(cont) < room and self._target_eos is not None:
                cont.append(self._target_eos)
            outs.append(lead + cont)
        return outs

    def _first_tokens(self, req_ids: list[str]) -> dict[str, FirstToken]:
        """slrs: for each sampling request (greedy ones verify by argmax, where psi
        plays no part, and draft as slem), the first target token sampled from psi on
        C, that distribution, and whether drafting continues after it (not after EOS or
        a token the draft vocabulary cannot spell). Its draft tokens are appended to
        the request's draft so the draft loop continues from its text."""
        rows = self._sampling_rows(req_ids)
        sampled = [i for i, t in enumerate(rows.host[0]) if t >= GREEDY_EPS]
        if not sampled:
            return {}
        states = [self.states[req_ids[i]] for i in sampled]
        caches = [s.cache for s in states]
        logits = self.next_logits([req_ids[i] for i in sampled])[:, : len(self.bridge.draft_bytes)]
        sub = rows.select(sampled)
        result = self.string_level.propose(self.runtime, caches, logits, sub)
        self.stats.slrs_nodes += result.nodes
        self.stats.slrs_capped += result.capped
        first = {}
        for j, i in enumerate(sampled):
            tid, q = result.target_ids[j], result.q_rows[j]
            if tid is None:
                # Drafted as slem: its draft loop needs the context's last token pending.
                self.stats.slrs_uncovered += 1
                states[j].cache.truncate(len(states[j].draft) - 1)
                continue
            for tok in result.draft_ids[j]:
                states[j].draft.append_drafted(tok)
            first[req_ids[i]] = FirstToken(tid, q, bool(result.draft_ids[j]))
        return first

    def _first_token_probs(self, req_id: str, ids: list[int], first: dict[str, FirstToken]) -> torch.Tensor:
        """slrs's q rows ``[len(ids), target_vocab]``: psi on C at a first token drawn
        from it, one-hot elsewhere (slem's rule, exact for any proposal)."""
        rows = torch.zeros(len(ids), self.target_vocab)
        if ids:
            rows[torch.arange(len(ids)), torch.tensor(ids)] = 1.0
        if req_id in first and ids:
            rows[0] = first[req_id].q
        return rows

    def _dtw_probs(self, draft: DraftOutput, proposals: list[list[int]]) -> list[np.ndarray]:
        """TokenTiming's transfer: align each request's draft tokens with its proxy
        (re-tokenized) tokens by DTW and carry the matched draft token's probability
        over as the proxy token's proposal probability (a one-entry q row)."""
        bodies = [[t for t in ids if t not in self._draft_specials] for ids in draft.ids]
        proxies = [[t for t in ids if t != self._target_eos] for ids in proposals]
        results = dtw_align_batch(
            bodies, proxies, self.bridge.draft_encoder.packed, self.bridge.target_encoder.packed, self.settings.dtw_window
        )
        rows = []
        for i, ids in enumerate(proposals):
            q = transfer_probs(results[i].path, draft.token_q[i], len(ids))
            row = np.zeros((len(ids), self.target_vocab), np.float32)
            for j, (tid, qj) in enumerate(zip(ids, q)):
                row[j, tid] = qj
            rows.append(row)
        return rows
