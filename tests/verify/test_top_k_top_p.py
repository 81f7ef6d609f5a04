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


def _assert_same_masks(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """The same tokens kept, with the same logits."""
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
    assert torch.equal(ours[torch.isfinite(ours)], theirs[torch.isfinite(theirs)])


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
    _assert_same_masks(ours, theirs)
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


@pytest.mark.parametrize("vocab", [1000, 262_144])
def test_rows_without_filters_beside_filtered_ones_need_no_sort(vocab: int) -> None:
    """Greedy requests come with top-k and top-p reset (k = vocab, p = 1): beside
    top-k rows they keep what vLLM's sort keeps (every token of nonzero probability;
    some logits here are 200 below the row's largest, probability 0 in float32), and
    neither they nor the top-k rows go to the sort."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(8, vocab, generator=gen) * 3
    logits[:, : vocab // 10] -= 200
    k = torch.tensor([vocab, 40, vocab, 20, 40, vocab, 40, 5])
    p = torch.tensor([1.0, 0.9, 1.0, 1.0, 0.95, 1.0, 0.8, 0.5])
    calls: list[int] = []
    ours = top_k_top_p_without_sort(logits.clone(), k, p, _fallback_spy(calls))
    theirs = vllm(logits.clone(), k, p)
    assert not calls
    _assert_same_masks(ours, theirs)
    assert not torch.isfinite(ours[0, : vocab // 10]).any()  # the zero-probability tokens, masked as vLLM masks them


def test_only_rows_with_top_p_and_no_top_k_go_to_the_sort() -> None:
    """Without any top-k in the batch (k is None), rows with top-p need vLLM's sort;
    the unfiltered rows beside them do not, and all keep vLLM's sets."""
    logits = torch.randn(5, 3000) * 4
    p = torch.tensor([1.0, 0.9, 1.0, 0.7, 1.0])
    seen: list[int] = []

    def fallback(x, kk, pp):
        seen.append(x.shape[0])
        assert kk is None
        return vllm(x, kk, pp)

    ours = top_k_top_p_without_sort(logits.clone(), None, p, fallback)
    assert seen == [2]
    assert _kept(ours) == _kept(vllm(logits.clone(), None, p))


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
    _assert_same_masks(ours, theirs)


def _kept(logits: torch.Tensor) -> list[set[int]]:
    return [set(torch.isfinite(row).nonzero().squeeze(1).tolist()) for row in logits]


def _bf16_rows(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Logits as a bf16 model gives them, with 40 clear leaders per row whose values fall
    on a coarse grid (so equal values abound among them, and top-p cuts through ties)
    and no tie at the 40th place with the rest (so the partial path is taken)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) - 6
    leaders = 8 + (torch.randn(rows, 40, generator=gen) * 4).round() / 4
    ids = torch.stack([torch.randperm(vocab, generator=gen)[:40] for _ in range(rows)])
    return logits.scatter_(1, ids, leaders.clamp(min=2)).to(torch.bfloat16).float()


@pytest.mark.parametrize("vocab", [151_936, 262_144])
def test_bf16_ties_keep_vllms_sets_on_a_full_vocabulary(vocab: int) -> None:
    """top_k = 40 and top_p = 0.9 (a common generation config) on bf16 logits: every
    row keeps exactly what vLLM's own function keeps, ties across the top-p cut included
    (which of two equal logits vLLM drops is its sort's order, not index order: before
    the fix most of these rows kept another set)."""
    logits = _bf16_rows(64, vocab, vocab)
    k, p = torch.full((64,), 40), torch.full((64,), 0.9)
    seen: list[int] = []

    def fallback(x, kk, pp):
        seen.append(x.shape[0])
        return vllm(x, kk, pp)

    ours = top_k_top_p_without_sort(logits.clone(), k, p, fallback)
    assert _kept(ours) == _kept(vllm(logits.clone(), k, p))
    assert seen and seen[0] < 64  # the partial path ran, handing vLLM only the tied rows


def _tie_rows(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three rows with exact ties: across the top-p cut, at the top-k boundary, and both."""
    logits = torch.full((3, vocab), -20.0)
    gen = torch.Generator().manual_seed(7)
    ids = torch.randperm(vocab, generator=gen)[:12].view(3, 4)  # scattered, in no index order
    # Row 0: masses 0.4, 0.2, 0.2, 0.2 (about); top-p 0.7 cuts between the two tied 0.2s.
    # Row 1: k = 2 with a three-way tie at the 2nd place (all three survive top-k).
    # Row 2: k = 3 with a tie at the 3rd place that top-p 0.7 then cuts through.
    values = torch.tensor([[2.0, 1.3069, 1.3069, 1.3069], [2.0, 1.0, 1.0, 1.0], [2.0, 1.3069, 1.3069, 1.3069]])
    for r in range(3):
        logits[r, ids[r]] = values[r]
    return logits, torch.tensor([4, 2, 3]), torch.tensor([0.7, 0.999, 0.7])


@pytest.mark.parametrize("vocab", [151_936, 262_144])
def test_exact_ties_at_the_cuts_keep_vllms_sets(vocab: int) -> None:
    logits, k, p = _tie_rows(vocab)
    ours = top_k_top_p_without_sort(logits.clone(), k, p, vllm)
    theirs = vllm(logits.clone(), k, p)
    assert _kept(ours) == _kept(theirs)
    assert [len(s) for s in _kept(theirs)] == [3, 4, 3]  # the ties really straddle the cuts


def test_a_row_without_ties_at_its_cut_keeps_the_partial_path() -> None:
    """Only the fragile rows go to vLLM's function (the others keep the fast path)."""
    logits, k, p = _tie_rows(50_000)
    clean = torch.randn(5, 50_000)
    seen: list[int] = []

    def fallback(x, kk, pp):
        seen.append(x.shape[0])
        return vllm(x, kk, pp)

    both = torch.cat([logits, clean])
    kk, pp = torch.cat([k, torch.full((5,), 40)]), torch.cat([p, torch.full((5,), 0.9)])
    ours = top_k_top_p_without_sort(both.clone(), kk, pp, fallback)
    assert seen == [2]  # rows 0 and 2 (row 1's tie overflows no slice: k_max = 40)
    assert _kept(ours) == _kept(vllm(both.clone(), kk, pp))


def test_on_cuda_verification_filters_with_vllms_own_function(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the patched verification filter is vLLM's own function (Triton there, as
    in plain decoding's sampler), so the kept sets are vLLM's by construction. Under
    FakeTensorMode on a ``cuda`` device: the call reaches vLLM's implementation (here
    its torch one, stood in for by a spy: its ``cumsum(out=...)`` cannot run on a fake
    cuda device in a CPU build of torch), not the partial path."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.sample.ops import topk_topp_sampler

    import vllm_hetero_spec

    vllm_hetero_spec.register()
    reached: list[str] = []

    def vllms(logits, k, p, allow_cpu_sync=False):
        reached.append(logits.device.type)
        return logits

    monkeypatch.setattr(topk_topp_sampler, "apply_top_k_top_p_pytorch", vllms)
    cuda = torch.device("cuda")
    with FakeTensorMode(allow_non_fake_inputs=False):
        logits = torch.randn(6, 151_936, device=cuda)
        k, p = torch.full((6,), 40, device=cuda), torch.full((6,), 0.9, device=cuda)
        out = rejection_sampler.apply_top_k_top_p(logits, k, p)
        assert out.device.type == "cuda" and reached == ["cuda"]
