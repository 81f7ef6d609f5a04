"""The drafter's output layer over a subset of its vocabulary (``draft_head_tokens``).

A drafter proposes mostly frequent tokens, yet its output layer computes a logit for every
token, one weight row each: with a large vocabulary, a share of each forward's weight
reads comparable to the rest of a small model's. :class:`DraftHead` keeps the rows of ``ids``
(``vocab/frequent_tokens.py`` picks them) as one contiguous matrix, copied once at load,
and returns logits of the full width with ``-inf`` outside ``ids``. So every rule and
draft rule reads them unchanged: the drafter never samples a token outside ``ids`` (its
probability is 0), and the q a rule verifies with is the distribution it sampled from,
so losslessness holds as with the whole head. Verification is the target's and never
changes.

The matmul runs through vLLM's unquantized GEMM, as the drafter's own head does
(``UnquantizedEmbeddingMethod.apply``): on a CPU its prepacked oneDNN path, elsewhere its
default (``default_unquantized_gemm``; the ROCm and FlashInfer kernels vLLM may pick
instead are for the target's bf16 layers); the logits processor's soft cap and scale
follow as in ``LogitsProcessor.forward``. A
quantized head keeps the model's own path, and :func:`draft_head` says why. So would one
sharded by tensor parallelism, a guard only: the drafter runs whole on one rank
(``tp_group.py``).
"""

from __future__ import annotations

from typing import Any

import torch


class DraftHead(torch.nn.Module):
    """Logits over ``ids`` (sorted, on the drafter's device), ``-inf`` elsewhere."""

    def __init__(self, model: Any, ids: torch.Tensor, vocab_size: int):
        from vllm.model_executor.layers.utils import (
            cpu_unquantized_gemm, default_unquantized_gemm, dispatch_cpu_unquantized_gemm)

        super().__init__()
        head, processor = model.lm_head, model.logits_processor
        dtype = getattr(processor, "head_dtype", None) or head.weight.dtype
        self.weight = torch.nn.Parameter(head.weight.detach().index_select(0, ids).to(dtype).contiguous(),
                                         requires_grad=False)  # [len(ids), hidden]
        bias = getattr(head, "bias", None)
        self.bias = None if bias is None else bias.detach().index_select(0, ids).to(dtype)
        self.register_buffer("ids", ids, persistent=False)  # [len(ids)]
        self.vocab_size = vocab_size
        self.soft_cap = processor.soft_cap
        self.scale = processor.scale
        self.gemm = default_unquantized_gemm
        if ids.device.type == "cpu":
            dispatch_cpu_unquantized_gemm(self, remove_weight=False)
            self.gemm = cpu_unquantized_gemm

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` ``[rows, hidden]`` -> float32 logits ``[rows, vocab_size]``."""
        part = self.gemm(self, hidden.to(self.weight.dtype), self.weight, self.bias)
        if self.soft_cap is not None:
            part = torch.tanh(part / self.soft_cap) * self.soft_cap
        if self.scale != 1.0:
            part = part * self.scale
        logits = hidden.new_full((hidden.shape[0], self.vocab_size), float("-inf"), dtype=torch.float32)
        return logits.index_copy_(1, self.ids, part.float())


def draft_head(model: Any, ids: torch.Tensor, vocab_size: int) -> tuple[DraftHead | None, str]:
    """A :class:`DraftHead` for ``model``, or ``None`` and why its own head stays."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    head = getattr(model, "lm_head", None)
    if head is None or getattr(model, "logits_processor", None) is None:
        return None, "the model has no lm_head and logits processor to take rows from"
    if not isinstance(getattr(head, "quant_method", None), (UnquantizedEmbeddingMethod, UnquantizedLinearMethod)):
        return None, "its output layer is quantized"
    if getattr(head, "tp_size", 1) > 1:
        return None, "its output layer is sharded"
    return DraftHead(model, ids, vocab_size), ""
