"""A ``VllmConfig`` that asks for the drafter's CUDA graphs, for tests without a GPU."""

from __future__ import annotations

from typing import Any


def graph_config(sizes: list[int]) -> Any:
    """A ``VllmConfig`` asking for piecewise CUDA graphs at ``sizes``, as the drafter's
    is on CUDA (vLLM's CPU platform turns graphs off when it builds one, so the fields
    are set afterwards)."""
    from vllm.config import CompilationConfig, CompilationMode, CUDAGraphMode, VllmConfig

    cfg = VllmConfig()
    cc = cfg.compilation_config
    cc.mode, cc.cudagraph_mode = CompilationMode.VLLM_COMPILE, CUDAGraphMode.PIECEWISE
    cc.splitting_ops = list(CompilationConfig._attention_ops)
    cc.cudagraph_capture_sizes, cc.max_cudagraph_capture_size = sorted(sizes), max(sizes)
    return cfg
