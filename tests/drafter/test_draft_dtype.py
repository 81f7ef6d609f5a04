"""``draft_dtype: auto`` picks the target's dtype on CUDA, bf16 where the CPU has it
natively, float32 elsewhere; an explicit dtype is kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vllm_hetero_spec.drafter.runtime.draft_dtype import cpu_flags, resolve_draft_dtype


@pytest.mark.parametrize(
    "requested,target,device,flags,want",
    [
        ("auto", torch.bfloat16, "cuda", set(), "bfloat16"),
        ("auto", torch.float16, "cuda", set(), "float16"),
        ("auto", torch.float32, "cuda", set(), "float32"),
        ("auto", None, "cuda", set(), "bfloat16"),
        ("auto", torch.float32, "cpu", {"avx2", "avx512f", "avx512_bf16"}, "bfloat16"),
        ("auto", torch.float32, "cpu", {"avx2", "amx_bf16", "amx_tile"}, "bfloat16"),
        ("auto", torch.float32, "cpu", {"avx2", "avx512f"}, "float32"),
        ("float32", torch.bfloat16, "cuda", set(), "float32"),
        ("bfloat16", torch.float32, "cpu", set(), "bfloat16"),
    ],
)
def test_auto_draft_dtype(requested, target, device, flags, want) -> None:
    dtype, why = resolve_draft_dtype(requested, target, device, flags)
    assert dtype == want and why


def test_cpu_flags_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu avx2 avx512_bf16\n")
    assert cpu_flags(info) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "missing") == set()
