"""The vLLM-facing proposer: per-request draft state, one packed draft loop per step.

vLLM calls :meth:`HeteroProposer.propose` after each verification step with the rows of
its persistent batch. For every row we (1) feed the newly committed target tokens to the
request's draft-side tokenization as text (look-behind realignment, KV rollback),
(2) run the drafter for all requests at once, and (3) hand back target-vocabulary
proposals -- re-tokenized draft text for ``slem`` and ``dtw``, intersection-mapped ids
with their exact draft distribution for the token-level algorithms (``tli``, ``fsd``,
``union``), and for ``slrs`` a first target token sampled from the drafter's
string-level law psi (``drafter/slrs.py``) followed by re-tokenized draft text. What
verification needs beyond vLLM's draft-probability slot (``union``'s
forced rejections, ``fsd``'s per-request threshold) is kept as a :class:`VerifyPlan`
that the rejection sampler collects through :meth:`HeteroProposer.verify_inputs`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from vllm.config import VllmConfig
from vllm.logger import init_logger

from vllm_hetero_spec.alignment import dtw_align_batch
from vllm_hetero_spec.config import ADDITIONAL_CONFIG_KEY, HeteroSettings, request_fsd_threshold
from vllm_hetero_spec.dtw import transfer_probs
from vllm_hetero_spec.drafter.kv_cache import RequestKVCache
from vllm_hetero_spec.drafter.runtime import DraftModelRuntime
from vllm_hetero_spec.drafter.sampling import SamplingRows, processed_probs, sample
from vllm_hetero_spec.drafter.slrs import StringLevelProposer
from vllm_hetero_spec.drafter.token_level import RESTRICTED, TOKEN_LEVEL, draft_step
from vllm_hetero_spec.metrics import MetricsBoard
from vllm_hetero_spec.verify.plan import VerifyPlan
from vllm_hetero_spec.verify.rules import FuzzyAcceptance
from vllm_hetero_spec.vocab.bridge import VocabBridge
from vllm_hetero_spec.vocab.retokenize import AlignedTokens, propose_continuations, sync_batch

logger = init_logger(__name__)

_TARGET_TAIL = 4  # committed target tokens re-encoded with the draft text (slem)


@dataclass
class RequestState:
    """What the drafter knows about one request between steps."""

    text: bytearray
    n_target: int
    target_tail: list[int]
    draft: AlignedTokens
    cache: RequestKVCache
    generator: torch.Generator | None
    fsd_threshold: float


@dataclass
class DraftOutput:
    """One step's drafts for the active requests (see ``HeteroProposer._draft``)."""

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
class ProposerStats:
    """Counters exposed to benchmarks and metrics."""

    steps: int = 0
    bridge_s: float = 0.0
    draft_s: float = 0.0
    proposed: int = 0
    realign_mismatches: int = 0
    fallbacks: int = 0
    undrafted: int = 0
    slrs_nodes: int = 0
    slrs_capped: int = 0
    slrs_uncovered: int = 0

    def as_metrics(self) -> dict[str, float]:
        """The counters under their ``hetero:*`` metric names (see ``metrics.COUNTERS``)."""
        return {
            "steps": self.steps,
            "bridge_seconds": self.bridge_s,
            "draft_seconds": self.draft_s,
            "proposed_tokens": self.proposed,
            "realign_mismatches": self.realign_mismatches,
            "fallbacks": self.fallbacks,
            "undrafted_requests": self.undrafted,
            "slrs_tree_nodes": self.slrs_nodes,
            "slrs_capped_candidates": self.slrs_capped,
            "slrs_uncovered_requests": self.slrs_uncovered,
        }


