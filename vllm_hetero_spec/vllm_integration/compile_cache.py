"""vLLM's compile cache, made to hit: a loaded inductor function that finishes loading,
one inductor cache shared by every configuration, and a hetero engine's target keyed
as the plain engine's.

Patches torch's ``BundledAOTAutogradSerializableCallable.deserialize_compile_artifacts``,
``vllm.compilation.decorators._try_load_aot_compiled_fn`` and
``vllm.compilation.caching.aot_compile_hash_factors``.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any

from vllm_hetero_spec.vllm_integration.patching import patch


def patch_aot_compile_load() -> None:
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
    torch's ``torch._dynamo.aot_compile_types``, the same module in torch 2.13 (vLLM
    0.32.0) and 2.14 (vLLM 0.33.0); vLLM's own functions already have the method and
    are left as they are."""
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as Bundled

    original = Bundled.deserialize_compile_artifacts.__func__

    def deserialize_compile_artifacts(cls: type, data: bytes) -> Any:
        fn = original(cls, data)
        if not hasattr(fn, "finalize_loading"):
            fn.finalize_loading = _finalized
        return fn

    patch(Bundled, "deserialize_compile_artifacts", classmethod(deserialize_compile_artifacts),
          patch_aot_compile_load.__doc__, checked_on=("0.32.0", "0.33.0"))


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


def patch_shared_inductor_cache() -> None:
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

    patch(decorators, "_try_load_aot_compiled_fn", _try_load_aot_compiled_fn, patch_shared_inductor_cache.__doc__,
          checked_on=("0.32.0", "0.33.0"))


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


def patch_target_compile_key() -> None:
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

    patch(caching, "aot_compile_hash_factors", aot_compile_hash_factors, patch_target_compile_key.__doc__,
          checked_on=("0.32.0", "0.33.0"))
