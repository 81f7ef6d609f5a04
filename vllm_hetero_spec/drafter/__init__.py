"""The drafter: the draft model's per-request state and the step that drafts for a batch.

Rooms, by concern:

- ``runtime/``: the draft model on vLLM's machinery (model, paged KV, layout, CUDA
  graphs, input staging, TP group) and the one place every ``auto`` runtime setting
  becomes concrete (``runtime/config.py``);
- ``rules/``: what each rule does differently (one module per family, ``slrs``
  with its string-level law psi), registered once in ``rules/registry.py``;
- ``placement/``: where drafting runs (in process, a Ray actor, pipelined);
- here: the engine (request state, the shared draft loop) and the messages it
  exchanges with the proposer.

The names below are the drafter's interface: what the vLLM wing (``vllm_integration/``)
may use, and all it imports from here (``tests/plugin/test_import_graph.py``).
"""

from vllm_hetero_spec.drafter.messages import DrafterStats, RequestParams, StepBatch, StepDrafts
from vllm_hetero_spec.drafter.placement.hosts import DrafterHost, make_host
from vllm_hetero_spec.drafter.runtime.config import RuntimeConfig, draft_load, resolve_runtime_config
from vllm_hetero_spec.drafter.runtime.draft_dtype import cpu_flags, platform_device_type, resolve_draft_dtype
from vllm_hetero_spec.drafter.runtime.model import draft_vllm_config
from vllm_hetero_spec.drafter.runtime.tp_group import join_draft_tp_group
from vllm_hetero_spec.drafter.rules.base import DraftRule
from vllm_hetero_spec.drafter.rules.registry import divergence_rule, forward_only_rules

__all__ = [
    "DrafterHost", "DrafterStats", "RequestParams", "RuntimeConfig", "StepBatch", "StepDrafts", "DraftRule",
    "cpu_flags", "divergence_rule", "draft_load", "draft_vllm_config", "forward_only_rules",
    "join_draft_tp_group", "make_host", "platform_device_type", "resolve_draft_dtype", "resolve_runtime_config",
]
