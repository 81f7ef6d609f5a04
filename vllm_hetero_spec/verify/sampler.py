"""The rejection sampler registered in vLLM's spec-decode path.

It keeps vLLM's own handling of everything around verification (bonus sampling, logits
processors, penalties, temperature/top-k/top-p, logprobs) and swaps the acceptance step
for :func:`verify_tokens`, a pure-PyTorch rule that is identical on every platform. This
also sidesteps the CPU build's broken ``expand`` kernel path for the acceptance itself.

Its inputs from drafting arrive as one :class:`VerifyPlan` per step, handed over by the
runner's propose hook (``vllm_patches.py``): q in compact form, forced rejections, fsd
thresholds, and which requests must be verified one-hot. vLLM's dense
draft-probabilities slot is not used. Which rows are greedy comes from one place, vLLM's
own classification of the batch (:class:`BatchRows`): the device flags the rule reads and
the host list of rows that get random draws are both built from it, so a row can never be
verified stochastically without its uniforms. Greedy rows compare the draft with the
argmax of the target's logits, as vLLM does (a float32 softmax can tie near-equal logits).
Everything is created on the logits' device, random draws are made only for rows
verified stochastically, and a seeded request draws from its own generator exactly what
vLLM's sampler draws for it (uniforms for its own draft count, then one noise row), so
its output does not depend on the rest of the batch.

vLLM also calls the sampler with no request in the batch: the memory profile and warm-up
(``_dummy_sampler_run``) send one dummy draft per row. Those rows are verified like real
ones, stochastically with a dense q over the whole vocabulary (the path with the largest
transient tensors, as vLLM's own dummy run uses probabilistic draft probabilities), or
greedily when vLLM asks for its all-greedy variant. A step where no row has a draft
(most steps where drafting does not pay) is sampled by vLLM's sampler alone, as plain
decoding samples it (unless it asks for logprobs, which keep the full path).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from vllm.config import SpeculativeConfig
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.rejection_sampler import RejectionSampler, apply_sampling_constraints
from vllm.v1.sample.sampler import Sampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

from vllm_hetero_spec.host_to_device import to_device
from vllm_hetero_spec.verify.draft_probs import DraftProbs
from vllm_hetero_spec.verify.plan import VerifyPlan
from vllm_hetero_spec.verify.rules import verify_tokens


@dataclass(frozen=True)
class BatchRows:
    """The rows being verified, as vLLM's runner holds them: ``req_ids[i]`` and whether
    vLLM samples row i greedily (``SamplingType.GREEDY``: its temperature is stored as
    0, which is what ``sampling_metadata.temperature`` then carries)."""

    req_ids: Sequence[str]
    greedy: Sequence[bool]


def _padded_index(num_draft: list[int], k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, K]`` indices into the flat draft-token axis (clamped for padding) and the
    ``[B]`` draft counts, to read vLLM's flattened layout as a padded block (built on
    ``device`` from the host-side counts, so no sync)."""
    counts = to_device(num_draft, torch.long, device)
    starts = torch.cumsum(counts, 0) - counts
    idx = starts.unsqueeze(1) + torch.arange(k, device=device).unsqueeze(0)
    return idx.clamp(max=max(sum(num_draft) - 1, 0)), counts


