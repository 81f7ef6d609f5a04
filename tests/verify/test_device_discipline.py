"""The drafter's per-step tensor work runs on the runtime's device with no host sync
beyond the one the bridge needs, shown without a GPU: under ``FakeTensorMode`` tensors
live on a fake ``cuda`` device, and mixing in a CPU tensor raises
(``FakeTensorDeviceMismatchError``), as does a host sync such as ``.item()`` or
``.tolist()`` (``DataDependentOutputException``).

Covered: the drafter's sampling (temperature, top-k, top-p, greedy, the exact q it
sampled from), the intersection map and q carried onto the target vocabulary, for
every token-level algorithm.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from vllm_hetero_spec.drafter.sampling import SamplingRows, processed_probs, sample
from vllm_hetero_spec.drafter.rules.mapped_sampling import TOKEN_LEVEL, draft_step
from vllm_hetero_spec.vocab.intersection import VocabIntersection

CUDA = torch.device("cuda")
_INTERSECTION_TENSORS = ("draft_to_target", "draft_mask", "shared_draft_ids", "shared_target_ids", "support", "support_col")
DRAFT_V, TARGET_V = 64, 80


def _intersection() -> VocabIntersection:
    draft = [None] + [f"t{i}".encode() for i in range(1, DRAFT_V)]
    target = [f"t{i}".encode() if i % 3 else f"x{i}".encode() for i in range(TARGET_V)]
    return VocabIntersection.build(draft, target)


def _rows(device: torch.device) -> SamplingRows:
    return SamplingRows.build(
        temperature=[0.0, 0.7, 1.0, 1.3], top_k=[0, 5, 0, 20], top_p=[1.0, 0.9, 0.8, 1.0],
        generators=[None] * 4, device=device,
    )


def test_fake_cuda_catches_host_tensors_and_syncs() -> None:
    """The harness can fail: a CPU tensor in a cuda op, and .tolist(), both raise."""
    with FakeTensorMode(allow_non_fake_inputs=False):
        x = torch.zeros(3, device=CUDA)
        with pytest.raises(Exception, match="(?i)device"):
            _ = x + torch.zeros(3)
        with pytest.raises(Exception):
            x.tolist()


@pytest.mark.parametrize("algorithm", TOKEN_LEVEL)
def test_token_level_draft_step_stays_on_device(algorithm: str) -> None:
    inter = _intersection()
    with FakeTensorMode(allow_non_fake_inputs=False):
        # Fake tensors hold no data: what is checked is where each op runs.
        on_device = dataclasses.replace(
            inter,
            **{f: torch.empty(getattr(inter, f).shape, dtype=getattr(inter, f).dtype, device=CUDA)
               for f in _INTERSECTION_TENSORS},
        )
        logits = torch.randn(4, DRAFT_V, device=CUDA)
        step = draft_step(logits, _rows(CUDA), on_device, algorithm)
        dense = step.target_q(TARGET_V)
        for t in (step.q, step.ids, step.target_ids, step.absent, step.verify_q, dense):
            assert t.device.type == "cuda"
        assert step.verify_q.shape == (4, inter.support.shape[0])
        assert dense.shape == (4, TARGET_V)


def test_sampling_stays_on_device() -> None:
    with FakeTensorMode(allow_non_fake_inputs=False):
        logits = torch.randn(4, DRAFT_V, device=CUDA)
        rows = _rows(CUDA)
        q = processed_probs(logits, rows)
        ids = sample(q, rows)
        assert q.device.type == "cuda" and ids.device.type == "cuda"


def test_sampling_rows_flags_come_from_the_host() -> None:
    """What decides the code path (any top-k/top-p, any greedy) is read from the
    request settings on the host, never from a device tensor."""
    rows = _rows(torch.device("cpu"))
    assert rows.any_greedy and rows.any_filter and not rows.all_greedy
    greedy = SamplingRows.build([0.0, 0.0], [0, 0], [1.0, 1.0], [None, None], torch.device("cpu"))
    assert greedy.all_greedy and not greedy.any_filter


def _fake_plan(device: torch.device, vocab: int):
    """A plan with compact q rows (one shared support, one per-row), a forced
    rejection and fsd thresholds, on ``device``."""
    from vllm_hetero_spec.verify.draft_probs import DraftProbs
    from vllm_hetero_spec.verify.plan import VerifyPlan

    support = torch.arange(0, vocab, 2, device=device)
    q = DraftProbs(torch.rand(5, support.shape[0], device=device), support)
    return VerifyPlan(
        q, {"a": [0, 1], "b": [2, -1], "c": [3, 4]}, set(), {"c": [False, True]}, {"a": 0.1, "c": 0.0}, "js"
    )


class _BonusArgmax(torch.nn.Module):
    """Stands in for vLLM's bonus-token ``Sampler``, which is vLLM's code and, in the
    CPU build, calls custom ops (``_C::greedy_argmax``) that have no fake kernels."""

    logprobs_mode = "raw_logprobs"

    def forward(self, logits: torch.Tensor, sampling_metadata, **_):
        from vllm.v1.outputs import SamplerOutput

        return SamplerOutput(sampled_token_ids=logits.argmax(-1, keepdim=True).int(), logprobs_tensors=None)


@pytest.mark.parametrize("temperatures", [[1.0, 0.0, 0.7], [0.0, 0.0, 0.0]], ids=["mixed", "greedy"])
def test_sampler_adapter_stays_on_device(temperatures: list[float]) -> None:
    """HeteroRejectionSampler.forward on a fake cuda device, through vLLM's own logits
    processors, temperature, min_p and logit_bias: every tensor it makes lives on the
    logits' device, and nothing reads a device value back. (vLLM's top-k/top-p fallback
    without Triton uses Python indexing, which fake tensors cannot run on a "cuda"
    device; on CUDA vLLM runs its Triton kernel there. That path is vLLM's, not ours.
    Seeded rows are not run: a CPU build of torch cannot make the ``cuda`` generators
    they are drawn with.)"""
    from _sampler_inputs import batch_rows, logits_processors, sampling_metadata, spec_metadata
    from vllm import SamplingParams

    import vllm_hetero_spec
    from vllm_hetero_spec.verify.sampler import HeteroRejectionSampler

    vllm_hetero_spec.register()
    vocab, drafts = 64, [[1, 2], [3, 4], [5, 6]]
    # vLLM's processors keep host copies (numpy): built on the host, their device rows faked below.
    procs = logits_processors([SamplingParams(min_p=0.1), SamplingParams(logit_bias={3: 2.0, 9: -1.0}),
                               SamplingParams(min_p=0.05, logit_bias={5: 1.0})])
    with FakeTensorMode(allow_non_fake_inputs=False):
        logits = torch.randn(9, vocab, device=CUDA)
        rows = batch_rows(["a", "b", "c"], temperatures)
        sampler = HeteroRejectionSampler(_BonusArgmax(), None, CUDA, batch_rows=lambda: rows)
        sampler.plan = _fake_plan(CUDA, vocab)
        min_p = next(p for p in procs.all if type(p).__name__ == "MinPLogitsProcessor")
        min_p.min_p = torch.rand(3, 1, device=CUDA)
        meta = sampling_metadata(3, temperatures, device=CUDA, logitsprocs=procs)
        out = sampler(spec_metadata(drafts, CUDA), None, logits, meta).sampled_token_ids
        assert out.device.type == "cuda" and out.shape == (3, 3)


def test_verify_tokens_stays_on_device() -> None:
    """The rule itself with every extension on (compact q, forced rejections, fuzzy
    acceptance, residual sampling for some rows)."""
    from vllm_hetero_spec.verify.rules import verify_tokens

    vocab = 64
    with FakeTensorMode(allow_non_fake_inputs=False):
        probs = torch.rand(6, vocab, device=CUDA).softmax(-1)
        block = _fake_plan(CUDA, vocab).layout(["a", "b", "c"], [2, 2, 2], 2, probs.device)  # the logits' device
        flat = torch.arange(6, device=CUDA).view(3, 2)
        ids = torch.randint(0, vocab, (3, 2), device=CUDA)
        sampled = [0, 2]
        noise_rows = torch.tensor(sampled, device=CUDA)
        out = verify_tokens(
            ids, torch.full((3,), 2, device=CUDA), flat, probs, block.q, torch.zeros(3, dtype=torch.long, device=CUDA),
            torch.tensor([False, True, False], device=CUDA), torch.rand(3, 2, dtype=torch.float64, device=CUDA),
            torch.rand(len(sampled), vocab, device=CUDA), noise_rows, block.force_reject, block.fuzzy,
            target_choice=probs.argmax(dim=1),
        )
        assert out.device.type == "cuda" and out.shape == (3, 3)
