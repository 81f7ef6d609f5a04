"""One step's drafts from tensor-parallel rank 0 to every rank, q on each rank's device.

Rank 0 alone drafts; vLLM's scheduler runs its proposals, and every rank must verify
them with the q they were drawn from. The drafts travel as vLLM's
``GroupCoordinator.broadcast_tensor_dict`` sends a step's inputs: the host-side layout
(ids, q row indices, forced rejections, fsd thresholds, the batch rows drafted) pickled
over the CPU group, q's two tensors over the device group, arriving on each rank's own
device with no host copy. ``None`` (no drafts this step, or drafting failed on rank 0)
reaches every rank the same way, so they fall back together.

The rank check (``VLLM_HETERO_SPEC_CHECK_RANKS=1``) lives here too: it is what shows the
ranks verified the same drafts.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import torch

from vllm_hetero_spec.drafter import StepDrafts
from vllm_hetero_spec.verify.draft_probs import DraftProbs

_PROBS, _SUPPORT, _LAYOUT = "q_probs", "q_support", "layout"
#: Set to 1 to compare every step's sampled tokens and proposals across TP ranks.
CHECK_RANKS_ENV = "VLLM_HETERO_SPEC_CHECK_RANKS"


def tp_group() -> Any:
    """vLLM's tensor-parallel group when there is more than one rank, else None."""
    try:
        from vllm.distributed import parallel_state

        group = parallel_state.get_tp_group()
    except (AssertionError, ImportError, AttributeError):
        return None
    return group if group.world_size > 1 else None


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


def ranks_agree(group: Any, req_ids: list[str], sampled: list[list[int]], drafts: StepDrafts | None) -> bool:
    """Whether every rank of ``group`` sampled the same tokens and holds the same
    proposals (one all-gather): if not, their token histories, and so their KV caches,
    drift apart."""
    proposals = None if drafts is None else drafts.ids
    digest = hashlib.blake2b(repr((req_ids, sampled, proposals)).encode(), digest_size=16).hexdigest()
    digests: list[str | None] = [None] * group.world_size
    torch.distributed.all_gather_object(digests, digest, group=group.cpu_group)
    return len(set(digests)) == 1
