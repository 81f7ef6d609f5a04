"""Every runtime ``auto`` resolves in one place (``drafter/runtime/config.py``) into one
concrete ``RuntimeConfig``: for an engine, against the target's config and where the
drafter runs; for a drafter of its own, without a target."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm.config import CompilationConfig, CUDAGraphMode

from vllm_hetero_spec.config import HeteroSettings
from vllm_hetero_spec.drafter.runtime import config as runtime_config
from vllm_hetero_spec.drafter.runtime.config import DEFAULT_FORWARD_TOKENS, resolve_runtime_config
from vllm_hetero_spec.drafter.runtime.pool_size import STANDALONE_MB


def _target(device: str, dtype: torch.dtype = torch.bfloat16, eager: bool = False) -> SimpleNamespace:
    cc = CompilationConfig()
    cc.cudagraph_mode, cc.cudagraph_capture_sizes = CUDAGraphMode.FULL_AND_PIECEWISE, [8, 1, 4, 2]
    return SimpleNamespace(
        model_config=SimpleNamespace(dtype=dtype, enforce_eager=eager, max_model_len=4096),
        cache_config=SimpleNamespace(kv_cache_memory_bytes=1 << 40),
        scheduler_config=SimpleNamespace(max_num_seqs=8, max_num_batched_tokens=2048),
        device_config=SimpleNamespace(device=torch.device(device)),
        compilation_config=cc,
    )


def _settings(smollm2: str, **kw) -> HeteroSettings:
    return HeteroSettings(draft_model=smollm2, draft_tokenizer=smollm2, num_speculative_tokens=4,
                          max_draft_tokens=4, **kw)


def test_an_engine_on_cuda_takes_the_targets_dtype_graphs_and_batch(smollm2: str) -> None:
    cfg, why = resolve_runtime_config(_settings(smollm2), _target("cuda"))
    assert cfg.dtype == torch.bfloat16 and cfg.graph_sizes == (1, 2, 4, 8)
    assert cfg.max_forward_tokens == 2048 and cfg.kv_pool_mb >= 16
    assert cfg.max_rows == 8  # the rows the target's own sampler is profiled at
    assert set(why) == {"dtype", "kv pool", "CUDA graphs", "attention", "output layer"}
    assert "target's dtype" in why["dtype"]
    assert cfg.attention_backend is None  # vLLM picks for the drafter's own heads


def test_an_attention_backend_the_target_names_covers_the_drafter(smollm2: str) -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    target = _target("cuda")
    target.attention_config = SimpleNamespace(backend=AttentionBackendEnum.FLASHINFER)
    cfg, why = resolve_runtime_config(_settings(smollm2), target)
    assert cfg.attention_backend == "FLASHINFER" and "target's" in why["attention"]
    ray, _ = resolve_runtime_config(_settings(smollm2), target, device_type="cpu")
    assert ray.attention_backend is None  # a Ray actor drafts on CPU cores


def test_a_ray_actor_drafts_on_cpu_whatever_the_target(smollm2: str, monkeypatch) -> None:
    monkeypatch.setattr(runtime_config, "cpu_flags", lambda: set())
    cfg, why = resolve_runtime_config(_settings(smollm2), _target("cuda"), device_type="cpu")
    assert cfg.dtype == torch.float32 and cfg.graph_sizes == ()
    assert cfg.max_forward_tokens == DEFAULT_FORWARD_TOKENS  # the actor's host memory, not the engine's profile
    assert why["CUDA graphs"] == "off (eager)"


def test_values_set_in_the_config_are_kept(smollm2: str) -> None:
    cfg, why = resolve_runtime_config(
        _settings(smollm2, draft_dtype="float16", draft_kv_pool_mb=96, draft_cuda_graphs=[16, 2, 2]), _target("cuda"))
    assert (cfg.dtype, cfg.kv_pool_mb, cfg.graph_sizes) == (torch.float16, 96, (2, 16))
    assert why["dtype"].endswith("(set in the config)") and why["kv pool"].endswith("(set in the config)")
    off, _ = resolve_runtime_config(_settings(smollm2, draft_cuda_graphs=False), _target("cuda"))
    assert off.graph_sizes == ()


@pytest.mark.parametrize("flags,want", [(set(), torch.float32), ({"avx512_bf16"}, torch.bfloat16)])
def test_a_drafter_of_its_own(smollm2: str, monkeypatch, flags, want) -> None:
    monkeypatch.setattr(runtime_config, "cpu_flags", lambda: flags)
    monkeypatch.setattr(runtime_config, "platform_device_type", lambda: "cpu")
    cfg, why = resolve_runtime_config(_settings(smollm2))
    assert (cfg.dtype, cfg.kv_pool_mb, cfg.graph_sizes, cfg.model) == (want, STANDALONE_MB, (), smollm2)
    assert "no engine" in why["kv pool"]
