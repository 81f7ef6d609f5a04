"""A dispatch mode that tracks the bytes held by fake ``cuda`` tensors: the live total and
its peak, as the caching allocator would see them (without its rounding).

Every tensor an op returns on the fake device is counted against its storage; a storage
is held while any tensor that viewed it is alive (views and in-place results count as
holders of the same storage) and released when the last one is collected. Storages that
existed before the mode was entered (weights, the KV pool, persistent buffers) are not
counted: ``peak`` is the transient peak above them, what vLLM's profile run measures.
"""

from __future__ import annotations

import weakref

from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class DeviceMemory(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._holders: dict[int, int] = {}
        self._bytes: dict[int, int] = {}

    def reset_peak(self) -> None:
        self.peak = self.live

    def _release(self, key: int) -> None:
        self._holders[key] -= 1
        if self._holders[key] == 0:
            del self._holders[key]
            self.live -= self._bytes.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, FakeTensor)}
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if not (isinstance(t, FakeTensor) and t.device.type == "cuda"):
                continue
            key = t.untyped_storage()._cdata
            if key in inputs:  # a view or an in-place result: one more holder, if counted
                if key not in self._holders:
                    continue  # allocated before the mode: not counted
            else:  # a new allocation
                self._holders[key] = 0
                self._bytes[key] = t.untyped_storage().nbytes()
                self.live += self._bytes[key]
                self.peak = max(self.peak, self.live)
            self._holders[key] += 1
            weakref.finalize(t, self._release, key)
        return out
