"""One step's drafts from tensor-parallel rank 0 to every rank, q on each rank's device.

Rank 0 alone drafts; vLLM's scheduler runs its proposals, and every rank must verify
them with the q they were drawn from. The drafts travel as vLLM's
``GroupCoordinator.broadcast_tensor_dict`` sends a step's inputs: the host-side layout
(ids, q row indices, forced rejections, fsd thresholds, the batch rows drafted) pickled
over the CPU group, q's two tensors over the device group, arriving on each rank's own
device with no host copy. ``None`` (no drafts this step, or drafting failed on rank 0)
reaches every rank the same way, so they fall back together.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm_hetero_spec.drafter.messages import StepDrafts
from vllm_hetero_spec.verify.draft_probs import DraftProbs

_PROBS, _SUPPORT, _LAYOUT = "q_probs", "q_support", "layout"


def share_drafts(group: Any, drafts: StepDrafts | None, rows: list[int]) -> tuple[StepDrafts | None, list[int]]:
    """Rank 0's ``(drafts, rows)`` on every rank of ``group`` (a vLLM ``GroupCoordinator``);
    rank 0 gets its own back."""
    if group.rank_in_group == 0:
        payload: dict[str, Any] = {_LAYOUT: (None if drafts is None else dataclasses.replace(drafts, q=None), rows)}
        if drafts is not None and drafts.q is not None:
            payload[_PROBS], payload[_SUPPORT] = drafts.q.probs, drafts.q.support
        group.broadcast_tensor_dict(payload, src=0)
        return drafts, rows
    payload = group.broadcast_tensor_dict(None, src=0)
    layout, rows = payload[_LAYOUT]
    if layout is not None and _PROBS in payload:
        layout.q = DraftProbs(payload[_PROBS], payload[_SUPPORT])
    return layout, rows
