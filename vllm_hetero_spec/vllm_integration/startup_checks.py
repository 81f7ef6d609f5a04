"""Start-up checks run once in the process that parses the config (fail fast there)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from transformers import AutoConfig

from vllm_hetero_spec.config import (
    ADDITIONAL_CONFIG_KEY,
    HeteroConfigError,
    HeteroSettings,
    is_hetero,
    parse_settings,
)
from vllm_hetero_spec.log import plugin_logger
from vllm_hetero_spec.model_names import (
    ModelNotFound, draft_model_folder, draft_tokenizer_folder, target_tokenizer_folder)
from vllm_hetero_spec.vocab.bridge import VocabBridge

logger = plugin_logger(__name__)

__all__ = ["is_hetero", "prepare"]


def _check_architecture(model: str, architectures: list[str]) -> None:
    """The drafter is built by vLLM's own loader, so its architecture must be one vLLM
    runs; say so here, at start-up, rather than as a traceback from a worker."""
    from vllm.model_executor.models import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    if not any(arch in supported for arch in architectures):
        raise HeteroConfigError(
            f"'model' = {model!r} has architecture {architectures or 'unknown'}, which vLLM cannot run; "
            "choose a draft model whose architecture vLLM supports (e.g. Llama, Qwen2, Gemma-3)"
        )


def _id_mapped_candidates(settings: HeteroSettings, spec: dict[str, Any]) -> HeteroSettings:
    """``auto``'s candidates for a pair that agrees id for id, where the config does not
    list them: ``tli`` alone. Over one vocabulary ``tli`` drafts exactly the drafter's
    tokens with its exact distribution as q (standard speculative decoding, as vLLM's
    ``draft_model`` does); the string-level rules would only add re-tokenization, and
    exploring them costs steps."""
    if settings.algorithm != "auto":
        return settings
    given = {key: tuple(getattr(settings, key)) for key in ("auto_greedy", "auto_sampled") if key in spec}
    return dataclasses.replace(settings, **{"auto_greedy": ("tli",), "auto_sampled": ("tli",), **given})


#: vLLM's words in an error about a draft-model key, and the key (the first that matches).
_KEY_WORDS = (("quantiz", "quantization"), ("max_model_len", "max_model_len"), ("revision", "revision"),
              ("trust_remote_code", "trust_remote_code"), ("load_format", "draft_load_config"))


def check_draft_model_config(settings: HeteroSettings, target_model_config: Any | None,
                             target_args: Any | None) -> None:
    """Build the drafter's own ``VllmConfig`` from the arguments its runtime will use
    (``drafter/runtime/model.py``: its dtype as resolved for the target, what it
    inherits from the target's engine arguments), so that vLLM's checks of a
    draft-model key (a quantization the checkpoint, dtype or platform lacks, a length
    past the model's, a revision that does not exist) stop start-up naming the key,
    not a worker with a traceback."""
    from vllm_hetero_spec.drafter import (RuntimeConfig, cpu_flags, draft_load, draft_vllm_config,
                                          platform_device_type, resolve_draft_dtype)

    load = draft_load(settings, bool(getattr(target_args, "trust_remote_code", False)),
                      getattr(target_args, "download_dir", None), getattr(target_args, "load_format", "auto"),
                      getattr(target_args, "moe_backend", None))
    dtype, _ = resolve_draft_dtype(settings.draft_dtype, getattr(target_model_config, "dtype", None),
                                   platform_device_type(), cpu_flags())
    try:
        draft_vllm_config(RuntimeConfig(settings.draft_model, getattr(torch, dtype),
                                        max_model_len=settings.max_model_len, load=load))
    except Exception as e:  # vLLM raises ValueError, pydantic's ValidationError, OSError, ...
        errors = getattr(e, "errors", None)  # pydantic: the messages, without its header and links
        text = "; ".join(err["msg"] for err in errors()) if callable(errors) else str(e).strip()
        words = ((settings.quantization, "quantization"),) if settings.quantization else ()
        key = next((k for word, k in (*words, *_KEY_WORDS) if word in text), "model")
        raise HeteroConfigError(
            f"'{key}': vLLM refuses the drafter's config: {text or type(e).__name__}; fix '{key}' or drop it") from None


def prepare(spec: dict[str, Any], target_model_config: Any,
            target_args: Any | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Validate a ``method: hetero`` spec against the target; return the
    ``additional_config`` entries for the workers and the spec dict for vLLM.
    ``target_args``: the target's ``EngineArgs``, whose loading settings the drafter
    inherits (``trust_remote_code``, ``download_dir``, ``load_format``)."""
    settings, vllm_spec = parse_settings(spec)
    try:
        draft_folder = draft_model_folder(settings)
        draft_tok, target_tok = draft_tokenizer_folder(settings), target_tokenizer_folder(target_model_config)
    except ModelNotFound as err:
        raise HeteroConfigError(str(err)) from None
    try:
        draft_cfg = AutoConfig.from_pretrained(draft_folder)
    except Exception as e:  # transformers raises many types for a bad folder
        raise HeteroConfigError(f"'model' = {settings.draft_model!r} cannot be loaded ({e}); point it at a causal LM folder") from e
    _check_architecture(settings.draft_model, getattr(draft_cfg, "architectures", None) or [])
    check_draft_model_config(settings, target_model_config, target_args)
    draft_vocab = draft_cfg.get_text_config().vocab_size
    try:
        bridge = VocabBridge.build(str(draft_tok), str(target_tok), draft_vocab, target_model_config.get_vocab_size())
    except Exception as e:
        raise HeteroConfigError(
            f"'draft_tokenizer' = {settings.draft_tokenizer!r} cannot be loaded ({e}); point it at a tokenizer folder"
        ) from e
    shared = bridge.intersection.size
    if shared < settings.min_shared_tokens:
        raise HeteroConfigError(
            f"draft and target tokenizers share only {shared} token strings (< 'min_shared_tokens' = "
            f"{settings.min_shared_tokens}); no usable overlap: choose a draft model whose tokenizer "
            "covers the target's text, or lower 'min_shared_tokens'"
        )
    logger.info(
        "hetero spec: algorithm=%s, draft=%s -> target=%s, shared token strings=%d (draft vocab %d, target "
        "vocab %d), k=%d",
        settings.algorithm,
        settings.draft_model,
        target_model_config.model,
        shared,
        draft_vocab,
        target_model_config.get_vocab_size(),
        settings.num_speculative_tokens,
    )
    if bridge.active_id_map(settings.id_map) is not None:
        settings = _id_mapped_candidates(settings, spec)
        logger.info(
            "hetero spec: the vocabularies agree id for id (%d ids differ): the drafter reads the target's ids "
            "through an id map, no re-tokenization ('id_map'); auto's candidates: greedy %s, sampled %s",
            len(bridge.id_map.differing), list(settings.auto_greedy), list(settings.auto_sampled),
        )
    if bridge.same_vocab:
        logger.info(
            "hetero spec: draft and target share one vocabulary; vLLM's own method='draft_model' would also serve "
            "this pair (`python -m vllm_hetero_spec advise` measures both)"
        )
    return {ADDITIONAL_CONFIG_KEY: settings.to_dict()}, vllm_spec
