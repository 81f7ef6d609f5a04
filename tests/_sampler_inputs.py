"""vLLM's rejection-sampler inputs built by hand: the spec-decode layout of a batch of
drafts and the sampling metadata of its rows, as the runner builds them."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BUILTIN_LOGITS_PROCESSORS, BatchUpdate, LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

from vllm_hetero_spec.verify.sampler import BatchRows

GREEDY_EPS = 1e-5  # vLLM's: below it a request is sampled greedily


def batch_rows(
    req_ids: list[str], temperature: list[float] | None = None, positions: list[int] | None = None
) -> BatchRows:
    """The rows as vLLM's runner would classify them (greedy below 1e-5; all at T = 1
    unless given), each emitting from ``positions`` (all 0 unless given)."""
    temps = [1.0] * len(req_ids) if temperature is None else temperature
    return BatchRows(list(req_ids), [t < GREEDY_EPS for t in temps], positions or [0] * len(req_ids))


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
        torch.tensor([t for d in drafts for t in d], **i32), counts, torch.tensor(counts, **i32).cumsum(0, dtype=torch.int32),
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
    logitsprocs: LogitsProcessors | None = None,
) -> SamplingMetadata:
    """``b`` rows at temperature 1 unless given; below 1e-5 is greedy (stored as 0, as
    vLLM's input batch does); ``logitsprocs`` as :func:`logits_processors` builds them."""
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
        logitsprocs=logitsprocs or LogitsProcessors(),
    )


def logits_processors(params: list[SamplingParams], device: str | torch.device = "cpu",
                      outputs: list[list[int]] | None = None) -> LogitsProcessors:
    """vLLM's built-in logits processors (min_p, logit_bias, min_tokens) holding the
    requests ``params`` at rows 0..B-1, with ``outputs`` committed (none unless given),
    brought there by vLLM's own batch update."""
    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=len(params)))
    procs = LogitsProcessors(ctor(config, torch.device(device), False) for ctor in BUILTIN_LOGITS_PROCESSORS)
    outputs = outputs or [[] for _ in params]
    update = BatchUpdate(len(params), [], [(i, p, [], outputs[i]) for i, p in enumerate(params)], [])
    for proc in procs.all:
        proc.update_state(update)
    return procs


def penalties(n: int, prompt: list[int], repetition: float = 1.0, presence: float = 0.0,
              frequency: float = 0.0) -> dict:
    """``SamplingMetadata`` fields that turn on vLLM's penalties for ``n`` rows of one
    ``prompt`` (for ``dataclasses.replace``)."""
    return {"no_penalties": False, "prompt_token_ids": torch.tensor([prompt] * n),
            "repetition_penalties": torch.full((n,), repetition), "presence_penalties": torch.full((n,), presence),
            "frequency_penalties": torch.full((n,), frequency)}
