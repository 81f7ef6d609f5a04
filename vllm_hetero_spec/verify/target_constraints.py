"""What plain decoding does to a request's logits, done at every verified position.

vLLM 0.32 refuses ``min_p`` and ``logit_bias`` with speculative decoding: its logits
processors hold one row per request, and its rejection sampler has ``[T, V]`` rows, one
per drafted position. Our verification owns those rows, so it applies both exactly as
vLLM's plain ``Sampler`` applies them to a request's row, in the same order:

1. ``logit_bias`` is added before anything else of vLLM's rejection sampler
   (penalties, allowed ids, bad words, min_tokens): plain decoding adds it before the
   penalties, which read the sign of a logit; the masks commute with it;
2. temperature, then ``min_p`` (on the tempered law, as vLLM's argmax-invariant
   processors run), then top-k and top-p (``apply_sampling_constraints`` with min_p
   inserted where the plain sampler has it: the top-p head is taken over what min_p
   left).

The bonus position and undrafted steps go through vLLM's own sampler, whose processors
already hold one row per request. Greedy rows read the argmax after step 1, as plain
decoding does.
"""

from __future__ import annotations

import torch
from vllm.v1.sample import rejection_sampler
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.logits_processor.builtin import LogitBiasLogitsProcessor, MinPLogitsProcessor
from vllm.v1.sample.metadata import SamplingMetadata

from vllm_hetero_spec.host_to_device import to_device


def _find(logitsprocs: LogitsProcessors, kind: type) -> object | None:
    return next((p for p in logitsprocs.all if isinstance(p, kind)), None)


def add_logit_bias(logits: torch.Tensor, logitsprocs: LogitsProcessors, num_draft: list[int]) -> torch.Tensor:
    """Add each request's ``logit_bias`` to its drafted rows of ``logits`` ``[T, V]`` (in
    place), from vLLM's processor state (request row -> {token: bias}), laid out on the
    host and uploaded once."""
    bias = _find(logitsprocs, LogitBiasLogitsProcessor)
    if bias is None or not bias.biases:
        return logits
    starts = [0]
    for n in num_draft:
        starts.append(starts[-1] + n)
    rows, tokens, values = [], [], []
    for req, table in bias.biases.items():
        for row in range(starts[req], starts[req] + num_draft[req]):
            rows += [row] * len(table)
            tokens += table.keys()
            values += table.values()
    if not rows:
        return logits
    device = logits.device
    index = (to_device(rows, torch.long, device), to_device(tokens, torch.long, device))
    return logits.index_put_(index, to_device(values, logits.dtype, device), accumulate=True)


def min_p_rows(
    logitsprocs: LogitsProcessors, cu_num_draft_tokens: torch.Tensor, num_tokens: int
) -> torch.Tensor | None:
    """``[T, 1]`` each drafted row's ``min_p`` (its request's), or ``None`` when no
    request of the batch sets one."""
    min_p = _find(logitsprocs, MinPLogitsProcessor)
    if min_p is None or not min_p.min_p_count:
        return None
    per_request = min_p.min_p.view(-1)
    return rejection_sampler.expand_batch_to_tokens(per_request, cu_num_draft_tokens, num_tokens).unsqueeze(1)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """vLLM's ``MinPLogitsProcessor.apply`` with one threshold per row: drop the tokens
    whose probability is below ``min_p`` times the row's largest."""
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True).mul_(min_p)
    return logits.masked_fill_(probs < threshold, float("-inf"))


def constrain(
    logits: torch.Tensor, cu_num_draft_tokens: torch.Tensor, sampling_metadata: SamplingMetadata,
    min_p: torch.Tensor | None,
) -> torch.Tensor:
    """vLLM's ``apply_sampling_constraints`` (temperature, top-k, top-p; greedy rows at
    temperature 1; nothing for an all-greedy batch) with ``min_p`` ``[T, 1]`` applied
    after the temperature. vLLM's functions are looked up at call time, so the
    plugin's replacements of them (``vllm_integration/cpu_fixes.py``) apply here too."""
    if sampling_metadata.all_greedy:
        return logits
    num_tokens = logits.shape[0]
    expand = rejection_sampler.expand_batch_to_tokens
    temperature = expand(sampling_metadata.temperature, cu_num_draft_tokens, num_tokens,
                         replace_from=rejection_sampler.GREEDY_TEMPERATURE, replace_to=1)
    top_k = None if sampling_metadata.top_k is None else expand(sampling_metadata.top_k, cu_num_draft_tokens,
                                                                 num_tokens)
    top_p = None if sampling_metadata.top_p is None else expand(sampling_metadata.top_p, cu_num_draft_tokens,
                                                                 num_tokens)
    logits.div_(temperature.unsqueeze(-1))
    if min_p is not None:
        apply_min_p(logits, min_p)
    return rejection_sampler.apply_top_k_top_p(logits, top_k, top_p)
