"""vLLM's rejection-sampler inputs built by hand: the spec-decode layout of a batch of
drafts and the sampling metadata of its rows, as the runner builds them."""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

from vllm_hetero_spec.verify.sampler import BatchRows

GREEDY_EPS = 1e-5  # vLLM's: below it a request is sampled greedily


def batch_rows(req_ids: list[str], temperature: list[float] | None = None) -> BatchRows:
    """The rows as vLLM's runner would classify them (greedy below 1e-5; all at T = 1
    unless given)."""
    temps = [1.0] * len(req_ids) if temperature is None else temperature
    return BatchRows(list(req_ids), [t < GREEDY_EPS for t in temps])


def spec_metadata(drafts: list[list[int]], device: str | torch.device = "cpu") -> SpecDecodeMetadata:
    """Each row's drafts, then its bonus position, flattened (vLLM's layout)."""
    counts = [len(d) for d in drafts]
    target_idx, bonus_idx, offset = [], [], 0
    for n in counts:
        target_idx += range(offset, offset + n)
        bonus_idx.append(offset + n)
        offset += n + 1
    i32 = dict(dtype=torch.int32, device=device)
    return SpecDecodeMetadata(
        torch.tensor(sum(drafts, []), **i32), counts, torch.tensor(counts, **i32).cumsum(0, dtype=torch.int32),
        (torch.tensor(counts, **i32) + 1).cumsum(0, dtype=torch.int32), torch.tensor(target_idx, **i32),
        torch.tensor(bonus_idx, **i32), torch.arange(offset, **i32),
    )


def sampling_metadata(
    b: int,
    temperature: list[float] | None = None,
    top_k: list[int] | None = None,
    top_p: list[float] | None = None,
    generators: dict[int, torch.Generator] | None = None,
    device: str | torch.device = "cpu",
) -> SamplingMetadata:
    """``b`` rows at temperature 1 unless given; below 1e-5 is greedy (stored as 0, as
    vLLM's input batch does)."""
    temps = [1.0] * b if temperature is None else temperature
    greedy = [t < GREEDY_EPS for t in temps]
    zeros = torch.zeros(b, device=device)
    return SamplingMetadata(
        temperature=None if all(greedy) else torch.tensor([0.0 if g else t for g, t in zip(greedy, temps)],
                                                          device=device),
        all_greedy=all(greedy), all_random=not any(greedy),
        top_p=None if top_p is None else torch.tensor(top_p, device=device),
        top_k=None if top_k is None else torch.tensor(top_k, dtype=torch.int32, device=device),
        generators=generators or {}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=zeros, presence_penalties=zeros, repetition_penalties=torch.ones(b, device=device),
        output_token_ids=[[] for _ in range(b)], allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )
