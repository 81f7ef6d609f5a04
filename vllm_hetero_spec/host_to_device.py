"""Small per-step tensors built from host lists, put on the device without stalling the host.

``torch.tensor(values, device="cuda")`` copies from pageable memory, and PyTorch then
waits on the stream: the host stalls until the GPU has run everything queued before the
copy. Measured on an H100 (``benchmarks/cuda_check.py``): ``SamplingRows.build`` made that
way was flagged by ``torch.cuda.set_sync_debug_mode("error")``. Per step it would tie
the drafter's and the verifier's host work to the end of the target's queued forward.
vLLM stages its own inputs in pinned memory and copies them asynchronously; this does
the same for ours (drafter/runtime/input_staging.py does it with persistent buffers for the
draft forwards' inputs).
"""

from __future__ import annotations

import torch


def to_device(values: object, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` (host numbers or nested lists) as a ``dtype`` tensor on ``device``.

    On CUDA the values go through pinned memory and are copied with
    ``non_blocking=True``: PyTorch's pinned-memory cache keeps the staging block until
    the copy has run, so the host neither waits nor frees it early. Elsewhere (CPU, or
    a fake ``cuda`` device without CUDA) they are made on ``device`` directly.
    """
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
    return torch.tensor(values, dtype=dtype, device=device)
