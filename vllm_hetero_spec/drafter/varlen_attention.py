"""A transformers attention backend that packs many requests into one forward.

transformers' own caches assume a rectangular batch. Packing every request's new tokens
into one row (as vLLM does) lets the weight matmuls, which dominate a small drafter's
cost on CPU, run once per step for the whole batch; only this attention step loops over
requests, each against its own :class:`RequestKVCache`. Registered under the name
``hetero_varlen``; transformers then skips its mask construction (we mask here).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from vllm_hetero_spec.drafter.kv_cache import RequestKVCache

BACKEND_NAME = "hetero_varlen"


@dataclass
class PackedBatch:
    """Where each request's new tokens sit in the packed row, and its cache.

    ``trees`` (optional, per request) makes the new tokens a token *tree* rather than a
    sequence: ``trees[i]`` is ``[n_i, n_i]`` bool, entry ``[a, b]`` true when new token b
    is token a or one of its ancestors. Each new token then sees the whole cache plus
    its own ancestors, so many branches from one context run in one forward.
    """

    caches: list[RequestKVCache]
    starts: list[int]
    lengths: list[int]
    trees: list[torch.Tensor] | None = None


def _mask(n_new: int, n_total: int, window: int | None) -> torch.Tensor | None:
    """Causal (optionally sliding-window) mask for ``n_new`` queries at the end of
    ``n_total`` keys; ``None`` when every query may see every key."""
    if n_new == 1 and (window is None or n_total <= window):
        return None
    q_pos = torch.arange(n_total - n_new, n_total).unsqueeze(1)
    k_pos = torch.arange(n_total).unsqueeze(0)
    allowed = k_pos <= q_pos
    if window is not None:
        allowed &= k_pos > q_pos - window
    return allowed


def _tree_mask(ancestors: torch.Tensor, n_cached: int, positions: torch.Tensor, window: int | None) -> torch.Tensor:
    """Mask for tree tokens at ``positions`` (their depth after the cache) over the cache
    plus the tree: every cached key, then the token's ancestors and itself."""
    n = ancestors.shape[0]
    allowed = torch.cat([torch.ones(n, n_cached, dtype=torch.bool), ancestors], dim=1)
    if window is not None:
        k_pos = torch.cat([torch.arange(n_cached), positions])
        allowed &= k_pos.unsqueeze(0) > positions.unsqueeze(1) - window
    return allowed


def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    packed_batch: PackedBatch | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """``query`` is ``[1, heads, T, d]``, ``key``/``value`` ``[1, kv_heads, T, d]`` for the
    packed new tokens of all requests. Returns ``[1, T, heads, d]`` as transformers expects."""
    assert packed_batch is not None, "hetero_varlen attention needs packed_batch="
    layer = module.layer_idx
    window = sliding_window if sliding_window else None
    out = torch.empty(query.shape[2], query.shape[1], query.shape[3], dtype=query.dtype)
    trees = packed_batch.trees
    for i, (cache, start, n) in enumerate(zip(packed_batch.caches, packed_batch.starts, packed_batch.lengths)):
        k, v = cache.append(layer, key[0, :, start : start + n], value[0, :, start : start + n])
        q = query[0, :, start : start + n]
        if trees is None:
            mask = _mask(n, k.shape[1], window)
        else:
            depth = trees[i].sum(dim=1) - 1
            mask = _tree_mask(trees[i], cache.length, cache.length + depth, window)
        o = F.scaled_dot_product_attention(
            q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask, scale=scaling, enable_gqa=True
        )
        out[start : start + n] = o[0].transpose(0, 1)
    return out.unsqueeze(0), None


AttentionInterface.register(BACKEND_NAME, varlen_attention)
