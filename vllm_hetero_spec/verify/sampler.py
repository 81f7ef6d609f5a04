"""The rejection sampler registered in vLLM's spec-decode path.

It keeps vLLM's own handling of everything around verification (bonus sampling, logits
processors, penalties, temperature/top-k/top-p, logprobs), adds what vLLM's rejection
sampler lacks (min_p and logit_bias at the drafted rows: ``target_constraints.py``;
``min_tokens`` counting the drafts at the bonus row: ``bonus_position.py``), and
swaps the acceptance step for :func:`verify_tokens`, a pure-PyTorch rule that is
identical on every platform. This also sidesteps the CPU build's broken ``expand`` kernel
path for the acceptance itself.

Its inputs from drafting arrive as one :class:`VerifyPlan` per step, handed over by the
runner's propose hook (``vllm_integration/runner_hooks.py``): q in compact form, forced
rejections, fsd thresholds, and which requests must be verified one-hot. vLLM's dense
draft-probabilities slot is not used. Which rows are greedy comes from one place, vLLM's
own classification of the batch (:class:`BatchRows`): the device flags the rule reads and
the host list of rows that get random draws are both built from it, so a row can never be
verified stochastically without its uniforms. Greedy rows compare the draft with the
argmax of the target's logits, as vLLM does (a float32 softmax can tie near-equal logits).
Everything is created on the logits' device, and random draws from the global stream
are made only for rows verified stochastically. A seeded request is verified by
equality with its positions' seeded samples (``seeded.py``), so its tokens depend on
nothing but its seed, prompt and parameters.

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
from vllm.v1.sample.rejection_sampler import RejectionSampler
from vllm.v1.sample.sampler import Sampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

from vllm_hetero_spec.host_to_device import to_device
from vllm_hetero_spec.verify.bonus_position import bonus_logits_processors
from vllm_hetero_spec.verify.draft_probs import DraftProbs
from vllm_hetero_spec.verify.plan import VerifyPlan
from vllm_hetero_spec.verify.rules import FuzzyAcceptance, verify_tokens
from vllm_hetero_spec.verify.seeded import position_generators
from vllm_hetero_spec.verify.target_constraints import add_logit_bias, constrain, min_p_rows


@dataclass(frozen=True)
class BatchRows:
    """The rows being verified, as vLLM's runner holds them: ``req_ids[i]``, whether
    vLLM samples row i greedily (``SamplingType.GREEDY``: its temperature is stored as
    0, which is what ``sampling_metadata.temperature`` then carries), and
    ``positions[i]``, the index in its sequence (prompt included) of the first token row i
    emits this step (what a seeded row's draws are keyed by, ``verify/seeded.py``)."""

    req_ids: Sequence[str]
    greedy: Sequence[bool]
    positions: Sequence[int]


def _padded_index(num_draft: list[int], k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, K]`` indices into the flat draft-token axis (clamped for padding) and the
    ``[B]`` draft counts, to read vLLM's flattened layout as a padded block (built on
    ``device`` from the host-side counts, so no sync)."""
    counts = to_device(num_draft, torch.long, device)
    starts = torch.cumsum(counts, 0) - counts
    idx = starts.unsqueeze(1) + torch.arange(k, device=device).unsqueeze(0)
    return idx.clamp(max=max(sum(num_draft) - 1, 0)), counts


def _random_draws(
    sampled: list[int], b: int, k: int, vocab: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Uniforms ``[B, K]`` (zero outside ``sampled``), race noise ``[N, V]`` and the rows
    ``[N]`` it belongs to, for the rows verified stochastically (``sampled``, unseeded:
    seeded rows are verified by equality), from the global stream in one draw each."""
    uniform = torch.zeros(b, k, dtype=torch.float64, device=device)
    rows = to_device(sampled, torch.long, device)
    if sampled:
        uniform.index_copy_(0, rows, torch.rand(len(sampled), k, dtype=torch.float64, device=device))
    noise = torch.empty(len(sampled), vocab, dtype=torch.float32, device=device).exponential_()
    return uniform, noise, rows


