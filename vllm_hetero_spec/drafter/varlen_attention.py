"""A transformers attention backend that packs many requests into one forward.

transformers' own caches assume a rectangular batch. Packing every request's new tokens
into one row (as vLLM does) lets the weight matmuls, which dominate a small drafter's
cost on CPU, run once per step for the whole batch; only this attention step loops over
requests, each against its own :class:`RequestKVCache`. Registered under the name
``hetero_varlen``; transformers then skips its mask construction (we mask here).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from vllm_hetero_spec.drafter.kv_cache import RequestKVCache

BACKEND_NAME = "hetero_varlen"


@dataclass
class TokenTree:
    """A tree of draft tokens after a request's cached context, grown level by level.

    The tree's keys and values sit in the cache past ``context`` (the cache's committed
    length is moved there only for a forward, and back after), so many branches from one
    context are evaluated without copying the cache, and nothing is committed.

    Attributes:
        context: cached tokens the tree hangs from.
        ancestors: ``[n, n]`` bool, entry ``[a, b]`` true when node b is node a or one of
            its ancestors (nodes numbered from 0 in the order they were added).
        depth: ``[n]`` 1 for a child of the context.
    """

    context: int
    ancestors: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.bool))
    depth: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))

    def grow(self, parents: list[int]) -> None:
        """Add nodes under ``parents`` (0: the context, j: node j - 1)."""
        n, m = self.ancestors.shape[0], len(parents)
        anc = torch.zeros(n + m, n + m, dtype=torch.bool)
        anc[:n, :n] = self.ancestors
        depth = torch.cat([self.depth, torch.zeros(m, dtype=torch.long)])
        for j, parent in enumerate(parents):
            if parent > 0:
                anc[n + j] = anc[parent - 1]
                depth[n + j] = depth[parent - 1] + 1
            else:
                depth[n + j] = 1
            anc[n + j, n + j] = True
        self.ancestors, self.depth = anc, depth

    def positions(self) -> torch.Tensor:
        """Position id of every node."""
        return self.context + self.depth - 1

    def mask(self, n_new: int, window: int | None) -> torch.Tensor:
        """``[n_new, context + n]``: the last ``n_new`` nodes see the whole context and
        their ancestors (and, with a sliding window, only keys inside it)."""
        rows = self.ancestors[-n_new:]
        allowed = torch.cat([torch.ones(n_new, self.context, dtype=torch.bool), rows], dim=1)
        if window is not None:
            pos = self.positions()
            k_pos = torch.cat([torch.arange(self.context), pos])
            allowed &= k_pos.unsqueeze(0) > pos[-n_new:].unsqueeze(1) - window
        return allowed


@dataclass
class PackedBatch:
    """Where each request's new tokens sit in the packed row, and its cache; with
    ``trees``, request i's new tokens are the newest nodes of ``trees[i]``."""

    caches: list[RequestKVCache]
    starts: list[int]
    lengths: list[int]
    trees: list[TokenTree] | None = None


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
        mask = _mask(n, k.shape[1], window) if trees is None else trees[i].mask(n, window)
        o = F.scaled_dot_product_attention(
            q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask, scale=scaling, enable_gqa=True
        )
        out[start : start + n] = o[0].transpose(0, 1)
    return out.unsqueeze(0), None


AttentionInterface.register(BACKEND_NAME, varlen_attention)
