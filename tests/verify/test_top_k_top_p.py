"""Top-k then top-p without a full sort gives vLLM's own masks, ties and fallbacks included."""

from __future__ import annotations

import pytest
import torch
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

from vllm_hetero_spec.verify.top_k_top_p import top_k_top_p_without_sort


def vllm(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    return apply_top_k_top_p_pytorch(logits, k, p, allow_cpu_sync=True)


def _fallback_spy(calls: list[int]):
    def fallback(logits, k, p):
        calls.append(1)
        return vllm(logits, k, p)

    return fallback


@pytest.mark.parametrize("vocab", [1000, 50_000])
def test_same_masks_as_vllm(vocab: int) -> None:
    gen = torch.Generator().manual_seed(vocab)
    rows = 40
    logits = torch.randn(rows, vocab, generator=gen) * torch.rand(rows, 1, generator=gen).mul(6).add(0.2)
    k = torch.randint(1, 100, (rows,), generator=gen)
    p = torch.rand(rows, generator=gen).clamp(0.05, 1.0)
    p[:3] = 1.0  # top-p off for some rows
    calls: list[int] = []
    ours = top_k_top_p_without_sort(logits.clone(), k, p, _fallback_spy(calls))
    theirs = vllm(logits.clone(), k, p)
    assert not calls  # the partial path ran
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
    assert torch.equal(ours[torch.isfinite(ours)], theirs[torch.isfinite(theirs)])
    assert (torch.isfinite(ours).sum(-1) <= k).all() and (torch.isfinite(ours).sum(-1) >= 1).all()


def test_boundary_ties_survive_as_in_vllm() -> None:
    logits = torch.tensor([[5.0, 3.0, 3.0, 3.0, 1.0, 0.0] + [-4.0] * 100])
    k, p = torch.tensor([2]), torch.tensor([0.999])
    calls: list[int] = []
    ours = top_k_top_p_without_sort(logits.clone(), k, p, _fallback_spy(calls))
    theirs = vllm(logits.clone(), k, p)
    assert calls  # three tied at the 2nd place do not fit a slice of 2: vLLM's path
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
    assert torch.isfinite(ours).sum() == 4


def test_fallbacks() -> None:
    """A row without top-k (k = vocab), no top-p, or no top-k: vLLM's function."""
    logits = torch.randn(4, 500)
    for k, p in [(torch.tensor([10, 500, 10, 10]), torch.full((4,), 0.9)), (torch.full((4,), 10), None),
                 (None, torch.full((4,), 0.9))]:
        calls: list[int] = []
        ours = top_k_top_p_without_sort(logits.clone(), k, p, _fallback_spy(calls))
        assert calls and torch.equal(ours, vllm(logits.clone(), k, p))


def test_in_place_like_vllm() -> None:
    logits = torch.randn(3, 2000)
    out = top_k_top_p_without_sort(logits, torch.full((3,), 20), torch.full((3,), 0.8), vllm)
    assert out.data_ptr() == logits.data_ptr()


def test_ties_that_fit_another_rows_larger_slice_take_the_partial_path() -> None:
    """Row 0's three-way tie at its 2nd place fits the slice row 1's k = 5 makes."""
    logits = torch.cat([torch.tensor([[5.0, 3.0, 3.0, 3.0, 1.0, 0.0] + [-4.0] * 100]), torch.randn(1, 106)])
    k, p = torch.tensor([2, 5]), torch.tensor([0.999, 0.9])
    calls: list[int] = []
    ours = top_k_top_p_without_sort(logits.clone(), k, p, _fallback_spy(calls))
    theirs = vllm(logits.clone(), k, p)
    assert not calls
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
    assert torch.equal(ours[torch.isfinite(ours)], theirs[torch.isfinite(theirs)])