def _seeded_choices(
    sampler: Sampler, target_logits: torch.Tensor, num_draft: list[int], seeded: dict[int, int],
    positions: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's own token at every verified position of the seeded rows that
    drafted: the flat rows ``[S]`` of ``target_logits`` (processed: temperature, min_p,
    top-k and top-p applied) and, for each, vLLM's seeded sample of that row with the
    generator of its (seed, position) -- what vLLM's sampler draws for the bonus or an
    undrafted step at that position."""
    starts = list(itertools.accumulate(num_draft, initial=0))
    flat, seeds, at = [], [], []
    for r, seed in seeded.items():
        flat += range(starts[r], starts[r] + num_draft[r])
        seeds += [seed] * num_draft[r]
        at += range(positions[r], positions[r] + num_draft[r])
    device = target_logits.device
    rows = to_device(flat, torch.long, device)
    gens = position_generators(range(len(flat)), seeds, at, device)
    chosen, _ = sampler.topk_topp_sampler(target_logits.index_select(0, rows), gens, None, None)
    return rows, chosen.long()


def _dummy_rows(b: int, all_greedy: bool) -> BatchRows:
    """Rows for a batch vLLM sends without requests (profiling, warm-up)."""
    return BatchRows([f"dummy-{i}" for i in range(b)], [all_greedy] * b, [0] * b)


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
        rows = self.batch_rows()
        # vLLM gives a generator, seeded with the request's seed, to each seeded sampled row.
        seeded = {r: g.initial_seed() for r, g in sampling_metadata.generators.items() if not rows.greedy[r]}
        if metadata.max_spec_len == 0 and sampling_metadata.max_num_logprobs is None:
            return self._undrafted(logits, sampling_metadata, rows, seeded)
        plan = plan or VerifyPlan()
        num_draft = list(metadata.num_draft_tokens)
        bonus_logits = logits.index_select(0, metadata.bonus_logits_indices)
        bonus_out = self.sampler(
            logits=bonus_logits,
            sampling_metadata=replace(
                sampling_metadata, max_num_logprobs=-1,
                generators=_keyed(seeded, rows, num_draft, logits.device),
                # Output-counting processors at the bonus position: committed + every draft.
                logitsprocs=bonus_logits_processors(sampling_metadata.logitsprocs, num_draft),
            ),
            predict_bonus_token=True,
            logprobs_mode_override="processed_logits" if self.is_processed_logprobs_mode else "raw_logits",
        )
        bonus_ids = bonus_out.sampled_token_ids.select(1, 0).long()

        raw_target_logits = logits.index_select(0, metadata.target_logits_indices).to(torch.float32)
        target_logits = raw_target_logits if self.is_processed_logprobs_mode else raw_target_logits.clone()
        target_logits = add_logit_bias(target_logits, sampling_metadata.logitsprocs, num_draft)
        target_logits = self.apply_logits_processors(target_logits, sampling_metadata, metadata)
        # Greedy rows (and seeded ones, below) are verified by equality with the target's token.
        target_choice = None if sampling_metadata.all_random else target_logits.argmax(dim=-1)
        min_p = min_p_rows(sampling_metadata.logitsprocs, metadata.cu_num_draft_tokens, target_logits.shape[0])
        target_logits = constrain(target_logits, metadata.cu_num_draft_tokens, sampling_metadata, min_p)

        b, k, vocab = len(num_draft), metadata.max_spec_len, target_logits.shape[-1]
        device = target_logits.device
        flat_index, counts = _padded_index(num_draft, k, device)
        draft_ids = metadata.draft_token_ids.long().index_select(0, flat_index.flatten()).view(b, k)
        if not rows.req_ids and b > 0:
            rows, plan = _dummy_rows(b, sampling_metadata.all_greedy), _dummy_plan(b, num_draft, vocab, device, self.fsd)
        if len(rows.req_ids) != b or len(rows.greedy) != b:
            raise RuntimeError(f"hetero spec: verifying {b} rows but the batch holds {len(rows.req_ids)} requests")
        block = plan.layout(rows.req_ids, num_draft, k, device)
        drafted_seeded = {r: s for r, s in seeded.items() if num_draft[r] > 0}
        if drafted_seeded:
            flat, chosen = _seeded_choices(self.sampler, target_logits, num_draft, drafted_seeded, rows.positions)
            if target_choice is None:  # no greedy row: the other rows never read it
                target_choice = torch.zeros(target_logits.shape[0], dtype=torch.long, device=device)
            target_choice = target_choice.index_copy(0, flat, chosen)
        exact = [g or r in drafted_seeded for r, g in enumerate(rows.greedy)]
        sampled = [r for r in range(b) if num_draft[r] > 0 and not exact[r]]
        uniform, noise, noise_rows = _random_draws(sampled, b, k, vocab, device)
        # Rows verified by equality read only target_choice: skip the softmax when no row needs p.
        target_probs = target_logits if not sampled and block.fuzzy is None else target_logits.softmax(dim=-1)
        out = verify_tokens(
            draft_ids, counts, flat_index, target_probs, block.q, bonus_ids, to_device(exact, torch.bool, device),
            uniform, noise, noise_rows, block.force_reject, _exact_for_seeded(block.fuzzy, drafted_seeded, device),
            target_choice=target_choice if any(exact) else None,
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

    def _undrafted(
        self, logits: torch.Tensor, sampling_metadata: SamplingMetadata, rows: BatchRows, seeded: dict[int, int]
    ) -> SamplerOutput:
        """A step where no row drafted (the budget chose k = 0, or no row came out with a
        proposal): vLLM 0.32.0 still sends every step of a speculative engine here, with
        one logits row per request (its bonus position). Sampled as plain decoding
        samples it, by vLLM's sampler alone, seeded rows with the generator of their
        position: verification of nothing would cost a dozen small tensor ops over the
        vocabulary per step, felt on a cheap target where most steps draft nothing
        (docs/benchmarks.md#gemma-3-270m-at-batch-1-t--1-what-our-engine-costs-where-nothing-drafts).
        ``predict_bonus_token`` as vLLM's rejection sampler sets it (penalties read the
        rows' drafts: none)."""
        keyed = _keyed(seeded, rows, [0] * len(rows.req_ids), logits.device)
        out = self.sampler(logits=logits, sampling_metadata=replace(sampling_metadata, generators=keyed),
                           predict_bonus_token=True)
        return SamplerOutput(sampled_token_ids=out.sampled_token_ids, logprobs_tensors=None)


def _keyed(seeded: dict[int, int], rows: BatchRows, offsets: Sequence[int], device: torch.device
           ) -> dict[int, torch.Generator]:
    """vLLM's ``generators`` for a sampler call whose row r emits the token at
    ``rows.positions[r] + offsets[r]``: each seeded row's generator of that position."""
    ordered = list(seeded)
    return position_generators(ordered, [seeded[r] for r in ordered],
                               [rows.positions[r] + offsets[r] for r in ordered], device)


def _exact_for_seeded(fuzzy: FuzzyAcceptance | None, seeded: dict[int, int], device: torch.device
                      ) -> FuzzyAcceptance | None:
    """fsd's test with tau = 0 on the seeded rows: fuzzy acceptance takes the drafted
    token, so it would make a seeded request's tokens depend on what was drafted."""
    if fuzzy is None or not seeded:
        return fuzzy
    keep = to_device([r not in seeded for r in range(fuzzy.threshold.shape[0])], torch.bool, device)
    return replace(fuzzy, threshold=fuzzy.threshold * keep)
