"""``draft_cuda_graphs``: which engines capture the drafter's graphs, at which sizes.

Graphs are captured in the target's capture phase, so the drafter has them exactly
where the target does (CUDA, no ``enforce_eager``, a graph mode) and never on CPU.
"""

from __future__ import annotations

import pytest
from vllm.config import CompilationConfig, CUDAGraphMode

from vllm_hetero_spec.drafter.runtime.cuda_graphs import graph_compilation_config, resolve_graph_sizes


def _target(mode: CUDAGraphMode, sizes: list[int]) -> CompilationConfig:
    cc = CompilationConfig()
    cc.cudagraph_mode, cc.cudagraph_capture_sizes = mode, sizes
    return cc


@pytest.mark.parametrize(
    "value,mode,eager,device,want",
    [
        ("auto", CUDAGraphMode.FULL_AND_PIECEWISE, False, "cuda", (1, 2, 4, 8)),  # vLLM's default on CUDA
        ("auto", CUDAGraphMode.PIECEWISE, False, "cuda", (1, 2, 4, 8)),
        ([16, 2, 2], CUDAGraphMode.FULL_AND_PIECEWISE, False, "cuda", (2, 16)),
        (False, CUDAGraphMode.FULL_AND_PIECEWISE, False, "cuda", ()),
        ("auto", CUDAGraphMode.FULL_AND_PIECEWISE, True, "cuda", ()),  # --enforce-eager: no capture phase
        ("auto", CUDAGraphMode.NONE, False, "cuda", ()),
        ("auto", CUDAGraphMode.NONE, False, "cpu", ()),  # vLLM's CPU platform
        ([1, 2], CUDAGraphMode.PIECEWISE, False, "cpu", ()),
    ],
)
def test_graphs_follow_the_target(value, mode, eager, device, want) -> None:
    assert resolve_graph_sizes(value, _target(mode, [8, 1, 4, 2]), eager, device) == want


def test_the_drafter_config_asks_vllm_for_piecewise_graphs() -> None:
    """The drafter's own ``compilation_config``: PIECEWISE (attention eager between the
    captured pieces: its metadata changes every step) at the resolved sizes; nothing
    when graphs are off."""
    assert graph_compilation_config((4, 1, 2)) == {"cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4]}
    assert graph_compilation_config(()) == {}


def test_a_compiled_drafter_compiles_for_every_forward(smollm2: str) -> None:
    """vLLM compiles for token counts up to its ``max_num_batched_tokens`` and asserts on
    a larger forward, so a compiled drafter's budget is the runtime's forward cap (the
    target's ``max_num_batched_tokens``), not vLLM's default."""
    from vllm_hetero_spec.drafter.runtime.model import RuntimeConfig, draft_vllm_config

    vc = draft_vllm_config(RuntimeConfig(smollm2, graph_sizes=(1, 2, 4), max_forward_tokens=3000))
    assert vc.scheduler_config.max_num_batched_tokens == 3000
    assert max(vc.compilation_config.compile_ranges_endpoints or [3000]) == 3000
    assert draft_vllm_config(RuntimeConfig(smollm2)).model_config.enforce_eager
