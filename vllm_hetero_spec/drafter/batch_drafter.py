"""The drafting engine: per-request draft state, one packed draft loop per step.

It knows nothing of vLLM's runner, so the same object drafts in the engine's process
(``executor: inprocess``) or inside a Ray actor on CPU cores (``executor: ray``). Each
:meth:`BatchDrafter.step` takes the committed target tokens of the rows to draft and,
per request, (1) feeds the newly committed tokens to the request's draft-side
tokenization as text (look-behind realignment, KV rollback), (2) runs the drafter for
all requests at once, and (3) returns target-vocabulary proposals -- re-tokenized draft
text for ``slem`` and ``dtw``, intersection-mapped ids with their exact draft
distribution for the token-level algorithms (``tli``, ``fsd``, ``union``), and for
``slrs`` a first target token sampled from the drafter's string-level law psi
(``drafter/rules/slrs/``) followed by re-tokenized draft text -- with what verification
needs beyond the ids (q rows, ``union``'s forced rejections, ``fsd``'s thresholds).
How a position is sampled and how proposals are assembled is a rule's draft rule
(``drafter/rules/``), which sees the engine only through a narrow
:class:`DraftContext`; the draft loop (``drafter/draft_loop.py``) is shared. With ``algorithm: auto`` each row
names its rule for the step (``RequestParams.rule``, chosen by the proposer): rows are
drafted in one loop per rule, so a batch may mix rules and each row's proposals are
exactly what its rule alone would give.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable

import numpy as np
import torch

from vllm_hetero_spec.config import HeteroSettings
from vllm_hetero_spec.drafter.context import DraftContext
from vllm_hetero_spec.drafter.draft_loop import run_draft_loop
from vllm_hetero_spec.drafter.messages import DrafterStats, RequestParams, StepBatch, StepDrafts
from vllm_hetero_spec.drafter.request_state import RequestState
from vllm_hetero_spec.drafter.runtime.config import RuntimeConfig, resolve_runtime_config
from vllm_hetero_spec.drafter.runtime.model import DraftModel
from vllm_hetero_spec.drafter.runtime.paged_kv import PoolExhausted
from vllm_hetero_spec.drafter.sampling import GREEDY_EPS, SamplingRows
from vllm_hetero_spec.drafter.rules.base import DraftRule
from vllm_hetero_spec.drafter.rules.registry import make_draft_rules
from vllm_hetero_spec.model_names import draft_tokenizer_folder
from vllm_hetero_spec.vocab.bridge import VocabBridge
from vllm_hetero_spec.vocab.id_map import MappedTokens
from vllm_hetero_spec.vocab.retokenize import AlignedTokens, sync_batch

_TARGET_TAIL = 4  # committed target tokens re-encoded with the draft text (slem)


def new_generator(device: torch.device, seed: int) -> torch.Generator:
    """A random stream on ``device`` (the device-discipline tests swap in host ones:
    the CPU build of torch cannot create a ``cuda`` generator)."""
    return torch.Generator(device=device).manual_seed(seed)


def _engine_seed(seed: int) -> int:
    digest = hashlib.blake2b(f"engine:{seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class BatchDrafter:
    """Draft state and drafting for every request of one engine."""

    def __init__(self, settings: HeteroSettings, target_tokenizer: str, target_vocab: int, seed: int = 0,
                 runtime: RuntimeConfig | None = None):
        """``runtime``: the concrete runtime config the proposer resolved for its engine
        (``None``: a drafter of its own, resolved here without a target)."""
        self.settings = settings
        self.seed = seed
        self.k = settings.num_speculative_tokens
        self.runtime = DraftModel(runtime or resolve_runtime_config(settings)[0])
        self.bridge = VocabBridge.build(str(draft_tokenizer_folder(settings)), target_tokenizer, self.runtime.vocab_size,
                                        target_vocab)
        self.intersection = self.bridge.intersection.to(self.runtime.device)
        # Vocabularies that agree id for id: the drafter reads the target's ids as they are.
        self.id_map = self.bridge.active_id_map(settings.id_map)
        self.target_vocab = target_vocab
        self.states: dict[str, RequestState] = {}
        # The unseeded requests' draft stream, drawn for all of them in one launch. Never
        # vLLM's global RNG: the target's sampling draws from that on every TP rank, and
        # the drafter must neither shift it nor depend on it. Every rank consumes this one
        # identically (the same batches in the same order), so their drafts agree.
        self.generator = new_generator(self.runtime.device, _engine_seed(seed))
        self.stats = DrafterStats()
        specials = {tid for tid, b in enumerate(self.bridge.draft_encoder.token_bytes) if b is None}
        self.ctx = DraftContext(
            settings, self.runtime, self.bridge, self.intersection,
            frozenset(specials | set(self.bridge.draft_tokenizer.all_special_ids)),
            self.bridge.target_tokenizer.eos_token_id, target_vocab, self.generator, self.stats,
        )
        self.draft_rules = make_draft_rules(self.ctx)
        # Read the draft loop back once per step (accelerators) or every position (CPU,
        # where a read costs nothing and rows that stop leave the batch): see run_draft_loop.
        self.defer_reads = self.runtime.device.type != "cpu"

    # -- request lifetime -------------------------------------------------------------

    def drop(self, req_id: str) -> None:
        """Forget a finished, aborted or preempted request (rebuilt if it resumes),
        giving its KV blocks back to the pool."""
        state = self.states.pop(req_id, None)
        if state is not None:
            state.cache.release()

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

    def profile(self, num_tokens: int, num_rows: int) -> None:
        """The drafter's worst step, for vLLM's memory profile: its largest forward, then
        for every rule the engine drafts with, ``num_rows`` rows sampled through the
        costliest path at every draft position, each position's q held as the draft
        loop holds it until the step ends (``DraftRule.profile``). The rows ask for top-p
        alone, which sorts the whole draft vocabulary (a top-k takes a partial top-k
        instead). Draws from a stream of its own."""
        logits = self.runtime.dummy_logits(num_tokens, num_rows).narrow(1, 0, len(self.bridge.draft_bytes))
        n = logits.shape[0]
        gen = new_generator(self.runtime.device, 0)
        rows = SamplingRows.build([1.0] * n, [0] * n, [0.9] * n, [None] * n, self.runtime.device, gen)
        for draft_rule in self.draft_rules.values():
            draft_rule.profile(logits, rows, self.k)

    # -- per-step work ----------------------------------------------------------------

    def step(
        self, batch: StepBatch, speculative: bool = False, stop: Callable[[], bool] | None = None
    ) -> StepDrafts:
        """Sync every row with its committed tokens and draft them (one packed loop per
        rule in the batch). A ``speculative`` step (``drafter/placement/pipeline.py``) is left out
        of the per-step counters, which describe the drafts vLLM actually received;
        ``stop`` ends its draft loops early (shorter drafts are still valid drafts)."""
        t0 = time.perf_counter()
        req_ids = batch.req_ids
        budget = max(1, min(batch.budget, self.k))
        rules = [self.rule_of(p) for p in batch.params]
        ready = self.sync(req_ids, batch.tokens, batch.params)
        ready = self._reserve(req_ids, ready, budget, rules)
        groups: dict[str, list[int]] = {}
        for i, ok in enumerate(ready):
            if ok:
                groups.setdefault(rules[i], []).append(i)
        draft_s = 0.0
        parts: list[tuple[list[int], StepDrafts]] = []
        for rule, active in groups.items():
            part, drafted_s = self._step_rule(self.draft_rules[rule], batch, active, budget, stop)
            parts.append((active, part))
            draft_s += drafted_s
        out = self._merge(parts, ready)
        if not speculative:
            t3 = time.perf_counter()
            self.stats.steps += 1
            self.stats.undrafted += len(req_ids) - sum(len(a) for a in groups.values())
            self.stats.bridge_s += (t3 - t0) - draft_s
            self.stats.draft_s += draft_s
            self.stats.proposed += sum(len(o) for o in out.ids)
        return out

    def rule_of(self, params: RequestParams) -> str:
        """The rule a row drafts with: the one it names, else the engine's first for its
        kind of sampling (its algorithm, or ``auto``'s first candidate)."""
        if params.rule:
            if params.rule not in self.draft_rules:
                raise ValueError(f"rule {params.rule!r} is not one of this engine's {list(self.draft_rules)}")
            return params.rule
        settings = self.settings
        if settings.algorithm != "auto":
            return settings.algorithm
        return settings.auto_greedy[0] if params.temperature < GREEDY_EPS else settings.auto_sampled[0]

    def _step_rule(
        self, draft_rule: DraftRule, batch: StepBatch, active: list[int], budget: int,
        stop: Callable[[], bool] | None,
    ) -> tuple[StepDrafts, float]:
        """Draft the batch rows ``active`` with one rule: the drafts (rows outside
        ``active`` empty) and the seconds spent drafting (the rest is the bridge's)."""
        active_ids = [batch.req_ids[i] for i in active]
        states = [self.states[r] for r in active_ids]
        t0 = time.perf_counter()
        first = draft_rule.first_tokens(active_ids, states)
        drafting = [r for r in active_ids if r not in first or first[r].continues]
        caps = {batch.req_ids[i]: max(1, min(batch.cap(i), budget)) for i in active}
        draft = run_draft_loop(self.ctx, draft_rule, [self.states[r] for r in drafting], budget,
                               [caps[r] for r in drafting], self.defer_reads, stop)
        t1 = time.perf_counter()
        out = StepDrafts([[] for _ in batch.req_ids], ready=[False] * len(batch.req_ids))
        draft_rule.assemble(out, batch, active, states, drafting, draft, budget, first)
        return out, t1 - t0

    @staticmethod
    def _merge(parts: list[tuple[list[int], StepDrafts]], ready: list[bool]) -> StepDrafts:
        """One step's drafts from each rule's (a row takes its rule's; rows no rule drafted
        are empty), in batch order."""
        if len(parts) == 1:
            out = parts[0][1]
        elif not parts:
            out = StepDrafts([[] for _ in ready])
        else:
            owner = [0] * len(ready)
            for n, (active, _) in enumerate(parts):
                for i in active:
                    owner[i] = n
            rows = [[i for i in range(len(ready)) if owner[i] == n] for n in range(len(parts))]
            joined = StepDrafts.concat([part.select(r) for (_, part), r in zip(parts, rows)])
            where = {i: pos for pos, i in enumerate(i for r in rows for i in r)}
            out = joined.select([where[i] for i in range(len(ready))])
        out.ready = list(ready)
        return out

    def next_logits(self, req_ids: list[str]) -> torch.Tensor:
        """The drafter's logits ``[n, draft_vocab]`` after each request's current draft
        tokens (each must have a token pending, as after :meth:`sync`)."""
        return self.ctx.next_logits([self.states[r] for r in req_ids])

    def _new_state(self, req_id: str, params: RequestParams, n_target: int) -> RequestState:
        draft: AlignedTokens | MappedTokens
        if self.id_map is not None:
            draft = MappedTokens(self.id_map)
        else:
            draft = AlignedTokens(self.bridge.draft_encoder, self.bridge.draft_prefix_ids, self.settings.lookbehind)
        gen = None
        if params.seed is not None:
            gen = new_generator(self.runtime.device, self._stream_seed(params, n_target))
        return RequestState(bytearray(), 0, [], draft, self.runtime.new_cache(), gen, params)

    @staticmethod
    def _stream_seed(params: RequestParams, n_target: int) -> int:
        """The seed of a seeded request's own draft random stream: its seed and where
        its state is (re)built, so a request rebuilt after preemption or a failure
        continues with fresh draws instead of replaying the ones its committed tokens
        were drafted with."""
        digest = hashlib.blake2b(f"seed:{params.seed}:{n_target}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") & ((1 << 63) - 1)

    def sync(self, req_ids: list[str], tokens: list[np.ndarray], params: list[RequestParams]) -> list[bool]:
        """Append newly committed target tokens as text and realign every request's
        draft tokens (one batched re-tokenization; through the id map instead where the
        vocabularies agree id for id). Per request, returns False when
        there is nothing to draft from yet (e.g. the text so far is one incomplete
        UTF-8 character and the drafter adds no prefix token)."""
        states, news = [], []
        for req_id, toks, p in zip(req_ids, tokens, params):
            state = self.states.get(req_id)
            if state is None or state.n_target > len(toks):
                self.drop(req_id)
                state = self.states[req_id] = self._new_state(req_id, p, len(toks))
            new = toks[state.n_target :]
            new_ids = new.tolist()
            state.text += b"".join(self.bridge.target_encoder.bytes_of(t) for t in new_ids)
            state.n_target = len(toks)
            state.target_tail = (state.target_tail + new_ids)[-_TARGET_TAIL:]
            states.append(state)
            news.append(new)
        if self.id_map is not None:
            kept = [s.draft.commit(new) for s, new in zip(states, news)]
        else:
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

    def _reserve(self, req_ids: list[str], ready: list[bool], budget: int, rules: list[str]) -> list[bool]:
        """Reserve KV blocks for this step's writes (pending tokens, drafts, and for
        slrs its first token's spelling) before any forward, so that a full pool
        leaves a request undrafted this step instead of failing mid-loop. A request
        whose draft sequence would pass the draft model's context length is left
        undrafted too."""
        out = []
        for req_id, ok, rule in zip(req_ids, ready, rules):
            if ok:
                draft_rule = self.draft_rules[rule]
                state = self.states[req_id]
                end = len(state.draft) + draft_rule.draft_steps(budget) + draft_rule.reserve_extra
                if end > self.runtime.max_len:
                    out.append(False)
                    continue
                try:
                    state.cache.reserve(end)
                except PoolExhausted:
                    self.stats.pool_full += 1
                    ok = False
            out.append(ok)
        return out
