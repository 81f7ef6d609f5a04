"""Per-request KV cache of the draft model.

The drafter cannot share the target's paged KV cache: its tokenizer splits the same text
into a different number of tokens, so positions differ. Each request therefore owns a
small contiguous cache per layer that grows by doubling and rolls back in O(1) by moving
its length (rejected draft tokens are simply overwritten by the next append).
"""

from __future__ import annotations

import torch


class RequestKVCache:
    """Contiguous ``[kv_heads, capacity, head_dim]`` key/value buffers for every layer."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, capacity: int = 256):
        self.length = 0
        self._shape = (kv_heads, head_dim)
        self._dtype = dtype
        self._capacity = capacity
        self.keys = [torch.empty(kv_heads, capacity, head_dim, dtype=dtype) for _ in range(num_layers)]
        self.values = [torch.empty(kv_heads, capacity, head_dim, dtype=dtype) for _ in range(num_layers)]

    def _grow(self, needed: int) -> None:
        cap = self._capacity
        while cap < needed:
            cap *= 2
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                new = torch.empty(self._shape[0], cap, self._shape[1], dtype=self._dtype)
                new[:, : self.length] = old[:, : self.length]
                store[i] = new
        self._capacity = cap

    def append(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``[kv_heads, n, head_dim]`` at the current length (not yet committed:
        :meth:`advance` moves the length once every layer has written) and return the
        keys/values visible to the new tokens."""
        n = key.shape[1]
        end = self.length + n
        if end > self._capacity:
            self._grow(end)
        self.keys[layer][:, self.length : end] = key
        self.values[layer][:, self.length : end] = value
        return self.keys[layer][:, :end], self.values[layer][:, :end]

    def advance(self, n: int) -> None:
        self.length += n

    def truncate(self, length: int) -> None:
        """Roll back to ``length`` tokens (rejected or re-tokenized suffix)."""
        self.length = min(self.length, length)

    @property
    def nbytes(self) -> int:
        return 2 * sum(t.numel() * t.element_size() for t in self.keys)

    def fork(self) -> "RequestKVCache":
        """A copy of the committed entries, with the same spare capacity."""
        other = RequestKVCache(len(self.keys), self._shape[0], self._shape[1], self._dtype, self._capacity)
        for src, dst in ((self.keys, other.keys), (self.values, other.values)):
            for a, b in zip(src, dst):
                b[:, : self.length] = a[:, : self.length]
        other.length = self.length
        return other
