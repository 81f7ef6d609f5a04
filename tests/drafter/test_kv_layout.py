"""The draft KV pool is laid out as vLLM's runner lays out a KV cache for the same
backends: for FlashAttention and Triton attention (vLLM's real backend classes; on the
``meta`` device, since a fake ``cuda`` tensor cannot be ``as_strided`` by a CPU build
of torch) and CPU attention, each layer's view has the shape, strides and dtype of the
view vLLM's own allocator (``get_kv_cache_config_from_groups`` then
``allocate_kv_cache``, the engine core's and the runner's path) binds to that layer.
The first allocator of this pool used a layout of its own, which FlashAttention would
have read with the token and head axes swapped.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm.config import CacheConfig
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
try:  # vLLM 0.33.0 moved it
    from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups
except ImportError:  # 0.32.0
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec
from vllm.v1.worker.utils import allocate_kv_cache

from vllm_hetero_spec.drafter.runtime.kv_layout import allocate_layer_caches

LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(3)]
NUM_BLOCKS = 7


def _config() -> SimpleNamespace:
    """What the allocators read of a ``VllmConfig``; the layout is resolved on it."""
    return SimpleNamespace(cache_config=CacheConfig(), attention_config=SimpleNamespace(hisparse_config=None),
                           kv_transfer_config=None)


@pytest.mark.parametrize(
    "backend,device,dtype",
    [(FlashAttentionBackend, "meta", torch.bfloat16), (TritonAttentionBackend, "meta", torch.float32),
     (CPUAttentionBackend, "cpu", torch.float32)],
    ids=["flash-attn", "triton", "cpu"],
)
def test_pool_views_equal_vllms_own_allocation(backend: type, device: str, dtype: torch.dtype) -> None:
    # SmolLM2-135M's attention: 3 KV heads of 64, here in blocks of 32 tokens.
    spec = FullAttentionSpec(block_size=32, num_kv_heads=3, head_size=64, dtype=dtype)
    ours_cfg, theirs_cfg = _config(), _config()
    ours = allocate_layer_caches(ours_cfg, {name: spec for name in LAYERS}, [backend], NUM_BLOCKS, torch.device(device))
    theirs_cfg.cache_config.kv_cache_layout = ours_cfg.cache_config.kv_cache_layout
    config = get_kv_cache_config_from_groups(
        theirs_cfg, [KVCacheGroupSpec(LAYERS, spec)], spec.page_size_bytes * len(LAYERS) * NUM_BLOCKS)
    assert config.num_blocks == NUM_BLOCKS
    theirs = allocate_kv_cache(config, torch.device(device), theirs_cfg.cache_config.get_resolved_kv_cache_layout())
    preferred = backend.supported_kv_cache_layouts()
    assert ours_cfg.cache_config.kv_cache_layout == ("LBNHC" if preferred is None else preferred[0].name)
    for name in LAYERS:
        a, b = ours[name], theirs[name]
        assert (a.shape, a.stride(), a.dtype, a.device.type) == (b.shape, b.stride(), b.dtype, b.device.type), name
        assert a.shape == (NUM_BLOCKS, 3, 32, 128)  # logical [blocks, heads, block, K and V]
