"""The vLLM-facing proposer: turns the runner's batch into a draft request and back.

vLLM calls :meth:`HeteroProposer.propose` after each verification step with the rows of
its persistent batch. One step reads in one direction:

1. **batch**: each row's committed tokens and settings, read from the runner
   (``batch_requests.py``);
2. **plan**: how many tokens each row drafts and with which rule (``policy/step_policy.py``);
3. **drafts**: from the configured executor -- the drafting engine in this process, or
   a Ray actor on CPU cores (``drafter/placement/``) -- shared from TP rank 0 to every
   rank (``drafts_broadcast.py``);
4. **verification plan**: :class:`VerifyPlan` (``verify/plan.py``: q in compact form,
   which requests are verified one-hot, ``union``'s forced rejections, ``fsd``'s
   thresholds), which the runner's propose hook hands to the sampler
   (:meth:`HeteroProposer.take_verify_plan`, ``runner_hooks.py``); the proposals go back
   to vLLM's scheduler.

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
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from vllm.config import VllmConfig

from vllm_hetero_spec.config import ADDITIONAL_CONFIG_KEY, HeteroSettings
from vllm_hetero_spec.drafter import (DrafterHost, DrafterStats, RequestParams, RuntimeConfig, StepBatch,
                                      StepDrafts, divergence_rule, forward_only_rules, join_draft_tp_group,
                                      make_host, resolve_runtime_config)
from vllm_hetero_spec.log import plugin_logger
from vllm_hetero_spec.metrics import MetricsBoard
from vllm_hetero_spec.model_names import target_tokenizer_folder
from vllm_hetero_spec.policy.step_log import StepLog
from vllm_hetero_spec.policy.step_policy import StepPlan, StepPolicy
from vllm_hetero_spec.verify.plan import VerifyPlan
from vllm_hetero_spec.vllm_integration.batch_requests import asked_rule, grammar_cut, request_params, tokens_left
from vllm_hetero_spec.vllm_integration.drafts_broadcast import CHECK_RANKS_ENV, ranks_agree, share_drafts, tp_group

logger = plugin_logger(__name__)


class HeteroProposer:
    """A ``custom_class`` proposer for heterogeneous-vocabulary drafting."""

    def __init__(self, vllm_config: VllmConfig):
        raw = (vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
        if raw is None:
            raise RuntimeError("HeteroProposer needs method='hetero' in speculative_config")
        self.settings = s = HeteroSettings.from_dict(raw)
        self.k = s.num_speculative_tokens
        self.target_vocab = vllm_config.model_config.get_vocab_size()
        self._tp = tp_group()
        self._vllm_config = vllm_config
        # Under TP only rank 0 plans and drafts; every rank verifies what it broadcasts.
        self._lead = self._tp is None or self._tp.rank_in_group == 0
        self._check_ranks = self._tp is not None and os.environ.get(CHECK_RANKS_ENV) == "1"
        self.host: DrafterHost | None = None
        self.runtime_config: RuntimeConfig | None = None  # resolved when the drafter loads
        self.graphs_captured = 0  # draft CUDA graphs, once the capture phase ran
        self.graph_bytes = 0  # their memory as measured for vLLM's profile
        # fsd's divergence test, when a rule of this engine verifies with one: its
        # draft rule also reads each request's threshold.
        self._divergence_rule = divergence_rule(s)
        self.divergence = None if self._divergence_rule is None else self._divergence_rule.divergence(s)
        # Chosen where the drafts are made (rank 0 under TP).
        self.policy = StepPolicy(s.num_speculative_tokens, s.draft_budget, s.min_speculative_tokens,
                                 s.sampled_speculative_tokens,
                                 (s.auto_greedy, s.auto_sampled) if s.algorithm == "auto" else None,
                                 forward_only_rules())
        self._rules_offered = s.engine_rules()
        self._stats = DrafterStats()
        self.board = MetricsBoard({"algorithm": s.algorithm, "draft": Path(s.draft_model).name,
                                   "target": Path(str(vllm_config.model_config.model)).name, "k": str(self.k)})
        self.runner: Any = None
        self._plan: VerifyPlan | None = None
        logger.info("hetero spec: algorithm=%s k=%d draft=%s executor=%s", self._algorithm_text(), self.k,
                    s.draft_model, s.executor)

    def _algorithm_text(self) -> str:
        """The algorithm as logs show it (``auto`` with its candidates)."""
        s = self.settings
        if s.algorithm != "auto":
            return s.algorithm
        return f"auto (greedy: {', '.join(s.auto_greedy)}; sampled: {', '.join(s.auto_sampled)})"

    @property
    def stats(self) -> DrafterStats:
        """Counters so far (the executor's, plus the steps that failed here and the budget's)."""
        own = dataclasses.replace(self._stats, **self.policy.counters())
        if self.host is None:
            return own
        return dataclasses.replace(
            self.host.stats(), fallbacks=own.fallbacks, rank_checks=own.rank_checks,
            rank_mismatches=own.rank_mismatches, budget_sum=own.budget_sum, budget_steps=own.budget_steps,
            undrafted_steps=own.undrafted_steps,
        )

    @property
    def states(self) -> dict[str, Any]:
        """The in-process drafter's per-request states (empty for other executors)."""
        engine = getattr(self.host, "drafter", None)
        return engine.states if engine is not None else {}

    @property
    def step_log(self) -> StepLog | None:
        """``advise``'s step timings, once it pinned a setting (``advise/probe.py``)."""
        return self.policy.step_log

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
        if self.host is not None:
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
        self.host = make_host(self.settings, self.runtime_config, str(target_tokenizer_folder(model_config)),
                              self.target_vocab, int(model_config.seed or 0))

    def capture_graphs(self) -> int:
        """Capture the drafter's CUDA graphs; vLLM's runner calls this in its own capture
        phase (``runner_hooks.py``). Returns how many were captured."""
        if self.host is None:
            return 0
        n = self.graphs_captured = self.host.capture_graphs()
        if n:
            logger.info("hetero spec: captured %d draft CUDA graphs", n)
        return n

    def graph_memory(self) -> int:
        """Bytes the drafter's CUDA graphs will take, added to vLLM's own graph estimate
        (``runner_hooks.py``) so the KV cache is sized with them counted."""
        n = self.graph_bytes = self.host.graph_memory() if self.host is not None else 0
        if n:
            logger.info("hetero spec: draft CUDA graphs take %.1f MiB", n / (1 << 20))
        return n

    def profile(self, num_tokens: int, num_rows: int) -> None:
        """The drafter's transient peak inside vLLM's profile run (``runner_hooks.py``),
        so the memory vLLM leaves for the target's KV cache accounts for it. Only on an
        accelerator: on CPU the KV space is given explicitly, and a forward of
        ``max_num_batched_tokens`` would cost seconds of start-up."""
        if self.host is not None and self._vllm_config.device_config.device.type != "cpu":
            self.host.profile(num_tokens, num_rows)

    def pin(self, rule: str, k: int) -> None:
        """``advise``'s pin: every request drafts with ``rule`` and exactly ``k`` tokens
        (``StepPolicy.pin``)."""
        self.policy.pin(rule, k)

    def cap_step(self, k: int) -> None:
        """vLLM's batch-size schedule for the coming step (``StepPolicy.cap_step``)."""
        self.policy.cap_step(k)

    def drop_request(self, req_id: str) -> None:
        """Forget a finished, aborted or preempted request (rebuilt if it resumes)."""
        self.policy.forget(req_id)
        if self.host is not None:
            self.host.drop(req_id)
            # The gauges must follow now: an idle server runs no further step.
            self._publish_states(self.host.stats())

    def shutdown(self) -> None:
        """Release the executor (the Ray actor, and a cluster we started)."""
        if self.host is not None:
            self.host.close()

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

        Rows the plan gives 0 tokens (those still prefilling among them) are not sent to
        the drafter at all: their draft state catches up with the committed tokens the
        next time they draft, in that step's one forward."""
        start = time.perf_counter()
        # batch: [rows] of vLLM's persistent batch
        req_ids: list[str] = list(self.runner.input_batch.req_ids)
        sampled = [len(s) for s in sampled_token_ids[: len(req_ids)]]
        row_lengths = [int(n) for n in num_tokens_no_spec[: len(req_ids)]]
        drafts, rows, plan, params = None, [], None, []
        if self._lead:  # the other TP ranks take rank 0's drafts below
            params = [request_params(self.runner, r, self.settings, self._divergence_rule) for r in req_ids]
            asked = [asked_rule(self.runner, r, self._rules_offered) for r in req_ids] \
                if self.policy.rules is not None else [None] * len(req_ids)
            # plan
            left = [tokens_left(self.runner, r) for r in req_ids]
            plan = self.policy.plan(start, req_ids, sampled, [p.temperature for p in params], row_lengths, asked, left)
            if plan.rules is not None:
                params = [dataclasses.replace(p, rule=rule) for p, rule in zip(params, plan.rules)]
            # drafts
            drafts, rows = self._draft(req_ids, params, plan.lengths, token_ids_cpu, num_tokens_no_spec)
        if self._tp is not None:
            drafts, rows = share_drafts(self._tp, drafts, rows)
        if self._check_ranks:
            self._stats.rank_checks += 1
            self._stats.rank_mismatches += not ranks_agree(self._tp, req_ids, sampled_token_ids, drafts)
        # verification plan, and the proposals for vLLM's scheduler
        drafted = [req_ids[r] for r in rows]
        self._plan = None if drafts is None else VerifyPlan.for_drafts(
            drafted, drafts.q, drafts.q_index, drafts.force_reject, drafts.fsd_threshold,
            {r for r in drafted if grammar_cut(self.runner, r)}, self.settings.fsd_divergence, self.settings.fsd_topk)
        out: list[list[int]] = [[] for _ in req_ids]
        for row, ids in zip(rows, [] if drafts is None else drafts.ids):
            out[row] = ids
        if plan is not None:
            self._record(plan, req_ids, sampled, params, row_lengths, [len(o) for o in out], start)
        self._publish()
        return out

    def _draft(
        self, req_ids: list[str], params: list[RequestParams], lengths: list[int], token_ids_cpu: np.ndarray,
        num_tokens_no_spec: np.ndarray,
    ) -> tuple[StepDrafts | None, list[int]]:
        """The executor's drafts for the rows the plan gave a length (and those rows),
        or ``None`` when nothing drafts or drafting failed (logged, counted, the draft
        state reset)."""
        if self.host is None or not any(lengths):
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
            drafts = self.host.step(batch, set(self.runner.requests))
            if drafts is not None:
                drafts.truncate([lengths[r] for r in rows])
            return drafts, rows
        except Exception:
            logger.exception("hetero spec: drafting failed; this step runs without drafts")
            self._stats.fallbacks += 1
            self.host.reset()
            return None, []

    def _record(self, plan: StepPlan, req_ids: list[str], sampled: list[int], params: list[RequestParams],
                row_lengths: list[int], proposed: list[int], start: float) -> None:
        """Tell the policy what the step drafted and how long it took."""
        end = time.perf_counter()
        self.policy.record(plan, req_ids, sampled, [p.temperature for p in params], row_lengths, proposed, start, end)
        if logger.isEnabledFor(logging.DEBUG):  # VLLM_LOGGING_LEVEL=DEBUG
            why, rates, lump = self.policy.why(plan)
            logger.debug("hetero spec step: planned %s, proposed %s, rules %s in %.0f ms (%s; tok/s per k %s; "
                         "catch-up lump %d)", plan.lengths, proposed, plan.rules, 1e3 * (end - start), why,
                         [round(r, 2) for r in rates], lump)

    def _publish(self) -> None:
        """Copy the counters, the state size and the policy's gauges to the metrics board
        (memory writes)."""
        stats = self.stats
        for name, value in {**stats.as_metrics(), **self.policy.gauges()}.items():
            self.board.set(name, value)
        self._publish_states(stats)

    def _publish_states(self, stats: DrafterStats) -> None:
        self.board.set("request_states", stats.request_states)
        self.board.set("draft_state_bytes", stats.state_bytes)
        self.board.set("draft_pool_bytes", stats.pool_bytes)
