"""``draft_dtype: auto``: the fastest dtype the drafter's device runs well.

The draft dtype never changes outputs (verification runs in the target's dtype on the
target's logits; q is the exact distribution each draft was sampled from, whatever
precision produced it), only acceptance and speed, so the default may pick for speed:

- CUDA: the target's dtype (bf16/fp16 run on FlashAttention and tensor cores; a float32
  target keeps a float32 drafter, which runs on Triton attention);
- CPU with native bf16 (``avx512_bf16`` or ``amx_bf16``): bfloat16, faster per draft
  token than float32 on such a CPU, half the weight bytes to read for a memory-bound
  forward (docs/benchmarks.md, "Measured, not adopted": the drafter-speed run);
- any other CPU: float32 (bf16 is emulated there, and slower).

Resolved once, where the config is parsed (``vllm_integration/startup_checks.py``), so
every worker and rank gets the same concrete dtype.
"""

from __future__ import annotations

from pathlib import Path

import torch

AUTO = "auto"
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags (empty where ``/proc/cpuinfo`` is not readable)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def resolve_draft_dtype(
    requested: str, target_dtype: torch.dtype | None, device_type: str, flags: set[str]
) -> tuple[str, str]:
    """The concrete draft dtype name for ``requested`` and why (for the start-up log).
    ``target_dtype`` is ``None`` for a drafter built outside an engine (a benchmark, a
    Ray actor given unresolved settings): bfloat16 on CUDA then."""
    if requested != AUTO:
        return requested, "set in the config"
    if device_type == "cuda":
        if target_dtype is None:
            return "bfloat16", "CUDA, no target dtype known"
        return str(target_dtype).removeprefix("torch."), "the target's dtype on CUDA"
    native = sorted(f for f in NATIVE_BF16_FLAGS if f in flags)
    if native:
        return "bfloat16", f"the CPU has {native[0]}"
    return "float32", "the CPU has no native bf16 (avx512_bf16 or amx_bf16)"


def platform_device_type() -> str:
    """``cuda`` on NVIDIA (and ROCm) platforms, else vLLM's device type (``cpu``, ...)."""
    from vllm.platforms import current_platform

    return "cuda" if current_platform.is_cuda_alike() else current_platform.device_type
