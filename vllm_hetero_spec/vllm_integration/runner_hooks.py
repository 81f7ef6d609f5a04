"""The ``GPUModelRunner`` hooks: where vLLM's model runner meets our proposer and our
rejection sampler.

One engine step (:func:`_propose_hook`): the scheduler's k for the step goes to the
proposer (``cap_step``); vLLM's own ``propose_draft_token_ids`` calls
``HeteroProposer.propose`` with the batch, whose proposals go back to vLLM's scheduler
and whose verification plan the proposer keeps; the hook hands that plan to our sampler
(``take_verify_plan`` -> ``rejection_sampler.plan``), which verifies the proposals in
the next forward. The lifecycle hooks below install the sampler when the runner is
built, drop a request's draft state when vLLM drops the request, count the drafter in
the runner's memory profile and graph capture, and release the drafter at shutdown.

Patches ``vllm.v1.worker.gpu_model_runner.GPUModelRunner``: ``__init__``, ``shutdown``,
``propose_draft_token_ids``, ``_on_request_state_removed``, ``_update_states``,
``capture_model``, ``profile_run``, ``profile_cudagraph_memory``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm_hetero_spec.vllm_integration.cpu_fixes import filter_without_sort
from vllm_hetero_spec.vllm_integration.patching import patch

if TYPE_CHECKING:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_hetero_spec.vllm_integration.proposer import HeteroProposer

#: The runner's drafter when it is ours, else None (``patch_model_runner``'s ``ours``).
DrafterOf = Callable[["GPUModelRunner"], "HeteroProposer | None"]
Method = Callable[..., Any]


# -- one engine step --------------------------------------------------------------------


def _propose_hook(propose: Method, ours: DrafterOf) -> Method:
    """Around vLLM's ``propose_draft_token_ids``, inside which vLLM calls our proposer:
    the step's k in before, the step's verification plan out to the sampler after."""

    @functools.wraps(propose)
    def propose_draft_token_ids(self: GPUModelRunner, scheduler_output: Any, *args: Any, **kwargs: Any):
        drafter = ours(self)
        if drafter is not None:
            # vLLM hands a custom_class proposer no k; its batch-size schedule's k for
            # this step rides on the scheduler's output.
            drafter.cap_step(scheduler_output.num_spec_tokens_to_schedule)
        out = propose(self, scheduler_output, *args, **kwargs)
        if drafter is not None:
            self.rejection_sampler.plan = drafter.take_verify_plan()
        return out

    return propose_draft_token_ids


# -- lifecycle --------------------------------------------------------------------------


def _init_hook(init: Method, ours: DrafterOf) -> Method:
    """After vLLM builds the runner: the proposer gets the runner (request ids, sampling
    params), and our rejection sampler replaces vLLM's."""
    from vllm_hetero_spec.verify.sampler import BatchRows, HeteroRejectionSampler

    def batch_rows(batch: Any) -> BatchRows:
        """The rows as vLLM's input batch holds them, greedy as vLLM classified them
        (``greedy_reqs``: the rows whose temperature it stored as 0), each with the
        number of tokens it holds before this step's drafts (``num_tokens_no_spec``:
        synchronous scheduling, which vLLM keeps for ``custom_class`` proposers, has
        brought it up to date before the sampler runs): the position of the first token
        the row emits."""
        req_ids = list(batch.req_ids)
        positions = batch.num_tokens_no_spec[: len(req_ids)].tolist()
        return BatchRows(req_ids, [r in batch.greedy_reqs for r in req_ids], positions)

    @functools.wraps(init)
    def __init__(self: GPUModelRunner, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        drafter = ours(self)
        if drafter is not None:
            drafter.attach_runner(self)
            filter_without_sort(self.sampler)
            self.rejection_sampler = HeteroRejectionSampler(
                self.sampler, self.speculative_config, self.device, batch_rows=lambda: batch_rows(self.input_batch),
                fsd=drafter.divergence,
            )

    return __init__


def _removed_hook(removed: Method, ours: DrafterOf) -> Method:
    """A finished or aborted request's draft state goes with vLLM's."""

    @functools.wraps(removed)
    def _on_request_state_removed(self: GPUModelRunner, req_id: str, req_state: Any) -> None:
        drafter = ours(self)
        if drafter is not None:
            drafter.drop_request(req_id)
        removed(self, req_id, req_state)

    return _on_request_state_removed


def _preempted_hook(update: Method, ours: DrafterOf) -> Method:
    """A preempted request's draft state is dropped (rebuilt if it resumes)."""

    @functools.wraps(update)
    def _update_states(self: GPUModelRunner, scheduler_output: Any):
        drafter = ours(self)
        if drafter is not None:
            for req_id in scheduler_output.preempted_req_ids or ():
                drafter.drop_request(req_id)
        return update(self, scheduler_output)

    return _update_states


def _capture_hook(capture: Method, ours: DrafterOf) -> Method:
    """The drafter's CUDA graphs in the runner's capture phase."""

    @functools.wraps(capture)
    def capture_model(self: GPUModelRunner) -> int:
        # The drafter's graphs first: the runner locks its workspace after capturing.
        drafter = ours(self)
        if drafter is not None:
            drafter.capture_graphs()
        return capture(self)

    return capture_model


def _profile_hook(profile: Method, ours: DrafterOf) -> Method:
    """The drafter's worst step inside the runner's memory profile."""

    @functools.wraps(profile)
    def profile_run(self: GPUModelRunner, *args: Any, **kwargs: Any) -> None:
        profile(self, *args, **kwargs)
        drafter = ours(self)
        if drafter is not None:
            drafter.profile(self.max_num_tokens, self.max_num_reqs)

    return profile_run


def _graph_memory_hook(estimate_graphs: Method, ours: DrafterOf) -> Method:
    """The drafter's graphs' memory added to the runner's own graph estimate."""

    @functools.wraps(estimate_graphs)
    def profile_cudagraph_memory(self: GPUModelRunner) -> int:
        estimate = estimate_graphs(self)
        drafter = ours(self)
        if drafter is not None:
            estimate += drafter.graph_memory()
        return estimate

    return profile_cudagraph_memory


def _shutdown_hook(shutdown: Method, ours: DrafterOf) -> Method:
    """The drafter's executor (a Ray actor and cluster) released with the runner."""

    @functools.wraps(shutdown)
    def shutdown_runner(self: GPUModelRunner) -> None:
        drafter = ours(self)
        if drafter is not None:
            drafter.shutdown()
        shutdown(self)

    return shutdown_runner


def patch_model_runner() -> None:
    """Why: a ``custom_class`` proposer gets no request ids, cannot return draft
    probabilities, cannot choose the rejection sampler and is not told the k of vLLM's
    batch-size schedule. After the runner is built we hand our proposer the runner and
    install our rejection sampler; before each proposal we hand it the scheduler's k for
    the step (``num_spec_tokens_to_schedule``); after each proposal
    we hand the sampler the step's verification plan (compact q, greedy requests,
    union's forced rejections, fsd's thresholds: one object, keyed by request id, instead
    of vLLM's dense ``[B, K, V]`` draft-probabilities slot); we tell the proposer when
    requests finish, abort or are preempted, let it run the drafter's worst step in the
    runner's memory profile (``profile_run``), add its graphs' memory to the runner's
    own graph estimate (``profile_cudagraph_memory``, which vLLM subtracts from the KV
    cache's share) and capture its CUDA graphs in the runner's capture phase
    (``capture_model``: vLLM calls a ``custom_class`` proposer's ``dummy_run`` in none
    of these), and let it release its executor (a Ray actor and cluster)
    when the runner shuts down."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_hetero_spec.vllm_integration.proposer import HeteroProposer

    def ours(runner: GPUModelRunner) -> HeteroProposer | None:
        """The runner's drafter when it is ours (the patches leave other methods alone)."""
        drafter = getattr(runner, "drafter", None)
        return drafter if isinstance(drafter, HeteroProposer) else None

    why, checked_on = patch_model_runner.__doc__, ("0.32.0", "0.33.0")
    patch(GPUModelRunner, "__init__", _init_hook(GPUModelRunner.__init__, ours), why, checked_on=checked_on)
    patch(GPUModelRunner, "shutdown", _shutdown_hook(GPUModelRunner.shutdown, ours), why, checked_on=checked_on)
    patch(GPUModelRunner, "propose_draft_token_ids", _propose_hook(GPUModelRunner.propose_draft_token_ids, ours),
          why, checked_on=checked_on)
    patch(GPUModelRunner, "_on_request_state_removed",
          _removed_hook(GPUModelRunner._on_request_state_removed, ours), why, checked_on=checked_on)
    patch(GPUModelRunner, "_update_states", _preempted_hook(GPUModelRunner._update_states, ours), why,
          checked_on=checked_on)
    patch(GPUModelRunner, "capture_model", _capture_hook(GPUModelRunner.capture_model, ours), why,
          checked_on=checked_on)
    patch(GPUModelRunner, "profile_run", _profile_hook(GPUModelRunner.profile_run, ours), why, checked_on=checked_on)
    patch(GPUModelRunner, "profile_cudagraph_memory",
          _graph_memory_hook(GPUModelRunner.profile_cudagraph_memory, ours), why, checked_on=checked_on)