def _random_draws(
    sampled: list[int], num_draft: list[int], k: int, vocab: int, generators: dict[int, torch.Generator],
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Uniforms ``[B, K]`` (zero outside ``sampled``), race noise ``[N, V]`` and the rows
    ``[N]`` it belongs to: unseeded rows from the global stream in one draw, then each
    seeded row from its generator, in vLLM's order (its uniforms, then its noise row)."""
    b = len(num_draft)
    unseeded = [r for r in sampled if r not in generators]
    seeded = [r for r in sampled if r in generators]
    uniform = torch.zeros(b, k, dtype=torch.float64, device=device)
    if unseeded:
        rows = to_device(unseeded, torch.long, device)
        uniform.index_copy_(0, rows, torch.rand(len(unseeded), k, dtype=torch.float64, device=device))
    noise = torch.empty(len(sampled), vocab, dtype=torch.float32, device=device)
    noise.narrow(0, 0, len(unseeded)).exponential_()
    for r in seeded:
        uniform.select(0, r).narrow(0, 0, num_draft[r]).uniform_(generator=generators[r])
    for j, r in enumerate(seeded):
        noise.select(0, len(unseeded) + j).exponential_(generator=generators[r])
    noise_rows = to_device(unseeded + seeded, torch.long, device)
    return uniform, noise, noise_rows


def _dummy_rows(b: int, all_greedy: bool) -> BatchRows:
    """Rows for a batch vLLM sends without requests (profiling, warm-up)."""
    return BatchRows([f"dummy-{i}" for i in range(b)], [all_greedy] * b)


def _dummy_plan(
    b: int, num_draft: list[int], vocab: int, device: torch.device, fsd: tuple[str, int] | None
) -> VerifyPlan:
    """A dense q row over the whole vocabulary for every dummy draft, as vLLM's own
    dummy run passes probabilistic draft probabilities: the profile then sees the
    largest compact q a step can hold. With ``fsd`` (its divergence and top-k) every
    row also gets a threshold, so the profile covers fsd's dense ``[B, K, V]``
    divergence, a step's largest transient (about 3.7 GB at B = 256 for Qwen's vocabulary)."""
    ends = list(itertools.accumulate(num_draft))
    probs = torch.full((ends[-1] if ends else 0, vocab), 1.0 / vocab, dtype=torch.float32, device=device)
    plan = VerifyPlan(DraftProbs(probs, torch.arange(vocab, device=device)))
    plan.q_index = {f"dummy-{i}": list(range(end - n, end)) for i, (n, end) in enumerate(zip(num_draft, ends))}
    if fsd is not None:
        plan.divergence, plan.topk = fsd
        plan.fsd_threshold = {req_id: 1.0 for req_id in plan.q_index}
    return plan


class HeteroRejectionSampler(RejectionSampler):
    """vLLM ``RejectionSampler`` whose acceptance step is :func:`verify_tokens`.

    ``batch_rows`` returns the rows being verified (the runner's batch order at
    verification; none during vLLM's dummy runs); :attr:`plan` is set before each
    verification and used once. ``fsd`` (the divergence and its top-k) when the
    algorithm is ``fsd``: vLLM's dummy runs then verify with fuzzy acceptance too.
    """

    def __init__(
        self,
        sampler: Sampler,
        spec_config: SpeculativeConfig | None,
        device: torch.device | None,
        batch_rows: Callable[[], BatchRows],
        fsd: tuple[str, int] | None = None,
    ) -> None:
        super().__init__(sampler, spec_config, device)
        self.batch_rows = batch_rows
        self.fsd = fsd
        self.plan: VerifyPlan | None = None

    def forward(
        self,
        metadata: SpecDecodeMetadata,
        draft_probs: torch.Tensor | None,
        logits: torch.Tensor,
        sampling_metadata: SamplingMetadata,
    ) -> SamplerOutput:
        plan, self.plan = self.plan, None
        if metadata.max_spec_len == 0 and sampling_metadata.max_num_logprobs is None:
            return self._undrafted(logits, sampling_metadata)
        plan = plan or VerifyPlan()
        bonus_logits = logits.index_select(0, metadata.bonus_logits_indices)
        bonus_out = self.sampler(
            logits=bonus_logits,
            sampling_metadata=replace(sampling_metadata, max_num_logprobs=-1),
            predict_bonus_token=True,
            logprobs_mode_override="processed_logits" if self.is_processed_logprobs_mode else "raw_logits",
        )
        bonus_ids = bonus_out.sampled_token_ids.select(1, 0).long()

        raw_target_logits = logits.index_select(0, metadata.target_logits_indices).to(torch.float32)
        target_logits = raw_target_logits if self.is_processed_logprobs_mode else raw_target_logits.clone()
        target_logits = self.apply_logits_processors(target_logits, sampling_metadata, metadata)
        target_logits = apply_sampling_constraints(target_logits, metadata.cu_num_draft_tokens, sampling_metadata)

        num_draft = list(metadata.num_draft_tokens)
        b, k, vocab = len(num_draft), metadata.max_spec_len, target_logits.shape[-1]
        device = target_logits.device
        flat_index, counts = _padded_index(num_draft, k, device)
        draft_ids = metadata.draft_token_ids.long().index_select(0, flat_index.flatten()).view(b, k)
        rows = self.batch_rows()
        if not rows.req_ids and b > 0:
            rows, plan = _dummy_rows(b, sampling_metadata.all_greedy), _dummy_plan(b, num_draft, vocab, device, self.fsd)
        if len(rows.req_ids) != b or len(rows.greedy) != b:
            raise RuntimeError(f"hetero spec: verifying {b} rows but the batch holds {len(rows.req_ids)} requests")
        block = plan.layout(rows.req_ids, num_draft, k, device)
        sampled = [r for r in range(b) if num_draft[r] > 0 and not rows.greedy[r]]
        any_greedy = any(rows.greedy)
        greedy = to_device(list(rows.greedy), torch.bool, device)
        uniform, noise, noise_rows = _random_draws(sampled, num_draft, k, vocab, sampling_metadata.generators, device)
        # Greedy rows read only the argmax: skip the softmax when no row needs p.
        target_probs = target_logits if not sampled and block.fuzzy is None else target_logits.softmax(dim=-1)
        out = verify_tokens(
            draft_ids, counts, flat_index, target_probs, block.q, bonus_ids, greedy, uniform, noise, noise_rows,
            block.force_reject, block.fuzzy, target_argmax=target_logits.argmax(dim=-1) if any_greedy else None,
        )
        output_token_ids = out.to(torch.int32)

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

    def _undrafted(self, logits: torch.Tensor, sampling_metadata: SamplingMetadata) -> SamplerOutput:
        """A step where no row drafted (the budget chose k = 0, or no row came out with a
        proposal): vLLM 0.32.0 still sends every step of a speculative engine here, with
        one logits row per request (its bonus position). Sampled as plain decoding
        samples it, by vLLM's sampler alone: verification of nothing would cost a dozen
        small tensor ops per step (about 1 ms on a 262k vocabulary, 1% of a Gemma-3-270M
        step on a CPU). ``predict_bonus_token`` as vLLM's rejection sampler sets it
        (penalties read the rows' drafts: none)."""
        out = self.sampler(logits=logits, sampling_metadata=sampling_metadata, predict_bonus_token=True)
        return SamplerOutput(sampled_token_ids=out.sampled_token_ids, logprobs_tensors=None)
