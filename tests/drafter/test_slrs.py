"""slrs: psi exactly (against brute force), empirically (against sampled strings), and
the first-token verification lossless with and without the budget cutting C.

The drafter here is a context-dependent model over a short-token vocabulary built in the
test: every draft-token path has its own seeded random distribution, so psi cannot come
out right by a shortcut that ignores segmentations or the order of tokens.
"""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from vllm_hetero_spec.drafter.runtime.config import RuntimeConfig
from vllm_hetero_spec.drafter.rules.slrs.psi import PsiPlanner, TreeBuilder
from vllm_hetero_spec.verify.rules import verify_block
from vllm_hetero_spec.vocab.sorted_strings import SortedStrings

from _stats import assert_follows, follows_pvalue

DRAFT = [b"a", b"b", b"ab", b"ba", b"aab", b"bb", b"c", b"ab", None]  # None: end of text; "ab" twice
TARGET = [b"a", b"b", b"c", b"aa", b"ab", b"aba", b"bab", b"bbb", b"abab"]
EOS = len(TARGET)  # the target's end-of-text id
NONE = EOS + 1  # outcome index for "no target token": cannot happen here, must stay 0
N = 200_000


@lru_cache(maxsize=None)
def draft_q(path: tuple[int, ...]) -> torch.Tensor:
    """The synthetic drafter's distribution after ``path`` (float64)."""
    g = torch.Generator().manual_seed(hash(path) % (2**31))
    logits = torch.randn(len(DRAFT), generator=g, dtype=torch.float64) * 1.5
    logits[-1] -= 1.0  # ending is less likely than writing
    return logits.softmax(0)


def _text(path: tuple[int, ...]) -> bytes:
    return b"".join(DRAFT[v] or b"" for v in path)


def _outcome(text: bytes, target: SortedStrings) -> int:
    if not text:
        return EOS
    lead = target.longest_prefix(text)
    return NONE if lead is None else TARGET.index(lead)


def brute_force_psi() -> torch.Tensor:
    """The first-target-token law by walking every draft path until its text is no
    longer a proper prefix of a target token (or it ends): an independent route."""
    target = SortedStrings(TARGET)
    psi = torch.zeros(NONE + 1, dtype=torch.float64)

    def walk(path: tuple[int, ...], prob: float) -> None:
        q = draft_q(path)
        for v, piece in enumerate(DRAFT):
            mass = prob * float(q[v])
            text = _text(path) + (piece or b"")
            if piece is not None and target.extending(text):
                walk(path + (v,), mass)
            else:
                psi[_outcome(text, target)] += mass

    walk((), 1.0)
    return psi


def planned_psi(budget: int, candidates: list[int], min_prob: float = 0.0) -> tuple[list[int], torch.Tensor]:
    """psi as the engine computes it: level by level through a TreeBuilder."""
    planner = PsiPlanner(SortedStrings(DRAFT), SortedStrings(TARGET))
    builder = TreeBuilder(planner, [(t, TARGET[t]) for t in candidates], budget, min_prob, draft_q(()).float())
    while front := builder.frontier():
        builder.add(torch.stack([draft_q(builder.paths[node] + (v,)) for node, v in front]).float())
    return builder.psi(torch.from_numpy(planner.draft.order))


def test_sorted_strings_answers_prefix_questions() -> None:
    strings = SortedStrings([b"ab", b"a", None, b"abc", b"b", b"", b"ab", b"\xff\xff", b"\xff"])
    lo, hi = strings.prefix_range(b"ab")
    assert sorted(strings.order[lo:hi].tolist()) == [0, 3, 6]
    lo, hi = strings.prefix_range(b"\xff")
    assert sorted(strings.order[lo:hi].tolist()) == [7, 8]
    assert strings.extending(b"a") == [b"ab", b"abc"]
    assert strings.minimal_extensions(b"a") == [b"ab"]
    assert strings.longest_prefix(b"abd") == b"ab" and strings.longest_prefix(b"c") is None
    assert strings.segment(b"abcab") == [3, 0] and strings.segment(b"abz") is None


