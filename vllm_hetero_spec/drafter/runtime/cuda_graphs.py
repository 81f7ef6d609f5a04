"""CUDA graphs for the draft forwards, through vLLM's own compilation and graph machinery.

Why: an eager small drafter is launch-bound on a GPU -- about ten kernel launches per
layer, whose host time far exceeds the device's work -- and by estimate a few eager draft
forwards cost more than a captured target step, so speculation could never pay there
(docs/drafter.md#what-a-draft-forward-would-cost-on-an-h100-estimates-not-measured). vLLM's own
draft models (``vllm/v1/spec_decode/llm_base_proposer.py``) avoid it the same way this
does:

- the drafter's private ``VllmConfig`` asks for vLLM's compilation (``VLLM_COMPILE``:
  the forward split at the attention ops) with ``PIECEWISE`` CUDA graphs, so vLLM wraps
  every piece between two attention ops in its ``CUDAGraphWrapper``;
- a forward of ``t`` tokens is padded to the bucket vLLM's ``CudagraphDispatcher``
  picks from the capture sizes, and the wrappers replay the graph captured for it;
- attention runs eagerly between the pieces, with metadata built for each step (our
  block tables and query lengths change every step, so ``FULL`` graphs, which freeze
  the metadata buffers too, do not fit; vLLM's drafters use ``PIECEWISE`` as well).

A replay reads its inputs at the addresses seen at capture, so the token ids and
positions of every graphed forward are copied (device to device: the previous
position's samples never visit the host) into persistent buffers allocated here once.
Padded tokens keep the ids and positions of an earlier step (valid values: only the
real tokens' logits are read) and get KV slot -1 (``PADDING_SLOT_ID``: not written);
attention reads only the step's ``num_actual_tokens``.

Graphs are on when the target captures (CUDA, no ``enforce_eager``) and at the target's
capture sizes (``draft_cuda_graphs``: ``auto``); on CPU vLLM turns them off and the
drafter runs eager.
"""

from __future__ import annotations

from typing import Any

import torch



def graph_compilation_config(sizes: tuple[int, ...]) -> dict[str, Any]:
    """The drafter's ``compilation_config`` with graphs captured at ``sizes`` (empty: none)."""
    return {"cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": sorted(sizes)} if sizes else {}


class DraftGraphs:
    """The drafter's graph buckets and the persistent buffers its captured steps read.

    Attributes:
        sizes: the capture sizes, ascending (empty: graphs off, every forward eager).
        input_ids: ``[max size]`` int64, the token ids every graphed forward reads.
        positions: ``[max size]`` int64, likewise.
        slots: ``[max size]`` int64, the KV slots (eager attention reads them; padding -1).
    """

    def __init__(self, vllm_config: Any, device: torch.device):
        from vllm.config import CUDAGraphMode
        from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
        from vllm.v1.spec_decode.utils import PADDING_SLOT_ID

        cc = vllm_config.compilation_config
        on = cc.cudagraph_mode == CUDAGraphMode.PIECEWISE and bool(cc.cudagraph_capture_sizes)
        self.mode = CUDAGraphMode.PIECEWISE if on else CUDAGraphMode.NONE
        self.sizes: tuple[int, ...] = tuple(sorted(cc.cudagraph_capture_sizes)) if on else ()
        self.dispatcher = CudagraphDispatcher(vllm_config) if on else None
        if self.dispatcher is not None:
            self.dispatcher.initialize_cudagraph_keys(self.mode)
        n = self.sizes[-1] if self.sizes else 0
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.padding_slot = PADDING_SLOT_ID
        self.slots = torch.full((n,), PADDING_SLOT_ID, dtype=torch.int64, device=device)

    def dispatch(self, num_tokens: int) -> tuple[Any, Any]:
        """vLLM's ``(runtime mode, batch descriptor)`` for a forward of ``num_tokens``:
        ``PIECEWISE`` and the padded bucket when one holds it, else ``NONE`` unpadded."""
        from vllm.config import CUDAGraphMode
        from vllm.forward_context import BatchDescriptor

        if self.dispatcher is None:
            return CUDAGraphMode.NONE, BatchDescriptor(num_tokens=num_tokens)
        return self.dispatcher.dispatch(num_tokens)

    def stage(
        self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, padded: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Copy one forward's ``[t]`` ids, positions and slots into the persistent
        buffers and return their ``[padded]`` views (slots past ``t`` set to -1)."""
        t = ids.shape[0]
        self.input_ids.narrow(0, 0, t).copy_(ids)
        self.positions.narrow(0, 0, t).copy_(positions)
        self.slots.narrow(0, 0, t).copy_(slots)
        if padded > t:
            self.slots.narrow(0, t, padded - t).fill_(self.padding_slot)
        return self.input_ids.narrow(0, 0, padded), self.positions.narrow(0, 0, padded), self.slots.narrow(0, 0, padded)

    def capture_plan(self) -> list[tuple[Any, Any]]:
        """Every ``(runtime mode, batch descriptor)`` to capture, in vLLM's order: largest
        first, so smaller graphs reuse the larger ones' memory pool."""
        if self.dispatcher is None:
            return []
        return [(mode, desc) for mode, descs in self.dispatcher.get_capture_descs() for desc in descs]


def resolve_graph_sizes(value: str | bool | list[int], target_compilation: Any, target_eager: bool,
                        device_type: str) -> tuple[int, ...]:
    """What ``draft_cuda_graphs`` means for this engine: the buckets to capture, or none.

    Graphs are captured in the target's capture phase (vLLM's runner calls
    ``capture_model`` only when it captures its own), so there are none unless the
    target captures: on CUDA, without ``enforce_eager``, with a graph mode. ``auto``
    takes the target's capture sizes (the batch sizes the user tuned for); a list takes
    those buckets instead; ``false`` none."""
    from vllm.config import CUDAGraphMode

    target_captures = (device_type == "cuda" and not target_eager
                       and target_compilation.cudagraph_mode != CUDAGraphMode.NONE)
    if value is False or not target_captures:
        return ()
    sizes = value if isinstance(value, list) else target_compilation.cudagraph_capture_sizes or []
    return tuple(sorted(set(sizes)))
