"""Persistent staging of a draft forward's integer inputs: two host-to-device copies per
forward, from pinned host buffers into device buffers that are allocated once.

A draft forward needs seven integer tensors (token ids, positions, slot mapping, the
rows whose logits are read, query start locations, sequence lengths, the block table).
Built one by one from Python data they would be seven pageable copies, each a
synchronous ``cudaMemcpy`` on CUDA. Here they are packed by dtype into one int64 and one
int32 buffer, written in place by numpy, and copied with ``non_blocking=True``; every
tensor the forward reads is a view of a persistent device buffer.

vLLM's ``CpuGpuBuffer`` does the same for one tensor, but allocates its device side at
construction and keeps a numpy view of it; here the device side is allocated on the
first upload, which is also what lets the device-discipline tests
(``tests/drafter/test_draft_loop_device.py``) build the host side for real and the
device side on a fake ``cuda`` device.

A pinned buffer may still be in flight when the next forward wants to rewrite it: on
CUDA an event recorded after each upload is waited on first, as vLLM's runner waits on
its ``prepare_inputs_event`` before rewriting its pinned inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import torch

T = TypeVar("T", np.ndarray, torch.Tensor)


@dataclass
class StagedInputs(Generic[T]):
    """One forward's integer inputs, as host numpy views or device tensor views.

    Attributes:
        ids: ``[t]`` int64 token ids (unused when the ids are already on the device).
        positions: ``[t]`` int64.
        slots: ``[t]`` int64 KV slot of each token.
        last: ``[b]`` int64 the token rows whose logits are returned.
        query_start_loc: ``[b + 1]`` int32.
        seq_lens: ``[b]`` int32.
        block_table: ``[b, width]`` int32.
    """

    ids: T
    positions: T
    slots: T
    last: T
    query_start_loc: T
    seq_lens: T
    block_table: T


def _cut(buf: T, start: int, n: int) -> T:
    # ``narrow``, not ``buf[a:b]``: Python slicing of a fake ``cuda`` tensor raises on
    # the CPU build of torch, which the device-discipline tests run on.
    return buf[start : start + n] if isinstance(buf, np.ndarray) else buf.narrow(0, start, n)


def _layout(buf64: T, buf32: T, t: int, b: int, width: int) -> StagedInputs[T]:
    """The views of one forward's inputs in the two packed buffers:
    int64 ``ids | positions | slots | last``, int32 ``query_start_loc | seq_lens | block_table``."""
    return StagedInputs(
        _cut(buf64, 0, t), _cut(buf64, t, t), _cut(buf64, 2 * t, t), _cut(buf64, 3 * t, b),
        _cut(buf32, 0, b + 1), _cut(buf32, b + 1, b), _cut(buf32, 2 * b + 1, b * width).reshape(b, width),
    )


def _sizes(t: int, b: int, width: int) -> tuple[int, int]:
    return 3 * t + b, 2 * b + 1 + b * width


class InputStaging:
    """The drafter's persistent input buffers on one device."""

    def __init__(self, device: torch.device, tokens: int = 4096, reqs: int = 256, width: int = 64):
        self.device = device
        from vllm.utils.platform_utils import is_pin_memory_available

        self._pin = device.type == "cuda" and is_pin_memory_available()
        self._event = torch.cuda.Event() if device.type == "cuda" else None
        self._set_host(*_sizes(tokens, reqs, width))
        self._dev64: torch.Tensor | None = None
        self._dev32: torch.Tensor | None = None
        self._shape = (0, 0, 0)
        self.device_allocations = 0

    def _set_host(self, n64: int, n32: int) -> None:
        """The host side, on the host by design (pinned on CUDA); allocated at start and
        again only when a forward outgrows it, never per step."""
        self._host64 = torch.zeros(n64, dtype=torch.int64, device="cpu", pin_memory=self._pin)
        self._host32 = torch.zeros(n32, dtype=torch.int32, device="cpu", pin_memory=self._pin)
        self._np64, self._np32 = self._host64.numpy(), self._host32.numpy()

    def host(self, t: int, b: int, width: int) -> StagedInputs[np.ndarray]:
        """Writable host views for a forward of ``t`` tokens over ``b`` sequences whose
        block tables are at most ``width`` long (the buffers grow, by doubling, when
        they are too small)."""
        if self._event is not None:
            self._event.synchronize()
        n64, n32 = _sizes(t, b, width)
        if n64 > self._host64.numel() or n32 > self._host32.numel():
            self._set_host(max(n64, 2 * self._host64.numel()), max(n32, 2 * self._host32.numel()))
        self._shape = (t, b, width)
        return _layout(self._np64, self._np32, t, b, width)

    def upload(self) -> StagedInputs[torch.Tensor]:
        """Copy what :meth:`host` handed out to the device (two non-blocking copies) and
        return the device views. The device buffers are allocated on the first upload
        and again only when the host buffers have grown."""
        if self._dev64 is None or self._dev64.numel() < self._host64.numel() or (
                self._dev32.numel() < self._host32.numel()):
            self._dev64 = torch.zeros(self._host64.numel(), dtype=torch.int64, device=self.device)
            self._dev32 = torch.zeros(self._host32.numel(), dtype=torch.int32, device=self.device)
            self.device_allocations += 1
        n64, n32 = _sizes(*self._shape)
        _cut(self._dev64, 0, n64).copy_(_cut(self._host64, 0, n64), non_blocking=True)
        _cut(self._dev32, 0, n32).copy_(_cut(self._host32, 0, n32), non_blocking=True)
        if self._event is not None:
            self._event.record()
        return _layout(self._dev64, self._dev32, *self._shape)
