"""Request-level handling: the sampling parameters a hetero engine accepts, and our
per-request settings checked where vLLM can still answer the client
(``request_validation.py`` holds the checks).

Patches ``vllm.sampling_params.SamplingParams._validate_spec_decode``,
``vllm.v1.worker.gpu_model_runner.build_logitsprocs``, the OpenAI requests'
``to_sampling_params`` (chat and completion) and
``vllm.v1.engine.input_processor.InputProcessor._validate_params``.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hetero_spec.vllm_integration.engine_args import is_hetero_spec
from vllm_hetero_spec.vllm_integration.patching import patch


def patch_min_p_logit_bias() -> None:
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
        if not is_hetero_spec(speculative_config):
            validate(self, speculative_config)

    build = gpu_model_runner.build_logitsprocs

    @functools.wraps(build)
    def build_logitsprocs(vllm_config: Any, device: Any, is_pin_memory: bool, is_pooling_model: bool,
                          custom_logitsprocs: Any = ()) -> Any:
        spec = vllm_config.speculative_config
        if is_pooling_model or custom_logitsprocs or not is_hetero_spec(spec):
            return build(vllm_config, device, is_pin_memory, is_pooling_model, custom_logitsprocs)
        return logits_processor.LogitsProcessors(
            ctor(vllm_config, device, is_pin_memory) for ctor in logits_processor.BUILTIN_LOGITS_PROCESSORS
        )

    why = patch_min_p_logit_bias.__doc__
    patch(sampling_params.SamplingParams, "_validate_spec_decode", _validate_spec_decode, why, checked_on=("0.32.0", "0.33.0"))
    patch(gpu_model_runner, "build_logitsprocs", build_logitsprocs, why, checked_on=("0.32.0", "0.33.0"))


def patch_request_validation() -> None:
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
    from vllm_hetero_spec.vllm_integration.request_validation import check_extra_args

    for request_cls in (ChatCompletionRequest, CompletionRequest):
        to_params = request_cls.to_sampling_params

        @functools.wraps(to_params)
        def to_sampling_params(self: Any, *args: Any, _to_params: Any = to_params, **kwargs: Any) -> Any:
            params = _to_params(self, *args, **kwargs)
            check_extra_args(params.extra_args)
            return params

        patch(request_cls, "to_sampling_params", to_sampling_params, patch_request_validation.__doc__,
              checked_on=("0.32.0", "0.33.0"))

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

    patch(InputProcessor, "_validate_params", _validate_params, patch_request_validation.__doc__,
          checked_on=("0.32.0", "0.33.0"))