def test_psi_is_exact() -> None:
    """Every target token's psi from its plan equals the brute-force law; with end of
    text the law sums to 1 and no string lacks a first target token."""
    expected = brute_force_psi()
    ids, psi = planned_psi(budget=10_000, candidates=list(range(len(TARGET))))
    assert ids == list(range(len(TARGET)))
    assert torch.allclose(psi, expected[: len(TARGET)], rtol=0, atol=1e-6), (psi, expected)
    assert expected[NONE] == 0 and abs(float(expected.sum()) - 1) < 1e-12
    assert abs(float(expected[EOS]) - float(draft_q(())[-1])) < 1e-12


def test_psi_matches_sampled_strings() -> None:
    """The drafter's sampled strings' first target tokens follow psi (chi-square)."""
    target = SortedStrings(TARGET)
    psi = brute_force_psi()
    g = torch.Generator().manual_seed(1)
    outcomes = []
    for _ in range(20_000):
        path: tuple[int, ...] = ()
        while True:
            v = int(torch.multinomial(draft_q(path), 1, generator=g))
            text = _text(path) + (DRAFT[v] or b"")
            if DRAFT[v] is None or not target.extending(text):
                outcomes.append(_outcome(text, target))
                break
            path += (v,)
    assert_follows(torch.tensor(outcomes), psi.float())


def test_budget_keeps_only_complete_candidates() -> None:
    full_ids, full = planned_psi(10_000, list(range(len(TARGET))))
    ids, psi = planned_psi(4, list(range(len(TARGET))))
    assert 0 < len(ids) < len(TARGET)
    for tid, value in zip(ids, psi):
        assert abs(float(value) - float(full[full_ids.index(tid)])) < 1e-7  # exact, not truncated


def test_pruned_paths_cost_at_most_their_probability() -> None:
    """With min_prob, psi(y) moves by at most what the skipped paths carry (each below
    min_prob, at most one per node of the exact tree), and fewer nodes are evaluated."""
    exact_ids, exact = planned_psi(10_000, list(range(len(TARGET))))
    planner = PsiPlanner(SortedStrings(DRAFT), SortedStrings(TARGET))
    for min_prob in (0.01, 0.05):
        ids, psi = planned_psi(10_000, list(range(len(TARGET))), min_prob)
        assert ids == exact_ids
        full = TreeBuilder(planner, [(t, TARGET[t]) for t in ids], 10_000, 0.0, draft_q(()).float())
        while front := full.frontier():
            full.add(torch.stack([draft_q(full.paths[node] + (v,)) for node, v in front]).float())
        assert float((psi - exact).abs().max()) <= min_prob * full.num_nodes
        assert float((psi - exact).abs().max()) > 0


@pytest.mark.parametrize("budget", [10_000, 4, 1])
def test_first_token_verification_is_lossless(budget: int) -> None:
    """Propose the first target token from psi on C (renormalized), verify with
    min(1, p/q) and the residual: the emitted token follows the target's p."""
    torch.manual_seed(budget)
    ids, psi = planned_psi(budget, list(range(len(TARGET))))
    vt = len(TARGET) + 1
    q = torch.zeros(vt)
    q[ids] = (psi / psi.sum()).float()
    p = torch.softmax(torch.randn(vt) * 2, 0)
    p[3] = 0.0  # a token the target forbids
    p /= p.sum()
    draft = torch.multinomial(q, N, replacement=True).unsqueeze(1)
    out = verify_block(
        draft, torch.ones(N, dtype=torch.long), p.expand(N, 1, vt), q.expand(N, 1, vt),
        torch.multinomial(p, N, replacement=True), torch.zeros(N, dtype=torch.bool),
        torch.rand(N, 1, dtype=torch.float64), torch.empty(N, vt).exponential_(),
    )
    assert_follows(out[:, 0], p)
    accepted = float((out[:, 1] != -1).float().mean())
    assert abs(accepted - float(torch.minimum(p, q).sum())) < 0.01


