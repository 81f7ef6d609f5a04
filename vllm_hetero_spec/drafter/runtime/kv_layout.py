"""The draft KV pool's per-layer tensors, laid out exactly as vLLM's runner lays out a KV
cache for the same attention backends.

vLLM 0.32 hands every attention layer a *logical* ``[blocks, heads, block, content]``
view (``content``: K and V side by side, ``2 * head_size``) whose strides follow one
physical layout, resolved once for all the model's backends
(``resolve_kv_cache_layout``: CPU attention wants ``LBHNC``; FlashAttention, FlashInfer
and Triton declare no preference, which resolves to vLLM's default ``LBNHC``, i.e.
``[blocks, block, heads, content]`` in memory). The kernels read that view (e.g.
FlashAttention through ``transpose(1, 2)``), so a tensor of the right size but another
layout would be read with the token and head axes swapped. We therefore resolve the
layout and build the views with vLLM's own functions (``create_kv_cache_views``), one
backing buffer per layer, as ``allocate_kv_cache`` does for a layer-compact layout.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch


def allocate_layer_caches(
    vllm_config: Any, specs: Mapping[str, Any], backends: Iterable[type], num_blocks: int, device: torch.device,
) -> dict[str, torch.Tensor]:
    """Per layer name, its KV cache view ``[num_blocks, heads, block, content]`` (zeros),
    for ``specs`` (vLLM ``AttentionSpec`` per layer, at the pool's block size) read by
    ``backends``. Records the resolved layout on ``vllm_config.cache_config`` (the
    drafter's own config), as vLLM's engine core does for the target's."""
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    from vllm.v1.kv_cache_interface import KVCacheTensor, create_kv_cache_views

    supported = [layout.name for layout in get_supported_kv_cache_layouts(set(backends))]
    layout = resolve_kv_cache_layout(vllm_config, [supported], specs.values())
    caches = {}
    for name, spec in specs.items():
        page = spec.page_size_bytes
        raw = torch.zeros(page * num_blocks, dtype=torch.int8, device=device)
        placement = KVCacheTensor(size=raw.numel(), layers=[name], layer_stride=raw.numel(), block_stride=page)
        caches[name] = create_kv_cache_views(raw, spec, num_blocks, layout, placement)[0]
    return caches
