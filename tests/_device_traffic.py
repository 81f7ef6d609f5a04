"""A dispatch mode that counts host<->device traffic on a fake ``cuda`` device.

Used above ``FakeTensorMode`` (which catches a host tensor mixed into a device op and
``.item()``/``.tolist()`` on a device tensor, but lets ``.cpu()`` through and cannot copy
host data onto a fake ``cuda`` tensor on the CPU build of torch). Every copy between
host and device is counted here instead of run:

- host to device: ``copy_`` from a host buffer, ``.to(device)``, and ``torch.tensor``
  of Python data (counted apart, as ``from_python``);
- device to host: ``.cpu()``/``.to("cpu")``, ``copy_`` into a host tensor, ``.item()``.

``Tensor.copy_``, ``Tensor.to`` (of a real host tensor to the device) and slicing a
device tensor are routed to their aten ops while the probe is active: their Python
bindings set up CUDA before dispatch, which the CPU build cannot.

A device-to-host copy returns real host data from ``host_values`` (fake tensors hold
none), so the code under test goes on as it would after a real transfer; ops on real
host tensors only run for real. Draws with
an explicit generator (which fake tensors do not support) are counted and run
without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

aten = torch.ops.aten


def _is_device(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cuda"


def _is_host(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cpu"


def _to_via_aten(original):
    """``Tensor.to`` that sends a real host tensor bound for ``cuda`` through
    ``aten._to_copy`` (so the probe sees it); anything else as before."""

    def to(self, *args, **kwargs):
        device, dtype = kwargs.get("device"), kwargs.get("dtype")
        for a in args:
            if isinstance(a, (str, torch.device)):
                device = a
            elif isinstance(a, torch.dtype):
                dtype = a
        if (device is not None and torch.device(device).type == "cuda" and self.device.type == "cpu"
                and not isinstance(self, FakeTensor)):
            return aten._to_copy.default(self, device=torch.device(device), dtype=dtype or self.dtype,
                                         non_blocking=kwargs.get("non_blocking", False))
        return original(self, *args, **kwargs)

    return to


def _getitem_via_aten(original):
    """``Tensor.__getitem__`` that takes a leading-axis slice of a fake ``cuda`` tensor
    through ``aten.slice`` (the binding sets up a CUDA device guard first, which the CPU
    build cannot); any other index as before."""

    def getitem(self, index):
        if isinstance(self, FakeTensor) and self.device.type == "cuda" and isinstance(index, slice) \
                and index.step in (None, 1):
            return aten.slice.Tensor(self, 0, index.start, index.stop)
        return original(self, index)

    return getitem


@dataclass
class Traffic:
    h2d: int = 0
    from_python: int = 0
    d2h: int = 0
    draws: int = 0
    where: list[str] = field(default_factory=list)


class DeviceTraffic(TorchDispatchMode):
    def __init__(self, host_values: Callable[[tuple[int, ...], torch.dtype], torch.Tensor]):
        super().__init__()
        self.host_values = host_values
        self.traffic = Traffic()
        self._fresh: set[int] = set()

    def __enter__(self):
        self._copy, self._to, self._getitem = torch.Tensor.copy_, torch.Tensor.to, torch.Tensor.__getitem__
        torch.Tensor.copy_ = lambda dst, src, non_blocking=False: aten.copy_.default(dst, src, non_blocking)
        torch.Tensor.to = _to_via_aten(self._to)
        torch.Tensor.__getitem__ = _getitem_via_aten(self._getitem)
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.copy_, torch.Tensor.to, torch.Tensor.__getitem__ = self._copy, self._to, self._getitem
        return super().__exit__(*exc)

    def reset(self) -> Traffic:
        out, self.traffic = self.traffic, Traffic()
        return out

    def _to_device(self, src: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if id(src) in self._fresh:
            self.traffic.from_python += 1
        else:
            self.traffic.h2d += 1
        return torch.empty(src.shape, dtype=dtype, device="cuda")

    def _to_host(self, shape: tuple[int, ...], dtype: torch.dtype, what: str) -> torch.Tensor:
        self.traffic.d2h += 1
        self.traffic.where.append(f"{what}{list(shape)}")
        with unset_fake_temporarily():  # real host data: fake tensors hold none
            return self.host_values(tuple(shape), dtype)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.lift_fresh.default:
            out = func(*args, **kwargs)
            self._fresh.add(id(out))
            return out
        if func is aten._to_copy.default or func.overloadpacket is aten.to:  # inference mode dispatches aten.to
            src, device = args[0], kwargs.get("device")
            if func is aten.to.device:
                device = args[1]
            dtype = kwargs.get("dtype") or src.dtype
            if _is_host(src) and device is not None and torch.device(device).type == "cuda":
                return self._to_device(src, dtype)
            if _is_device(src) and device is not None and torch.device(device).type == "cpu":
                return self._to_host(tuple(src.shape), dtype, "to_host")
        if func is aten.copy_.default:
            dst, src = args[0], args[1]
            if _is_device(dst) and _is_host(src):
                self.traffic.h2d += 1
                return dst
            if _is_host(dst) and _is_device(src):
                self._to_host(tuple(src.shape), src.dtype, "copy_")
                return dst
        if func is aten._local_scalar_dense.default and _is_device(args[0]):
            self._to_host((), args[0].dtype, "item")
            return 0
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        device = kwargs.get("device")
        on_host = device is None or torch.device(device).type == "cpu"
        if on_host and not any(isinstance(t, FakeTensor) for t in tensors):
            # Host work on real data (brought back, or a new host buffer such as vLLM's
            # CpuGpuBuffer's): run it for real, as on a GPU machine.
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        if func is aten.exponential_.default and kwargs.get("generator") is not None:
            self.traffic.draws += 1
            kwargs = {k: v for k, v in kwargs.items() if k != "generator"}
        return func(*args, **kwargs)
