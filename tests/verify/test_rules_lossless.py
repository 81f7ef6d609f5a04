"""Sampler-level losslessness of the verification rules on synthetic distributions.

Exact and fast: many independent verification blocks in one batched call, then a
chi-square test that the emitted tokens follow the target distribution. Each test can
fail: the `broken` cases check that the same test rejects a deliberately wrong rule.
"""

import pytest
import torch
from scipy.stats import chisquare

from vllm_hetero_spec.drafter.sampling import SamplingRows, processed_probs, sample
from vllm_hetero_spec.verify.rules import PLACEHOLDER, accepted_lengths, verify_block

from _stats import assert_follows

N = 200_000


def _run(p: torch.Tensor, q: torch.Tensor | None, draft: torch.Tensor, k: int = 1, seed: int = 0):
    """Verify N blocks of length k where every position has target p (k+1 positions)."""
    torch.manual_seed(seed)
    v = p.shape[0]
    target = p.expand(N, k, v)
    draft_probs = None if q is None else q.expand(N, k, v)
    bonus = torch.multinomial(p, N, replacement=True)
    out = verify_block(
        draft.view(N, k),
        torch.full((N,), k),
        target,
        draft_probs,
        bonus,
        torch.zeros(N, dtype=torch.bool),
        torch.rand(N, k, dtype=torch.float64),
        torch.empty(N, v).exponential_(),
    )
    return out


@pytest.mark.parametrize("case", ["overlap", "disjoint_support", "draft_outside_target", "zeros"])
def test_standard_rule_first_token_follows_target(case: str) -> None:
    v = 12
    g = torch.Generator().manual_seed(1)
    p = torch.rand(v, generator=g)
    q = torch.rand(v, generator=g)
    if case == "disjoint_support":
        p[6:] = 0
        q[:6] = 0
    elif case == "draft_outside_target":
        p[:3] = 0  # the draft proposes tokens the target never emits
    elif case == "zeros":
        p[::2] = 0
        q[1::3] = 0
    p, q = p / p.sum(), q / q.sum()
    draft = torch.multinomial(q, N, replacement=True)
    out = _run(p, q, draft)
    assert_follows(out[:, 0], p)


def test_onehot_rule_first_token_follows_target() -> None:
    """SLEM: proposals from any process, verified as one-hot."""
    v = 10
    p = torch.softmax(torch.randn(v, generator=torch.Generator().manual_seed(2)), 0)
    draft = torch.randint(0, v, (N,))  # proposal law unrelated to p
    out = _run(p, None, draft)
    assert_follows(out[:, 0], p)


def test_broken_rule_is_detected() -> None:
    """Passing q while the drafts came from another law must fail the same test."""
    v = 10
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(v, generator=g), 0)
    q_true = torch.softmax(torch.randn(v, generator=g) * 2, 0)
    q_claimed = torch.full((v,), 1.0 / v)
    draft = torch.multinomial(q_true, N, replacement=True)
    out = _run(p, q_claimed, draft)
    counts = torch.bincount(out[:, 0], minlength=v).double()
    expected = p.double() / p.double().sum() * N
    assert chisquare(counts.numpy(), expected.numpy()).pvalue < 1e-6


def test_whole_block_follows_target_chain() -> None:
    """Every emitted position, bonus included, follows the target (positions i.i.d.)."""
    v, k = 8, 3
    g = torch.Generator().manual_seed(4)
    p = torch.softmax(torch.randn(v, generator=g), 0)
    q = torch.softmax(torch.randn(v, generator=g), 0)
    draft = torch.multinomial(q, N * k, replacement=True)
    out = _run(p, q, draft, k=k)
    n_emitted = (out != PLACEHOLDER).sum(1)
    assert int(n_emitted.min()) >= 1
    for pos in range(k + 1):
        col = out[:, pos]
        assert_follows(col[col != PLACEHOLDER], p)


def test_greedy_rows_accept_by_argmax() -> None:
    p = torch.tensor([[[0.1, 0.7, 0.2], [0.5, 0.3, 0.2]]])
    out = verify_block(
        torch.tensor([[1, 2]]), torch.tensor([2]), p, None, torch.tensor([2]),
        torch.tensor([True]), torch.rand(1, 2, dtype=torch.float64), torch.ones(1, 3),
    )
    assert out.tolist() == [[1, 0, PLACEHOLDER]]


def test_accepted_lengths_respects_counts() -> None:
    acc = torch.tensor([[True, True, False], [True, True, True], [False, True, True]])
    assert accepted_lengths(acc, torch.tensor([3, 2, 3])).tolist() == [2, 2, 0]


def test_tli_drafting_q_is_the_sampling_law_with_topk_topp_and_temperature() -> None:
    """The q handed to the verifier is the distribution the drafter actually samples."""
    v = 16
    logits = torch.randn(1, v, generator=torch.Generator().manual_seed(5)).expand(N, v)
    allowed = torch.ones(v, dtype=torch.bool)
    allowed[::3] = False
    rows = SamplingRows.build([0.7] * N, [6] * N, [0.9] * N, [None] * N, torch.device("cpu"))
    q = processed_probs(logits, rows, allowed)
    assert torch.allclose(q[0], q[-1])
    assert (q[0][~allowed] == 0).all() and int((q[0] > 0).sum()) <= 6
    drawn = sample(q, rows)
    assert_follows(drawn, q[0])
    # And the full TLI chain is lossless against a target over the same vocabulary.
    p = torch.softmax(torch.randn(v, generator=torch.Generator().manual_seed(6)) / 0.7, 0)
    out = _run(p, q[0], drawn)
    assert_follows(out[:, 0], p)
