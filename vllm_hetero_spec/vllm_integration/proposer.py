"""The vLLM-facing proposer: turns the runner's batch into a draft request and back.

vLLM calls :meth:`HeteroProposer.propose` after each verification step with the rows of
its persistent batch. We read what the drafter needs from the runner (committed tokens,
sampling settings), hand it to the configured executor -- the drafting engine in this
process, or a Ray actor on CPU cores (``drafter/placement/executors.py``) -- and lay its answer
out the way vLLM and our rejection sampler read it: the proposals for vLLM, and one
:class:`VerifyPlan` per step for the sampler (q in compact form, which requests are
greedy, ``union``'s forced rejections, ``fsd``'s thresholds), which the runner's propose
hook hands over (:meth:`HeteroProposer.take_verify_plan`).

With a tensor-parallel target, rank 0 drafts (with a whole drafter: a small draft
model gains nothing from per-layer all-reduces) and broadcasts each step's drafts, their
compact q and the rows they belong to; the other ranks build their verification plan
from what they receive. vLLM's scheduler runs rank 0's proposals, so every rank must
verify those with that q: drafting on every rank and trusting the drafts to agree would
let one rank's failure, or its kernels rounding another way, make the ranks sample
different tokens, and their KV caches drift apart without a word. A Ray drafter is
asked by rank 0 the same way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from vllm.config import VllmConfig

from vllm_hetero_spec.policy.step_log import StepLog
from vllm_hetero_spec.config import ADDITIONAL_CONFIG_KEY, HeteroSettings, request_rule
from vllm_hetero_spec.drafter.messages import DrafterStats, RequestParams, StepBatch, StepDrafts
from vllm_hetero_spec.drafter.placement.executors import DraftExecutor, make_executor
from vllm_hetero_spec.drafter.runtime.config import RuntimeConfig, resolve_runtime_config
from vllm_hetero_spec.drafter.runtime.tp_group import join_draft_tp_group
from vllm_hetero_spec.drafter.sampling import GREEDY_EPS
from vllm_hetero_spec.drafter.strategies.registry import divergence_strategy, forward_only_rules
from vllm_hetero_spec.log import plugin_logger
from vllm_hetero_spec.metrics import MetricsBoard
from vllm_hetero_spec.model_names import target_tokenizer_folder
from vllm_hetero_spec.policy.budget import FixedBudget, make_budget
from vllm_hetero_spec.policy.rule_choice import RuleChooser
from vllm_hetero_spec.verify.plan import VerifyPlan
from vllm_hetero_spec.vllm_integration.drafts_broadcast import share_drafts

logger = plugin_logger(__name__)

CHECK_RANKS_ENV = "VLLM_HETERO_SPEC_CHECK_RANKS"


def _tp_group() -> Any:
    """vLLM's tensor-parallel group when there is more than one rank, else None."""
    try:
        from vllm.distributed import parallel_state

        group = parallel_state.get_tp_group()
    except (AssertionError, ImportError, AttributeError):
        return None
    return group if group.world_size > 1 else None


def _own(asked: list[str | None], chosen: list[str]) -> list[str]:
    """Each row's rule: the one its request names, else the one ``auto`` chose."""
    return [a or c for a, c in zip(asked, chosen)]


