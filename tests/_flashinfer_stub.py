"""A stand-in for the ``flashinfer`` package, so vLLM's real FlashInfer backend module,
its metadata builder and its per-step planning run on a CPU machine.

FlashInfer is a CUDA kernel library (its wheel pulls in the CUDA toolkit's Python
packages); only the names vLLM's ``flashinfer.py`` imports are provided. Its wrappers
record every ``plan`` call's arguments instead of planning kernels, which is what a
test of the drafter's plumbing reads: the widths, page size and host-side lengths vLLM's
builder hands FlashInfer. Nothing here computes attention.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from typing import Any

import torch


class _Wrapper:
    """Any FlashInfer batch wrapper: remembers how it was made and each plan."""

    plans: list[tuple[str, dict[str, Any]]] = []

    def __init__(self, *args: Any, use_cuda_graph: bool = False, **kwargs: Any):
        self.is_cuda_graph_enabled = use_cuda_graph
        self.made_with = (args, kwargs)

    def plan(self, *args: Any, **kwargs: Any) -> None:
        _Wrapper.plans.append((type(self).__name__, kwargs))

    def run(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("the FlashInfer stub plans; it computes no attention")


def _wrapper(name: str) -> type:
    return type(name, (_Wrapper,), {})


def get_seq_lens(indptr: torch.Tensor, last_page_len: torch.Tensor, page_size: int) -> torch.Tensor:
    """FlashInfer's lengths from a page table: full pages, plus the last one's fill."""
    pages = indptr[1:] - indptr[:-1]
    return torch.clamp(pages - 1, min=0) * page_size + last_page_len


def _unavailable(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("a FlashInfer kernel was called: the stub has none")


def install() -> type:
    """Put the stub in ``sys.modules`` (idempotent); returns the wrapper base, whose
    ``plans`` lists every plan since the last ``plans.clear()``."""
    if "flashinfer" in sys.modules:
        return sys.modules["flashinfer"]._Wrapper
    root = types.ModuleType("flashinfer")
    root.__spec__ = importlib.machinery.ModuleSpec("flashinfer", None, is_package=True)
    root.__path__ = []
    root._Wrapper = _Wrapper
    for name in ("BatchAttentionWithAttentionSinkWrapper", "BatchDecodeWithPagedKVCacheWrapper",
                 "BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper"):
        setattr(root, name, _wrapper(name))
    root.get_seq_lens = get_seq_lens
    root.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping = _unavailable
    decode, prefill, utils = (types.ModuleType(f"flashinfer.{n}") for n in ("decode", "prefill", "utils"))
    decode.fast_decode_plan = decode.trtllm_batch_decode_with_kv_cache = _unavailable
    prefill.trtllm_batch_context_with_kv_cache = _unavailable
    utils.FP4Tensor = type("FP4Tensor", (), {})
    # vLLM 0.33.0's builder sizes a counter buffer of its TRT-LLM path with these at
    # start-up: an H100's SM count, and a small buffer.
    utils.get_device_sm_count = lambda device: 132
    utils.get_trtllm_gen_multi_ctas_kv_counter_bytes = lambda *args: 4096
    for module in (decode, prefill, utils):
        module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
    for module in (root, decode, prefill, utils):
        sys.modules[module.__name__] = module
    root.decode, root.prefill, root.utils = decode, prefill, utils
    return _Wrapper