class HeteroProposer:
    """A ``custom_class`` proposer for heterogeneous-vocabulary drafting."""

    def __init__(self, vllm_config: VllmConfig):
        raw = (vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
        if raw is None:
            raise RuntimeError("HeteroProposer needs method='hetero' in speculative_config")
        self.settings = HeteroSettings.from_dict(raw)
        self.k = self.settings.num_speculative_tokens
        target_vocab = vllm_config.model_config.get_vocab_size()
        dtype = getattr(torch, self.settings.draft_dtype)
        self.runtime = DraftModelRuntime(self.settings.draft_model, dtype)
        self.bridge = VocabBridge.build(
            self.settings.draft_tokenizer,
            vllm_config.model_config.tokenizer,
            self.runtime.vocab_size,
            target_vocab,
        )
        self.target_vocab = target_vocab
        self.states: dict[str, RequestState] = {}
        self.stats = ProposerStats()
        self.board = MetricsBoard(
            {
                "algorithm": self.settings.algorithm,
                "draft": Path(self.settings.draft_model).name,
                "target": Path(str(vllm_config.model_config.model)).name,
                "k": str(self.k),
            }
        )
        self.runner: Any = None
        self._last_probs: torch.Tensor | None = None
        self._plan: VerifyPlan | None = None
        self._draft_specials = {
            tid for tid, b in enumerate(self.bridge.draft_encoder.token_bytes) if b is None
        } | set(self.bridge.draft_tokenizer.all_special_ids)
        self._target_eos = self.bridge.target_tokenizer.eos_token_id
        self.string_level = None
        if self.settings.algorithm == "slrs":
            self.string_level = StringLevelProposer(
                self.bridge.draft_bytes,
                self.bridge.target_bytes,
                self.bridge.target_encoder,
                self._target_eos,
                target_vocab,
                self.settings.slrs_max_nodes,
                self.settings.slrs_candidates,
                self.settings.slrs_min_prob,
            )
        logger.info(
            "hetero spec: algorithm=%s k=%d draft=%s; shared tokens=%d",
            self.settings.algorithm,
            self.k,
            self.settings.draft_model,
            self.bridge.intersection.size,
        )

    # -- vLLM hooks -------------------------------------------------------------------

    def attach_runner(self, runner: Any) -> None:
        """The model runner, for request ids and sampling params (not in propose's args)."""
        self.runner = runner

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """The drafter is loaded at construction; nothing to share with the target."""

    def drop_request(self, req_id: str) -> None:
        """Forget a finished, aborted or preempted request (rebuilt if it resumes)."""
        if self.states.pop(req_id, None) is not None:
            self._publish_states()

    def take_last_draft_probs(self) -> torch.Tensor | None:
        probs, self._last_probs = self._last_probs, None
        return probs

    def verify_inputs(self, b: int, k: int) -> tuple[torch.Tensor | None, FuzzyAcceptance | None]:
        """The last proposal step's forced rejections and fuzzy test, laid out for the
        ``b`` rows being verified (the runner's batch order at verification). Called by
        the rejection sampler once per verification; the plan is used once."""
        plan, self._plan = self._plan, None
        if plan is None:
            return None, None
        req_ids = list(self.runner.input_batch.req_ids)
        if len(req_ids) != b:
            raise RuntimeError(f"hetero spec: verifying {b} rows but the batch holds {len(req_ids)} requests")
        return plan.block(req_ids, k)

    # -- per-step work ----------------------------------------------------------------

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """Drafts per row of the batch. Never raises: an exception here would kill the
        engine (and every request on it), while a step without drafts is always correct.
        So a failure is logged and counted, the draft state (possibly inconsistent) is
        dropped and rebuilt from the target's tokens, and this step runs undrafted."""
        try:
            out = self._propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        except Exception:
            logger.exception("hetero spec: drafting failed; this step runs without drafts")
            self.stats.fallbacks += 1
            self.states.clear()
            self._last_probs, self._plan = None, None
            out = [[] for _ in sampled_token_ids]
        self._publish()
        return out

    def _publish(self) -> None:
        """Copy the counters and the state size to the metrics board (memory writes)."""
        for name, value in self.stats.as_metrics().items():
            self.board.set(name, value)
        self._publish_states()

    def _publish_states(self) -> None:
        self.board.set("request_states", len(self.states))
        self.board.set(
            "draft_state_bytes", sum(s.cache.nbytes + s.draft.nbytes + len(s.text) for s in self.states.values())
        )

    def _propose(
        self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray
    ) -> list[list[int]]:
        req_ids: list[str] = list(self.runner.input_batch.req_ids)
        self._plan = None
        self._forget_stale(req_ids)
        t0 = time.perf_counter()
        # Rows still prefilling have sampled nothing yet: nothing to draft from.
        rows = [row for row in range(len(req_ids)) if sampled_token_ids[row]]
        ready = self._sync([req_ids[r] for r in rows], [token_ids_cpu[r, : int(num_tokens_no_spec[r])] for r in rows])
        active = [row for row, ok in zip(rows, ready) if ok]
        self.stats.undrafted += len(rows) - len(active)
        t1 = time.perf_counter()
        first = self._first_tokens([req_ids[r] for r in active]) if self.string_level is not None else {}
        drafting = [r for r in active if req_ids[r] not in first or first[req_ids[r]].continues]
        draft = self._draft([req_ids[r] for r in drafting])
        t2 = time.perf_counter()
        out: list[list[int]] = [[] for _ in req_ids]
        if self.settings.algorithm in TOKEN_LEVEL:
            full = torch.zeros(len(req_ids), self.k, self.target_vocab)
            plan = self._new_plan()
            for i, row in enumerate(active):
                req_id = req_ids[row]
                out[row] = draft.ids[i]
                if draft.ids[i]:
                    full[row, : len(draft.ids[i])] = draft.q_rows[i]
                if any(draft.absent[i]):
                    plan.force_reject[req_id] = draft.absent[i]
                if plan.fsd_threshold is not None:
                    plan.fsd_threshold[req_id] = self.states[req_id].fsd_threshold
            self._last_probs = full
            self._plan = plan
        else:
            drafted = dict(zip(drafting, draft.ids))
            proposals = self._to_target([req_ids[r] for r in active], [drafted.get(r, []) for r in active], first)
            for row, ids in zip(active, proposals):
                out[row] = ids
            if self.settings.algorithm == "dtw" and self.settings.dtw_verify == "faithful":
                self._last_probs = self._dtw_probs(active, draft, out, len(req_ids))
            if self.string_level is not None:
                self._last_probs = self._first_token_probs(req_ids, out, first)
        t3 = time.perf_counter()
        self.stats.steps += 1
        self.stats.bridge_s += (t1 - t0) + (t3 - t2)
        self.stats.draft_s += t2 - t1
        self.stats.proposed += sum(len(o) for o in out)
        return out

    def _new_plan(self) -> VerifyPlan:
        fsd = self.settings.algorithm == "fsd"
        return VerifyPlan({}, {} if fsd else None, self.settings.fsd_divergence, self.settings.fsd_topk)

    def _forget_stale(self, live: list[str]) -> None:
        known = set(self.runner.requests) if self.runner is not None else set(live)
        for req_id in [r for r in self.states if r not in known]:
            del self.states[req_id]

    def _new_state(self, req_id: str) -> RequestState:
        params = self.runner.requests[req_id].sampling_params
        gen = None
        if params is not None and params.seed is not None:
            gen = torch.Generator().manual_seed(int(params.seed) + 0x5EED)
        tau = self.settings.fsd_threshold
        if self.settings.algorithm == "fsd" and params is not None:
            try:
                tau = request_fsd_threshold(params.extra_args, tau)
            except ValueError as err:
                # The front end rejects bad values (validation.py); a request that
                # bypassed it must not take the engine down: keep the configured tau.
                logger.warning("request %s: %s; using fsd_threshold=%s", req_id, err, tau)
        draft = AlignedTokens(self.bridge.draft_encoder, self.bridge.draft_prefix_ids, self.settings.lookbehind)
        return RequestState(bytearray(), 0, [], draft, self.runtime.new_cache(), gen, tau)

    def _sync(self, req_ids: list[str], tokens: list[np.ndarray]) -> list[bool]:
        """Append newly committed target tokens as text and realign every request's
        draft tokens (one batched re-tokenization). Per request, returns False when
        there is nothing to draft from yet (e.g. the text so far is one incomplete
        UTF-8 character and the drafter adds no prefix token)."""
        states = []
        for req_id, toks in zip(req_ids, tokens):
            state = self.states.get(req_id)
            if state is None or state.n_target > len(toks):
                state = self.states[req_id] = self._new_state(req_id)
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

    def _sampling_rows(self, req_ids: list[str]) -> SamplingRows:
        temps, top_k, top_p = [], [], []
        for req_id in req_ids:
            p = self.runner.requests[req_id].sampling_params
            temps.append(float(p.temperature) if p is not None else 0.0)
            top_k.append(int(p.top_k) if p is not None and p.top_k else 0)
            top_p.append(float(p.top_p) if p is not None else 1.0)
        return SamplingRows(
            torch.tensor(temps),
            torch.tensor(top_k, dtype=torch.long),
            torch.tensor(top_p),
            [self.states[r].generator for r in req_ids],
        )

    def _draft(self, req_ids: list[str]) -> DraftOutput:
        """Run the packed draft loop: per request the proposals (draft ids for slem and
        dtw, target ids for the token-level algorithms), each token's probability under
        the distribution it was sampled from, and for the token-level algorithms the full
        ``[n, target_vocab]`` q rows and which proposals the target lacks (union)."""
        algorithm = self.settings.algorithm
        token_level = algorithm in TOKEN_LEVEL
        n_steps = self.k if token_level else self.settings.max_draft_tokens
        drafts: list[list[int]] = [[] for _ in req_ids]
        proposals: list[list[int]] = [[] for _ in req_ids]
        absent: list[list[bool]] = [[] for _ in req_ids]
        token_q: list[list[float]] = [[] for _ in req_ids]
        probs: list[list[torch.Tensor]] = [[] for _ in req_ids]
        if not req_ids:
            return DraftOutput(drafts, token_q, [], absent)
        states = [self.states[r] for r in req_ids]
        rows = self._sampling_rows(req_ids)
        inter = self.bridge.intersection
        live = list(range(len(req_ids)))
        for step in range(n_steps):
            caches = [states[i].cache for i in live]
            pending = [states[i].draft.ids[states[i].cache.length :].tolist() for i in live]
            logits = self.runtime.forward(caches, pending)[:, : inter.draft_to_target.numel()]
            sub = SamplingRows(
                rows.temperature[live], rows.top_k[live], rows.top_p[live], [rows.generators[i] for i in live]
            )
            if token_level:
                mapped = draft_step(logits, sub, inter, algorithm)
                q, sampled = mapped.q, mapped.ids
                target_ids, is_absent = mapped.target_ids.tolist(), mapped.absent.tolist()
            else:
                q = processed_probs(logits, sub)
                sampled = sample(q, sub)
            # Confidence from the untempered draft distribution (q is one-hot when greedy).
            raw = logits.masked_fill(~inter.draft_mask, float("-inf")) if algorithm in RESTRICTED else logits
            confidence = raw.softmax(dim=-1).gather(1, sampled.unsqueeze(1)).squeeze(1).tolist()
            tokens = sampled.tolist()
            sampled_q = q.gather(1, sampled.unsqueeze(1)).squeeze(1).tolist()
            still = []
            for j, i in enumerate(live):
                tok = tokens[j]
                drafts[i].append(tok)
                token_q[i].append(sampled_q[j])
                if token_level:
                    proposals[i].append(target_ids[j])
                    absent[i].append(is_absent[j])
                    probs[i].append(mapped.target_q[j])
                    if is_absent[j]:
                        continue  # union: rejected for sure, so nothing after it can be accepted
                if tok in self._draft_specials:
                    continue
                states[i].draft.append_drafted(tok)
                if confidence[j] < self.settings.draft_stop_prob:
                    continue
                still.append(i)
            live = still
            if not live or step == n_steps - 1:
                break
        if token_level:
            return DraftOutput(proposals, token_q, [torch.stack(p) if p else torch.empty(0) for p in probs], absent)
        return DraftOutput(drafts, token_q, [], absent)

    def _to_target(
        self, req_ids: list[str], drafts: list[list[int]], first: dict[str, FirstToken] | None = None
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
        conts = propose_continuations(self.bridge.target_encoder, tails, texts, self.k)
        outs = []
        for cont, lead, stop in zip(conts, leads, stops):
            budget = self.k - len(lead)
            cont = cont[:budget]
            if stop and len(cont) < budget and self._target_eos is not None:
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
        sampled = [i for i in range(len(req_ids)) if not bool(rows.greedy[i])]
        if not sampled:
            return {}
        states = [self.states[req_ids[i]] for i in sampled]
        caches = [s.cache for s in states]
        pending = [s.draft.ids[s.cache.length :].tolist() for s in states]
        logits = self.runtime.forward(caches, pending)[:, : len(self.bridge.draft_bytes)]
        sub = SamplingRows(
            rows.temperature[sampled], rows.top_k[sampled], rows.top_p[sampled], [rows.generators[i] for i in sampled]
        )
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

    def _first_token_probs(
        self, req_ids: list[str], proposals: list[list[int]], first: dict[str, FirstToken]
    ) -> torch.Tensor:
        """slrs's q block: psi on C at a first token drawn from it, one-hot elsewhere
        (slem's rule, exact for any proposal)."""
        full = torch.zeros(len(req_ids), self.k, self.target_vocab)
        for row, (req_id, ids) in enumerate(zip(req_ids, proposals)):
            if ids:
                full[row, torch.arange(len(ids)), torch.tensor(ids)] = 1.0
            if req_id in first:
                full[row, 0] = first[req_id].q
        return full

    def _dtw_probs(self, active: list[int], draft: DraftOutput, proposals: list[list[int]], n_rows: int) -> torch.Tensor:
        """TokenTiming's transfer: align each request's draft tokens with its proxy
        (re-tokenized) tokens by DTW and carry the matched draft token's probability
        over as the proxy token's proposal probability (a one-entry q row)."""
        full = torch.zeros(n_rows, self.k, self.target_vocab)
        bodies = [[t for t in draft.ids[i] if t not in self._draft_specials] for i in range(len(active))]
        proxies = [[t for t in proposals[row] if t != self._target_eos] for row in active]
        results = dtw_align_batch(bodies, proxies, self.bridge.draft_encoder.packed, self.bridge.target_encoder.packed, self.settings.dtw_window)
        for i, row in enumerate(active):
            q = transfer_probs(results[i].path, draft.token_q[i], len(proposals[row]))
            for j, (tid, qj) in enumerate(zip(proposals[row], q)):
                full[row, j, tid] = qj
        return full