def test_a_psi_that_is_not_the_proposal_law_is_detected() -> None:
    """Control: verifying against psi while proposing from another law fails."""
    torch.manual_seed(3)
    ids, psi = planned_psi(10_000, list(range(len(TARGET))))
    vt = len(TARGET) + 1
    q = torch.zeros(vt)
    q[ids] = (psi / psi.sum()).float()
    wrong = torch.softmax(torch.randn(vt), 0)
    p = torch.softmax(torch.randn(vt) * 2, 0)
    draft = torch.multinomial(wrong, N, replacement=True).unsqueeze(1)
    out = verify_block(
        draft, torch.ones(N, dtype=torch.long), p.expand(N, 1, vt), q.expand(N, 1, vt),
        torch.multinomial(p, N, replacement=True), torch.zeros(N, dtype=torch.bool),
        torch.rand(N, 1, dtype=torch.float64), torch.empty(N, vt).exponential_(),
    )
    assert follows_pvalue(out[:, 0], p) < 1e-6


class _TreeDrafter:
    """Stands in for the draft runtime's tree forward: a node's logits are a seeded
    function of its request, parent and token. Records the rows of every forward."""

    def __init__(self, max_rows: int):
        self.cfg = RuntimeConfig("stand-in", max_rows=max_rows)
        self.widths: list[int] = []

    def grow_trees(self, caches, trees, parents, tokens) -> list[torch.Tensor]:
        self.widths.append(sum(map(len, tokens)))
        out = []
        for cache, par, toks in zip(caches, parents, tokens):
            rows = [torch.randn(len(DRAFT), generator=torch.Generator().manual_seed(hash((cache.tag, p, t)) % 2**31))
                    for p, t in zip(par, toks)]
            out.append(torch.stack(rows) * 1.5)
        return out


def _propose(max_rows: int) -> tuple[list, list[int]]:
    from vllm_hetero_spec.drafter.runtime.paged_kv import BlockPool, PagedCache
    from vllm_hetero_spec.drafter.sampling import SamplingRows
    from vllm_hetero_spec.drafter.rules.slrs.first_token import FirstTokenSampler

    proposer = FirstTokenSampler(DRAFT, TARGET, None, None, len(TARGET), max_nodes=6, num_candidates=4)
    caches = [PagedCache(BlockPool(64, 16, 0)) for _ in range(5)]
    for tag, cache in enumerate(caches):
        cache.tag = tag
    root = torch.randn(5, len(DRAFT), generator=torch.Generator().manual_seed(1)) * 1.5
    rows = SamplingRows.build([1.0] * 5, [0] * 5, [1.0] * 5, [None] * 5, torch.device("cpu"),
                              torch.Generator().manual_seed(2))
    drafter = _TreeDrafter(max_rows)
    first = proposer.propose(drafter, caches, root, rows)
    return [(t, q.probs.tolist() if q is not None else None) for t, q in zip(first.target_ids, first.q_rows)], drafter.widths


def test_tree_levels_wider_than_max_rows_run_in_slices() -> None:
    """A level wider than ``max_rows`` is evaluated in slices, each request's nodes
    whole in one slice (one wider than the cap alone), with the same psi and the same
    draws as in one forward."""
    from vllm_hetero_spec.drafter.rules.slrs.first_token import _slices

    whole, whole_widths = _propose(10_000)
    sliced, sliced_widths = _propose(6)
    assert sliced == whole and any(t is not None for t, _ in whole)
    assert max(whole_widths) > 6 and max(sliced_widths) <= 6 and sum(sliced_widths) == sum(whole_widths)
    assert _slices([0, 1, 2, 3], [3, 3, 3, 3], 6) == [[0, 1], [2, 3]]
    assert _slices([0, 1, 2], [2, 9, 1], 4) == [[0], [1], [2]]
    assert _slices([5, 7], [1, 1], 256) == [[5, 7]]
    assert sum(_slices(list(range(40)), [32] * 40, 256), []) == list(range(40))
    assert all(len(s) * 32 <= 256 for s in _slices(list(range(40)), [32] * 40, 256))
