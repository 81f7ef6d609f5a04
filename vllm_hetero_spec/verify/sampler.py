"""The rejection sampler registered in vLLM's spec-decode path.

It keeps vLLM's own handling of everything around verification (bonus sampling, logits
processors, penalties, temperature/top-k/top-p, logprobs) and swaps the acceptance step
for :func:`verify_block`, a pure-PyTorch rule that is identical on every platform. This
also sidesteps the CPU build's broken ``expand`` kernel path for the acceptance itself.
``union``'s forced rejections and ``fsd``'s fuzzy test come from the proposer through
``verify_inputs`` (see ``verify/plan.py``), laid out for the batch being verified.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
from vllm.config import SpeculativeConfig
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.rejection_sampler import GREEDY_TEMPERATURE, RejectionSampler, apply_sampling_constraints
from vllm.v1.sample.sampler import Sampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

from vllm_hetero_spec.verify.rules import FuzzyAcceptance, verify_block

# (rows B, block length K) -> ([B, K] forced rejections or None, fuzzy test or None)
VerifyInputs = Callable[[int, int], tuple[torch.Tensor | None, FuzzyAcceptance | None]]


def _padded_index(num_draft: list[int], k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, K]`` indices into the flat draft-token axis (clamped for padding) and the
    ``[B]`` draft counts, to turn vLLM's flattened layout into a padded block (built on
    ``device`` from the host-side counts, so no sync)."""
    counts = torch.tensor(num_draft, dtype=torch.long, device=device)
    starts = torch.cumsum(counts, 0) - counts
    idx = starts.unsqueeze(1) + torch.arange(k, device=device).unsqueeze(0)
    return idx.clamp(max=max(sum(num_draft) - 1, 0)), counts


class HeteroRejectionSampler(RejectionSampler):
    """vLLM ``RejectionSampler`` whose acceptance step is :func:`verify_block`.

    ``verify_inputs`` (the proposer's) is called once per verification and yields the
    step's forced rejections and fuzzy test; ``None`` means neither is ever used.
    """

    def __init__(
        self,
        sampler: Sampler,
        spec_config: SpeculativeConfig | None = None,
        device: torch.device | None = None,
        verify_inputs: VerifyInputs | None = None,
    ) -> None:
        super().__init__(sampler, spec_config, device)
        self.verify_inputs = verify_inputs

    def forward(
        self,
        metadata: SpecDecodeMetadata,
        draft_probs: torch.Tensor | None,
        logits: torch.Tensor,
        sampling_metadata: SamplingMetadata,
    ) -> SamplerOutput:
        bonus_logits = logits[metadata.bonus_logits_indices]
        bonus_out = self.sampler(
            logits=bonus_logits,
            sampling_metadata=replace(sampling_metadata, max_num_logprobs=-1),
            predict_bonus_token=True,
            logprobs_mode_override="processed_logits" if self.is_processed_logprobs_mode else "raw_logits",
        )
        bonus_ids = bonus_out.sampled_token_ids[:, 0].long()

        raw_target_logits = logits[metadata.target_logits_indices].to(torch.float32)
        target_logits = raw_target_logits if self.is_processed_logprobs_mode else raw_target_logits.clone()
        target_logits = self.apply_logits_processors(target_logits, sampling_metadata, metadata)
        target_logits = apply_sampling_constraints(target_logits, metadata.cu_num_draft_tokens, sampling_metadata)

        b = len(metadata.num_draft_tokens)
        k = metadata.max_spec_len
        device = target_logits.device
        idx, counts = _padded_index(metadata.num_draft_tokens, k, device)
        target_probs = target_logits.softmax(dim=-1)[idx]
        draft_block = None if draft_probs is None else draft_probs.to(torch.float32)[idx]
        draft_ids = metadata.draft_token_ids.long()[idx]

        if sampling_metadata.all_greedy or sampling_metadata.temperature is None:
            greedy = torch.ones(b, dtype=torch.bool, device=device)
        else:
            greedy = sampling_metadata.temperature == GREEDY_TEMPERATURE
        uniform = torch.rand(b, k, dtype=torch.float64, device=device)
        noise = torch.empty(b, target_probs.shape[-1], device=device).exponential_()
        for row, gen in sampling_metadata.generators.items():
            if metadata.num_draft_tokens[row] > 0:
                uniform[row].uniform_(generator=gen)
                noise[row].exponential_(generator=gen)

        force_reject = fuzzy = None
        # Without draft probabilities (vLLM matched none to some request) verification
        # is one-hot, which is lossless for any proposal, union's placeholders included.
        if draft_block is not None and self.verify_inputs is not None:
            force_reject, fuzzy = self.verify_inputs(b, k)
        out = verify_block(
            draft_ids, counts, target_probs, draft_block, bonus_ids, greedy, uniform, noise, force_reject, fuzzy
        )
        output_token_ids = out.to(torch.int32).to(logits.device)

        logprobs_tensors = None
        if sampling_metadata.max_num_logprobs is not None:
            logprobs_tensors = self._get_logprobs_tensors(
                sampling_metadata.max_num_logprobs,
                metadata,
                logits,
                target_logits if self.is_processed_logprobs_mode else raw_target_logits,
                bonus_out.logprobs_tensors.logprobs,
                output_token_ids,
            )
        return SamplerOutput(sampled_token_ids=output_token_ids, logprobs_tensors=logprobs_tensors)
