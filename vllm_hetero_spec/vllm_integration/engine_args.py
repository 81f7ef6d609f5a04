"""Engine arguments and the CLI: ``method: hetero`` becomes vLLM's ``custom_class``
before vLLM validates it, and ``--speculative-config`` takes a file as well as JSON.

Patches ``vllm.engine.arg_utils.EngineArgs`` (``create_speculative_config``,
``add_cli_args``); the checks against the target run in ``startup_checks.py``.
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

from vllm_hetero_spec.vllm_integration.patching import patch


def patch_engine_args() -> None:
    """Why: ``SpeculativeConfig`` rejects unknown keys and unknown methods. We translate
    ``method: hetero`` into vLLM's ``custom_class`` (pointing at our proposer) before
    vLLM sees it, validate our keys with clear errors, and ship our settings to every
    process through ``additional_config`` (which vLLM pickles to the workers)."""
    from vllm.engine.arg_utils import EngineArgs

    from vllm_hetero_spec.vllm_integration.startup_checks import is_hetero, prepare

    original = EngineArgs.create_speculative_config

    @functools.wraps(original)
    def create_speculative_config(self: EngineArgs, target_model_config: Any, target_parallel_config: Any):
        if isinstance(self.speculative_config, str):
            from vllm_hetero_spec.config import load_spec_dict

            self.speculative_config = load_spec_dict(self.speculative_config)
        if is_hetero(self.speculative_config):
            settings, vllm_spec = prepare(self.speculative_config, target_model_config, self)
            self.additional_config = {**(self.additional_config or {}), **settings}
            self.speculative_config = vllm_spec
        return original(self, target_model_config, target_parallel_config)

    patch(EngineArgs, "create_speculative_config", create_speculative_config, patch_engine_args.__doc__,
          checked_on=("0.32.0", "0.33.0"))


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


def patch_cli_args() -> None:
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

    patch(EngineArgs, "add_cli_args", staticmethod(add_cli_args), patch_cli_args.__doc__, checked_on=("0.32.0", "0.33.0"))


def is_hetero_spec(speculative_config: Any) -> bool:
    """Whether vLLM's ``SpeculativeConfig`` is ours (``method: hetero`` arrives as a
    ``custom_class`` naming our proposer)."""
    from vllm_hetero_spec.config import PROPOSER_CLASS

    return getattr(speculative_config, "method", None) == "custom_class" and \
        getattr(speculative_config, "model", None) == PROPOSER_CLASS


def patch_batch_size_schedule() -> None:
    """Why: vLLM 0.33.0's ``VllmConfig`` drops ``num_speculative_tokens_per_batch_size``
    (with a warning) for every method but its own on the V1 model runner
    (``_maybe_disable_dynamic_sd_for_v1``: "V1 requires proposer support"). Ours has it:
    the proposer drafts at most the k the scheduler grants each step
    (``proposer.cap_step``), as on 0.32.0, whose scheduler hands it over the same way.
    So a hetero config keeps its schedule, and every other config gets vLLM's check.
    0.32.0 has no such step: nothing to patch there."""
    from vllm.config import VllmConfig

    original = getattr(VllmConfig, "_maybe_disable_dynamic_sd_for_v1", None)
    if original is None:
        return

    @functools.wraps(original)
    def _maybe_disable_dynamic_sd_for_v1(self: Any) -> None:
        if not is_hetero_spec(self.speculative_config):
            original(self)

    patch(VllmConfig, "_maybe_disable_dynamic_sd_for_v1", _maybe_disable_dynamic_sd_for_v1,
          patch_batch_size_schedule.__doc__, checked_on=("0.33.0",))
