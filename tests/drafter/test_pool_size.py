"""``draft_kv_pool_mb: auto`` (``drafter/runtime/pool_size.py``): sized for the engine's batch
at the drafter's longest context, capped at the target's explicit KV budget or a tenth
of the device's memory."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from transformers import AutoConfig

from vllm_hetero_spec.drafter.runtime.pool_size import MiB, auto_pool_mb, draft_bytes_per_token, engine_pool_mb


def _vllm_config(max_num_seqs: int, max_model_len: int, kv_bytes: int | None) -> SimpleNamespace:
    return SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=max_model_len),
        cache_config=SimpleNamespace(kv_cache_memory_bytes=kv_bytes),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        device_config=SimpleNamespace(device="cpu"),
    )


def test_bytes_per_token_of_the_real_drafters(smollm2: str, gemma: str) -> None:
    # SmolLM2-135M: 30 layers x 3 KV heads x 64 x (K, V); Gemma-3-270M: 18 x 1 x 256 x 2.
    assert draft_bytes_per_token(AutoConfig.from_pretrained(smollm2), torch.float32) == 30 * 3 * 64 * 2 * 4
    assert draft_bytes_per_token(AutoConfig.from_pretrained(gemma), torch.bfloat16) == 18 * 1 * 256 * 2 * 2


def test_the_batch_decides_below_the_cap() -> None:
    size, why = auto_pool_mb(46080, 64, 2048, 4, 1 << 40)
    per_seq = (2048 + 4 + 15) // 16 * 16 + 16  # whole blocks for the context and a step, plus one
    assert size == -(-64 * per_seq * 46080 // MiB) and "capped" not in why
    assert size > 512  # the old fixed default: most of this batch would have run undrafted


def test_the_cap_holds_and_a_tiny_batch_gets_a_floor() -> None:
    assert auto_pool_mb(46080, 256, 32768, 4, 1 << 30)[0] == 1024
    assert "capped at 1024 MiB" in auto_pool_mb(46080, 256, 32768, 4, 1 << 30)[1]
    assert auto_pool_mb(46080, 1, 16, 4, 1 << 30)[0] == 16


def test_engine_sizing_reads_the_targets_config(smollm2: str) -> None:
    """The context is the target's max_model_len (or the drafter's own limit when
    shorter), the cap the target's explicit KV budget, else a tenth of the memory."""
    size, _ = engine_pool_mb(_vllm_config(8, 1024, 1 << 40), smollm2, torch.float32, 4)
    assert size == auto_pool_mb(46080, 8, 1024, 4, 1 << 40)[0]
    limit = AutoConfig.from_pretrained(smollm2).max_position_embeddings
    assert engine_pool_mb(_vllm_config(8, 10 * limit, 1 << 40), smollm2, torch.float32, 4)[0] == (
        auto_pool_mb(46080, 8, limit, 4, 1 << 40)[0])
    assert engine_pool_mb(_vllm_config(256, 32768, 1 << 30), smollm2, torch.float32, 4)[0] == 1024
    import psutil

    tenth = int(0.1 * psutil.virtual_memory().total)
    assert engine_pool_mb(_vllm_config(4096, 8192, None), smollm2, torch.float32, 4)[0] == -(-tenth // MiB)
