"""Start-up checks run once in the process that parses the config (fail fast there)."""

from __future__ import annotations

import dataclasses
from typing import Any

from transformers import AutoConfig

from vllm_hetero_spec.config import (
    ADDITIONAL_CONFIG_KEY,
    HeteroConfigError,
    HeteroSettings,
    is_hetero,
    parse_settings,
)
from vllm_hetero_spec.log import plugin_logger
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


def prepare(spec: dict[str, Any], target_model_config: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Validate a ``method: hetero`` spec against the target; return the
    ``additional_config`` entries for the workers and the spec dict for vLLM."""
    settings, vllm_spec = parse_settings(spec)
    try:
        draft_cfg = AutoConfig.from_pretrained(settings.draft_model)
    except Exception as e:  # transformers raises many types for a bad folder
        raise HeteroConfigError(f"'model' = {settings.draft_model!r} cannot be loaded ({e}); point it at a causal LM folder") from e
    _check_architecture(settings.draft_model, getattr(draft_cfg, "architectures", None) or [])
    draft_vocab = draft_cfg.get_text_config().vocab_size
    try:
        bridge = VocabBridge.build(
            settings.draft_tokenizer, target_model_config.tokenizer, draft_vocab, target_model_config.get_vocab_size()
        )
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
