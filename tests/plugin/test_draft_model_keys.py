"""vLLM's draft-model keys (``SpeculativeConfig``'s) and the target settings a drafter
inherits: each is passed to the drafter and shown to take effect here, or refused at
start-up naming the key and the fix; none does nothing silently. docs/configuration.md
lists each with its handling."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from vllm_hetero_spec.config import HETERO_KEYS, HeteroConfigError, parse_settings
from vllm_hetero_spec.drafter.runtime.config import resolve_runtime_config, target_draft_load
from vllm_hetero_spec.drafter.runtime.model import draft_vllm_config, draft_engine_args
from vllm_hetero_spec.vllm_integration.startup_checks import check_draft_model_config


def _settings(model: str, **keys):
    return parse_settings({"method": "hetero", "model": model, "num_speculative_tokens": 3, **keys})[0]


def test_draft_model_keys_reach_the_drafters_vllm_config(smollm2: str) -> None:
    settings = _settings(smollm2, max_model_len=512, code_revision="main", attention_backend="CPU_ATTN",
                         enforce_eager=True, draft_load_config={"load_format": "dummy"})
    cfg, why = resolve_runtime_config(settings)
    assert cfg.max_model_len == 512 and cfg.attention_backend == "CPU_ATTN" and cfg.graph_sizes == ()
    assert "the config's" in why["attention"]
    vllm_config = draft_vllm_config(cfg)
    assert vllm_config.model_config.max_model_len == 512
    assert vllm_config.model_config.code_revision == "main"
    assert vllm_config.load_config.load_format == "dummy"
    assert draft_engine_args(cfg).attention_backend == "CPU_ATTN"


def test_moe_backend_reaches_the_drafters_engine_arguments(smollm2: str) -> None:
    import typing

    from vllm.config.kernel import MoEBackend

    name = next(b for b in typing.get_args(MoEBackend) if b != "auto")
    cfg, _ = resolve_runtime_config(_settings(smollm2, moe_backend=name))
    assert cfg.load.moe_backend == name and draft_engine_args(cfg).moe_backend == name


def test_the_drafter_inherits_the_targets_loading_settings(smollm2: str) -> None:
    """``trust_remote_code``, ``download_dir`` and ``load_format`` come from the target
    engine, as vLLM's own draft models take them; ``draft_load_config`` overrides."""
    target = SimpleNamespace(model_config=SimpleNamespace(trust_remote_code=True),
                             load_config=SimpleNamespace(download_dir="/models", load_format="safetensors"))
    load = target_draft_load(_settings(smollm2), target)
    assert (load.trust_remote_code, load.download_dir, load.load_format) == (True, "/models", "safetensors")
    own = target_draft_load(_settings(smollm2, draft_load_config={"download_dir": "/draft"}), target)
    assert (own.download_dir, own.load_format) == ("/draft", "safetensors")
    args = draft_engine_args(dataclasses.replace(resolve_runtime_config(_settings(smollm2))[0], load=load))
    assert (args.trust_remote_code, args.download_dir, args.load_format) == (True, "/models", "safetensors")


@pytest.mark.parametrize("keys, match", [
    ({"draft_tensor_parallel_size": 2}, r"'draft_tensor_parallel_size' must be 1"),
    ({"kv_cache_dtype": "fp8"}, r"'kv_cache_dtype' = 'fp8' is not supported"),
    ({"quantization": "no_such_method"}, r"'quantization' must be a name vLLM knows for quantization, got 'no_such_method'; choose one of \[.*'awq'"),
    ({"attention_backend": "NOPE"}, r"'attention_backend' must be a name vLLM knows for attention_backend, got 'NOPE'; choose one of \[.*'CPU_ATTN'"),
    ({"draft_load_config": {"device": "cpu"}}, r"'draft_load_config' must be an object with load_format"),
    ({"revision": ""}, r"'revision' must be a non-empty string"),
    ({"prompt_lookup_max": 4}, r"'prompt_lookup_max' = 4 is a setting of vLLM's other speculative methods"),
    ({"tensor_parallel_size": 2}, r"'tensor_parallel_size' = 2 is a setting of vLLM's other"),
    ({"rejection_sample_method": "block"}, r"'rejection_sample_method' = 'block' is a setting of vLLM's other"),
])
def test_keys_the_drafter_cannot_honour_are_refused_by_name(smollm2: str, keys: dict, match: str) -> None:
    with pytest.raises(HeteroConfigError, match=match):
        _settings(smollm2, **keys)


def test_another_methods_key_at_vllms_default_is_harmless(smollm2: str) -> None:
    _settings(smollm2, disable_padded_drafter_batch=False, rejection_sample_method="standard")


def test_every_speculative_config_key_is_handled() -> None:
    """Each field of the installed vLLM's ``SpeculativeConfig`` is either ours (passed
    to the drafter, or refused by its own check), vLLM's shared wiring, or refused as
    another method's: a key a new vLLM adds lands in the last group, never nowhere."""
    from vllm.config.speculative import SpeculativeConfig

    from vllm_hetero_spec.config import _VLLM_SHARED

    names = {f.name for f in dataclasses.fields(SpeculativeConfig)}
    draft_keys = {"revision", "code_revision", "quantization", "max_model_len", "enforce_eager",
                  "attention_backend", "moe_backend", "draft_tensor_parallel_size", "kv_cache_dtype",
                  "draft_load_config"}
    assert draft_keys <= names and draft_keys <= set(HETERO_KEYS)
    assert _VLLM_SHARED <= names | {"num_speculative_tokens_per_batch_size"}


@pytest.mark.parametrize("keys, key, says", [
    ({"quantization": "awq"}, "quantization", "awq"),  # the checkpoint is not AWQ
    ({"quantization": "fp8", "draft_dtype": "float32"}, "quantization", "fp8"),  # fp8 needs 16-bit weights
    ({"max_model_len": 10**7}, "max_model_len", "max_model_len"),
])
def test_vllms_own_checks_of_the_drafter_name_the_key(smollm2: str, keys: dict, key: str, says: str) -> None:
    """A method the checkpoint or the drafter's dtype cannot take, or a length past the
    model's, stops start-up naming the key (vLLM's checks, run on the drafter's own
    arguments, dtype included)."""
    with pytest.raises(HeteroConfigError, match=rf"^'{key}': vLLM refuses the drafter's config: .*{says}.*fix '{key}'"):
        check_draft_model_config(_settings(smollm2, **keys), None, None)
    check_draft_model_config(_settings(smollm2), None, None)


def test_a_quantized_drafter_loads_or_its_error_names_the_method(smollm2: str) -> None:
    """Online fp8 quantization of a 16-bit checkpoint: where vLLM's build has the kernels
    the drafter loads quantized; where it has not (vLLM 0.32.0's CPU build), the error
    names the method, not a kernel's signature alone."""
    from vllm_hetero_spec.drafter.runtime.model import DraftModel

    cfg, _ = resolve_runtime_config(_settings(smollm2, quantization="fp8", draft_dtype="bfloat16"))
    try:
        runtime = DraftModel(cfg)
    except RuntimeError as err:
        assert "'quantization' = 'fp8' did not load on cpu" in str(err)
    else:
        assert runtime.vllm_config.model_config.quantization == "fp8"


def test_a_user_writes_every_draft_key_in_the_docs_table() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs/configuration.md").read_text()
    for key in ("revision", "code_revision", "quantization", "kv_cache_dtype", "draft_load_config",
                "trust_remote_code", "download_dir", "load_format", "tokenizer_revision"):
        assert f"`{key}`" in text, key
