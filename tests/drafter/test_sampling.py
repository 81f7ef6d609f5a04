"""The drafter's processed distribution: the top-k slice path (no sort of the
vocabulary) gives the same q as sorting the whole row; and its draws: a seeded row's
depends only on its own stream."""

from __future__ import annotations

import torch

from vllm_hetero_spec.drafter.sampling import SamplingRows, processed_probs, sample


def _rows(settings: list[tuple[float, int, float]]) -> SamplingRows:
    temp, top_k, top_p = (list(c) for c in zip(*settings))
    return SamplingRows.build(temp, top_k, top_p, [None] * len(settings), torch.device("cpu"))


def test_top_k_slice_matches_the_full_sort() -> None:
    """Rows with top-k (and top-p) and a greedy row take the slice path; the same rows
    beside one without top-k take the full sort. Both give the same q, row by row."""
    gen = torch.Generator().manual_seed(0)
    settings = [(1.0, 40, 0.95), (0.7, 5, 1.0), (1.3, 200, 0.5), (0.0, 0, 1.0), (1.0, 1, 0.9)]
    logits = 3 * torch.randn(len(settings), 5000, generator=gen)
    fast = processed_probs(logits, _rows(settings))
    slow = processed_probs(torch.cat([logits, logits[:1]]), _rows(settings + [(1.0, 0, 0.9)]))[:-1]
    torch.testing.assert_close(fast, slow)
    kept = (fast > 0).sum(-1).tolist()
    assert kept[1] == 5 and kept[3] == 1 and kept[4] == 1 and 0 < kept[0] <= 40 and kept[2] < 200
    torch.testing.assert_close(fast.sum(-1), torch.ones(len(settings)))


def test_allowed_mask_and_filters_compose() -> None:
    """Tokens outside ``allowed`` never survive, whichever path."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 1000, generator=gen)
    allowed = torch.rand(1000, generator=gen) > 0.5
    probs = processed_probs(logits, _rows([(1.0, 20, 0.9), (1.0, 50, 1.0), (0.5, 3, 0.8)]), allowed)
    assert not probs[:, ~allowed].any()
    assert ((probs > 0).sum(-1) <= torch.tensor([20, 50, 3])).all()


def _seeded_draws(neighbours: int, steps: int = 50) -> tuple[list[int], torch.Tensor]:
    """The tokens a row seeded with 7 draws over ``steps`` draws, beside ``neighbours``
    unseeded rows, and the shared stream's state afterwards."""
    probs = torch.randn(4, 300, generator=torch.Generator().manual_seed(2)).softmax(-1)[3 - neighbours:]
    own, shared = torch.Generator().manual_seed(7), torch.Generator().manual_seed(3)
    rows = SamplingRows.build([1.0] * (neighbours + 1), [0] * (neighbours + 1), [1.0] * (neighbours + 1),
                              [None] * neighbours + [own], torch.device("cpu"), shared)
    return [int(sample(probs, rows)[-1]) for _ in range(steps)], shared.get_state()


def test_a_seeded_row_draws_from_its_own_stream_alone() -> None:
    """The same tokens alone or beside unseeded rows (a seeded request's output does not
    depend on its batch), and a batch of seeded rows leaves the shared stream unused
    (the vocabulary-wide shared draw is skipped, not made and overwritten)."""
    alone, shared_after = _seeded_draws(0)
    beside, shared_used = _seeded_draws(3)
    assert alone == beside and len(set(alone)) > 5
    assert torch.equal(shared_after, torch.Generator().manual_seed(3).get_state())
    assert not torch.equal(shared_used, shared_after)