class HeteroProposer:
    """A ``custom_class`` proposer for heterogeneous-vocabulary drafting."""

    def __init__(self, vllm_config: VllmConfig):
        raw = (vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
        if raw is None:
            raise RuntimeError("HeteroProposer needs method='hetero' in speculative_config")
        self.settings = HeteroSettings.from_dict(raw)
        self.k = self.settings.num_speculative_tokens
        self.target_vocab = vllm_config.model_config.get_vocab_size()
        self._tp = _tp_group()
        self._vllm_config = vllm_config
        # Under TP only rank 0 plans and drafts; every rank verifies what it broadcasts.
        self._broadcast = self._tp is not None
        self._lead = self._tp is None or self._tp.rank_in_group == 0
        self._check_ranks = self._tp is not None and os.environ.get(CHECK_RANKS_ENV) == "1"
        self.executor: DraftExecutor | None = None
        self.runtime_config: RuntimeConfig | None = None  # resolved when the drafter loads
        self.graphs_captured = 0  # draft CUDA graphs, once the capture phase ran
        self.graph_bytes = 0  # their memory as measured for vLLM's profile
        # fsd's divergence test, when a rule of this engine verifies with one: its
        # strategy also reads each request's threshold.
        self._divergence_rule = divergence_strategy(self.settings)
        self.divergence = None if self._divergence_rule is None else self._divergence_rule.divergence(self.settings)
        # How many tokens each request drafts this step (0 included): chosen where the
        # drafts are made (rank 0 under TP).
        self.budget = make_budget(self.settings.draft_budget, self.k, self.settings.min_speculative_tokens,
                                  forward_only_rules())
        # The most tokens a request may draft this step: vLLM's batch-size schedule
        # (``num_speculative_tokens_per_batch_size``) for the step's batch, set by the
        # runner before each proposal (see :meth:`cap_step`); k when there is none.
        self.step_cap = self.k
        # algorithm: auto -- each request's rule per step, chosen (and shared) like its length.
        self.rules: RuleChooser | None = None
        if self.settings.algorithm == "auto":
            self.rules = RuleChooser(self.settings.auto_greedy, self.settings.auto_sampled)
        self._rules_offered = self.settings.engine_rules()
        self._stats = DrafterStats()
        self.step_log: StepLog | None = None  # advise's timings, when it asks (advise/probe.py)
        self.board = MetricsBoard(
            {
                "algorithm": self.settings.algorithm,
                "draft": Path(self.settings.draft_model).name,
                "target": Path(str(vllm_config.model_config.model)).name,
                "k": str(self.k),
            }
        )
        self.runner: Any = None
        self._plan: VerifyPlan | None = None
        logger.info(
            "hetero spec: algorithm=%s k=%d draft=%s executor=%s",
            self._algorithm_text(),
            self.k,
            self.settings.draft_model,
            self.settings.executor,
        )

    def _algorithm_text(self) -> str:
        """The algorithm as logs show it (``auto`` with its candidates)."""
        s = self.settings
        if s.algorithm != "auto":
            return s.algorithm
        return f"auto (greedy: {', '.join(s.auto_greedy)}; sampled: {', '.join(s.auto_sampled)})"

    @property
    def stats(self) -> DrafterStats:
        """Counters so far (the executor's, plus the steps that failed here)."""
        own = self._stats
        own.budget_sum = sum(k * n for k, n in self.budget.chosen.items())
        own.budget_steps = sum(self.budget.chosen.values())
        own.undrafted_steps = self.budget.chosen[0]
        if self.executor is None:
            return own
        return dataclasses.replace(
            self.executor.stats(), fallbacks=own.fallbacks, rank_checks=own.rank_checks,
            rank_mismatches=own.rank_mismatches, budget_sum=own.budget_sum, budget_steps=own.budget_steps,
            undrafted_steps=own.undrafted_steps,
        )

    @property
    def states(self) -> dict[str, Any]:
        """The in-process drafter's per-request states (empty for other executors)."""
        engine = getattr(self.executor, "engine", None)
        return engine.states if engine is not None else {}

    # -- vLLM hooks -------------------------------------------------------------------

    def attach_runner(self, runner: Any) -> None:
        """The model runner, for request ids and sampling params (not in propose's args)."""
        self.runner = runner

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Load the drafter (weights and KV pool), after the target: the runners call
        this before vLLM measures memory and sizes its own KV cache, so on CUDA the
        draft's memory is accounted for. Nothing is shared with the target. Under TP only
        rank 0 loads one; the others join the creation of its one-rank process groups,
        which torch.distributed makes collectively (a Ray drafter has its own world)."""
        if self.executor is not None:
            return
        if not self._lead:
            if self.settings.executor == "inprocess":
                join_draft_tp_group(self._vllm_config)
            return
        model_config = self._vllm_config.model_config
        # The Ray actor drafts on CPU cores, whatever the target's device.
        device_type = "cpu" if self.settings.executor == "ray" else None
        self.runtime_config, why = resolve_runtime_config(self.settings, self._vllm_config, device_type)
        logger.info("hetero spec: drafter runtime: %s", "; ".join(f"{key} {text}" for key, text in why.items()))
        self.executor = make_executor(self.settings, self.runtime_config, str(target_tokenizer_folder(model_config)),
                                      self.target_vocab, int(model_config.seed or 0))

    def capture_graphs(self) -> int:
        """Capture the drafter's CUDA graphs; vLLM's runner calls this in its own capture
        phase (``runner_hooks.py``). Returns how many were captured."""
        if self.executor is None:
            return 0
        n = self.graphs_captured = self.executor.capture_graphs()
        if n:
            logger.info("hetero spec: captured %d draft CUDA graphs", n)
        return n

    def graph_memory(self) -> int:
        """Bytes the drafter's CUDA graphs will take, added to vLLM's own graph estimate
        (``runner_hooks.py``) so the KV cache is sized with them counted."""
        n = self.graph_bytes = self.executor.graph_memory() if self.executor is not None else 0
        if n:
            logger.info("hetero spec: draft CUDA graphs take %.1f MiB", n / (1 << 20))
        return n

    def profile(self, num_tokens: int, num_rows: int) -> None:
        """The drafter's transient peak inside vLLM's profile run (``runner_hooks.py``),
        so the memory vLLM leaves for the target's KV cache accounts for it. Only on an
        accelerator: on CPU the KV space is given explicitly, and a forward of
        ``max_num_batched_tokens`` would cost seconds of start-up."""
        if self.executor is not None and self._vllm_config.device_config.device.type != "cpu":
            self.executor.profile(num_tokens, num_rows)

    def pin(self, rule: str, k: int) -> None:
        """Draft every request with ``rule`` (one of ``auto``'s candidates) and exactly
        ``k`` tokens (0: none) from now on, and log each
        step's timing. For ``advise``, which measures each rule and draft length on one
        engine rather than starting one per setting; verification is untouched, so every
        pinned setting is as lossless as the rule is."""
        if not 0 <= k <= self.k:
            raise ValueError(f"k must be in [0, {self.k}] (num_speculative_tokens), got {k}")
        candidates = set(self.settings.auto_greedy) | set(self.settings.auto_sampled)
        if self.rules is None:
            raise ValueError(f"rule {rule!r}: this engine does not choose rules (algorithm "
                             f"{self.settings.algorithm!r}); pinning needs algorithm auto")
        if rule not in candidates:
            raise ValueError(f"rule {rule!r} is not among this engine's auto candidates {sorted(candidates)}")
        self.rules = RuleChooser((rule,), (rule,))
        self.budget = FixedBudget(k)
        self.step_log = StepLog()

    def cap_step(self, k: int) -> None:
        """Draft at most ``k`` tokens a request in the coming proposal: the k vLLM's
        scheduler chose for this step's batch size from ``num_speculative_tokens_per_batch_size``
        (``num_speculative_tokens`` without one). A schedule is how a user (or ``advise``)
        says where drafting never pays: at a batch size capped to 0 the step skips the
        budget and the rule choice altogether, so it costs no warm-up step, probe or
        draft state's catch-up, none of which a budget free to choose can avoid; under
        a cap above 0 the budget still chooses, up to it. The cap overrides
        ``min_speculative_tokens``."""
        self.step_cap = max(0, min(int(k), self.k))

    def _row_caps(self, temperatures: list[float]) -> list[int]:
        """Per row, the most it may draft this step: the batch-size schedule's cap, and
        for a sampled row also ``sampled_speculative_tokens``. A row capped at 0 is not
        offered to the budget at all, so it neither drafts nor counts in its warm-up."""
        limit = self.settings.sampled_speculative_tokens
        sampled = self.step_cap if limit is None else min(self.step_cap, limit)
        return [self.step_cap if t < GREEDY_EPS else sampled for t in temperatures]

    def drop_request(self, req_id: str) -> None:
        """Forget a finished, aborted or preempted request (rebuilt if it resumes)."""
        self.budget.forget(req_id)
        if self.executor is not None:
            self.executor.drop(req_id)
            # The gauges must follow now: an idle server runs no further step.
            self._publish_states(self.executor.stats())

    def shutdown(self) -> None:
        """Release the executor (the Ray actor, and a cluster we started)."""
        if self.executor is not None:
            self.executor.close()

    def take_verify_plan(self) -> VerifyPlan | None:
        """The last proposal step's verification inputs (handed to the sampler once)."""
        plan, self._plan = self._plan, None
        return plan

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
        dropped and rebuilt from the target's tokens, and this step runs undrafted.

        The budget decides first how many tokens each row drafts (rows still
        prefilling have sampled nothing yet and draft nothing); rows at 0 are not
        sent to the drafter at all -- their draft state catches up with the committed
        tokens the next time they draft, in that step's one forward."""
        start = time.perf_counter()
        req_ids: list[str] = list(self.runner.input_batch.req_ids)
        sampled = [len(s) for s in sampled_token_ids[: len(req_ids)]]
        row_lengths = [int(n) for n in num_tokens_no_spec[: len(req_ids)]]
        drafts, rows, lengths, rules, temperatures = None, [], [], None, []
        if self._lead:  # the other TP ranks take rank 0's drafts below
            params = [self._params(r) for r in req_ids]
            temperatures = [p.temperature for p in params]
            self.budget.observe(start, req_ids, sampled)
            caps = self._row_caps(temperatures)
            drafting = [n > 0 and cap > 0 for n, cap in zip(sampled, caps)]
            if self.rules is not None:
                self.rules.observe(start, req_ids, sampled)
                asked = [self._asked_rule(r) for r in req_ids]
            if not any(caps):
                lengths = [0] * len(req_ids)
            else:
                if self.rules is not None:
                    rules = self.rules.choose(
                        temperatures, lambda rs: self.budget.would_draft(req_ids, drafting, row_lengths, _own(asked, rs)))
                    rules = _own(asked, rules)
                lengths = [min(n, cap) for n, cap in zip(self.budget.plan(req_ids, drafting, row_lengths, rules), caps)]
            if rules is not None:
                params = [dataclasses.replace(p, rule=rule) for p, rule in zip(params, rules)]
            drafts, rows = self._draft(req_ids, params, lengths, token_ids_cpu, num_tokens_no_spec)
        if self._broadcast:
            drafts, rows = share_drafts(self._tp, drafts, rows)
        if self._check_ranks:
            self._compare_ranks(req_ids, sampled_token_ids, drafts)
        self._install(req_ids, rows, drafts)
        out = [[] for _ in req_ids] if drafts is None else self._layout(req_ids, rows, drafts)
        end = time.perf_counter()
        if self._lead:
            proposed = [len(o) for o in out]
            self.budget.record(req_ids, proposed, end - start, end, row_lengths, rules)
            if rules is not None:
                self.rules.record(req_ids, temperatures, rules, proposed, [a is not None for a in asked])
            if self.step_log is not None:
                self.step_log.add(start, end, req_ids, sampled, proposed)
            if logger.isEnabledFor(logging.DEBUG):  # VLLM_LOGGING_LEVEL=DEBUG
                why, rates, lump = self.budget.last_plan if any(caps) else ("every row capped at k = 0", [], 0)
                logger.debug("hetero spec step: planned %s, proposed %s, rules %s in %.0f ms (%s; tok/s per k %s; "
                             "catch-up lump %d)", lengths, proposed, rules, 1e3 * (end - start), why,
                             [round(r, 2) for r in rates], lump)
        self._publish()
        return out

    def _draft(
        self, req_ids: list[str], params: list[RequestParams], lengths: list[int], token_ids_cpu: np.ndarray,
        num_tokens_no_spec: np.ndarray,
    ) -> tuple[StepDrafts | None, list[int]]:
        """The executor's drafts for the rows the budget gave a length (and those rows),
        or ``None`` when nothing drafts or drafting failed (logged, counted, the draft
        state reset)."""
        if self.executor is None or not any(lengths):
            return None, []
        rows = [row for row in range(len(req_ids)) if lengths[row] > 0]
        try:
            batch = StepBatch(
                [req_ids[r] for r in rows],
                [token_ids_cpu[r, : int(num_tokens_no_spec[r])].copy() for r in rows],
                [params[r] for r in rows],
                max(lengths),
                [lengths[r] for r in rows],
            )
            drafts = self.executor.step(batch, set(self.runner.requests))
            if drafts is not None:
                drafts.truncate([lengths[r] for r in rows])
            return drafts, rows
        except Exception:
            logger.exception("hetero spec: drafting failed; this step runs without drafts")
            self._stats.fallbacks += 1
            self.executor.reset()
            return None, []

    def _compare_ranks(self, req_ids: list[str], sampled: list[list[int]], drafts: StepDrafts | None) -> None:
        """A diagnostic (``VLLM_HETERO_SPEC_CHECK_RANKS=1``, one all-gather per step):
        every TP rank must have sampled the same tokens and drafted the same proposals,
        or their token histories, and so their KV caches, drift apart."""
        proposals = None if drafts is None else drafts.ids
        digest = hashlib.blake2b(repr((req_ids, sampled, proposals)).encode(), digest_size=16).hexdigest()
        digests: list[str | None] = [None] * self._tp.world_size
        torch.distributed.all_gather_object(digests, digest, group=self._tp.cpu_group)
        self._stats.rank_checks += 1
        self._stats.rank_mismatches += len(set(digests)) > 1

    def _params(self, req_id: str) -> RequestParams:
        p = self.runner.requests[req_id].sampling_params
        if p is None:
            return RequestParams()
        tau = self.settings.fsd_threshold
        try:
            if self._divergence_rule is not None:
                tau = self._divergence_rule.request_threshold(self.settings, p.extra_args)
        except ValueError as err:
            # The front end rejects bad values (request_validation.py); a request that
            # bypassed it must not take the engine down: keep the configured tau.
            logger.warning("request %s: %s; using fsd_threshold=%s", req_id, err, tau)
        return RequestParams(float(p.temperature), int(p.top_k or 0), float(p.top_p), p.seed, tau)

    def _asked_rule(self, req_id: str) -> str | None:
        """The rule the request names (``extra_args["algorithm"]``), or None: ``auto``
        chooses. The front end refuses a rule this engine lacks (request_validation.py);
        one that bypassed it is logged and left to ``auto``, never raised here."""
        p = self.runner.requests[req_id].sampling_params
        if p is None:
            return None
        try:
            return request_rule(p.extra_args, self._rules_offered)
        except ValueError as err:
            logger.warning("request %s: %s; auto chooses its rule", req_id, err)
            return None

    def _grammar_cut(self, req_id: str) -> bool:
        """Whether vLLM's scheduler cuts this request's drafts at the first token its
        grammar rejects (structured outputs): verified one-hot then (``verify/plan.py``)."""
        p = self.runner.requests[req_id].sampling_params
        return p is not None and p.structured_outputs is not None

    def _layout(self, req_ids: list[str], rows: list[int], drafts: StepDrafts) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in req_ids]
        for row, ids in zip(rows, drafts.ids):
            out[row] = ids
        return out

    def _install(self, req_ids: list[str], rows: list[int], drafts: StepDrafts | None) -> None:
        """Set this step's verification plan, keyed by request id (greedy rows are the
        sampler's to tell, from vLLM's batch)."""
        self._plan = None
        if drafts is None:
            return
        fsd = drafts.fsd_threshold is not None
        plan = VerifyPlan(
            drafts.q, {}, set(), {}, {} if fsd else None, self.settings.fsd_divergence, self.settings.fsd_topk
        )
        for i, row in enumerate(rows):
            req_id = req_ids[row]
            if drafts.q is not None:
                plan.q_index[req_id] = drafts.q_index[i]
            if self._grammar_cut(req_id):
                plan.one_hot.add(req_id)
            if i in drafts.force_reject:
                plan.force_reject[req_id] = drafts.force_reject[i]
            if fsd:
                plan.fsd_threshold[req_id] = drafts.fsd_threshold[i]
        self._plan = plan

    def _publish(self) -> None:
        """Copy the counters and the state size to the metrics board (memory writes)."""
        stats = self.stats
        for name, value in stats.as_metrics().items():
            self.board.set(name, value)
        self._publish_states(stats)
        self.board.set("draft_budget", self.budget.last_k)
        if self.rules is not None:
            for rule, n in self.rules.chosen.items():
                self.board.set(f"{rule}_request_steps", n)

    def _publish_states(self, stats: DrafterStats) -> None:
        self.board.set("request_states", stats.request_states)
        self.board.set("draft_state_bytes", stats.state_bytes)
        self.board.set("draft_pool_bytes", stats.pool_bytes)
