"""Property tests of the compiled DTW against a brute-force dynamic program."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_hetero_spec.vocab import alignment
from vllm_hetero_spec.vocab.alignment import PackedVocab, dtw_align_batch

VOCAB = [b"", b"a", b"b", b"ab", b"ba", b"abc", b" ", b" a", "é".encode(), "é".encode()[:1], "😀".encode(),
         b"\xf0\x9f", b"\x98\x80", b"hello", b"hel", b"lo", b" world", b"<bos>"]
PACKED = PackedVocab.build(VOCAB)


def lev(a: bytes, b: bytes) -> int:
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        prev, row[0] = row[0], i
        for j in range(1, len(b) + 1):
            cur = min(row[j] + 1, row[j - 1] + 1, prev + (a[i - 1] != b[j - 1]))
            prev, row[j] = row[j], cur
    return row[-1]


def in_band(i: int, j: int, n: int, m: int, w: int) -> bool:
    if w <= 0:
        return True
    center = 0 if n <= 1 else (i * (m - 1) + (n - 1) // 2) // (n - 1)
    return center - w <= j <= center + w


def brute_cost(a: list[int], b: list[int], w: int) -> int:
    inf = float("inf")
    n, m = len(a), len(b)
    d = [[inf] * m for _ in range(n)]
    for i in range(n):
        for j in range(m):
            if not in_band(i, j, n, m, w):
                continue
            c = lev(VOCAB[a[i]], VOCAB[b[j]])
            prev = 0 if i == j == 0 else min(
                d[i - 1][j - 1] if i and j else inf, d[i - 1][j] if i else inf, d[i][j - 1] if j else inf)
            d[i][j] = prev + c
    return -1 if d[-1][-1] == inf else int(d[-1][-1])


seqs = st.lists(st.integers(0, len(VOCAB) - 1), min_size=1, max_size=9)


@settings(max_examples=300, deadline=None)
@given(seqs, seqs, st.integers(0, 4))
def test_path_is_valid_and_optimal(a: list[int], b: list[int], w: int) -> None:
    res = dtw_align_batch([a], [b], PACKED, PACKED, w)[0]
    expected = brute_cost(a, b, w)
    assert res.cost == expected
    if expected < 0:
        return
    path = res.path
    assert tuple(path[0]) == (0, 0) and tuple(path[-1]) == (len(a) - 1, len(b) - 1)
    steps = np.diff(path, axis=0)
    assert ((steps == [1, 1]) | (steps == [1, 0]) | (steps == [0, 1])).all(axis=1).all()
    assert all(in_band(i, j, len(a), len(b), w) for i, j in path)
    assert sum(lev(VOCAB[a[i]], VOCAB[b[j]]) for i, j in path) == res.cost


@settings(max_examples=100, deadline=None)
@given(seqs)
def test_identical_sequences_give_the_diagonal(a: list[int]) -> None:
    res = dtw_align_batch([a], [a], PACKED, PACKED, 8)[0]
    assert res.cost == 0
    assert [tuple(p) for p in res.path] == [(i, i) for i in range(len(a))]


def test_batch_equals_single_calls_and_handles_empty() -> None:
    rng = np.random.default_rng(0)
    drafts = [list(rng.integers(0, len(VOCAB), rng.integers(0, 7))) for _ in range(20)]
    proxies = [list(rng.integers(0, len(VOCAB), rng.integers(0, 7))) for _ in range(20)]
    batch = dtw_align_batch(drafts, proxies, PACKED, PACKED, 0)
    for d, p, r in zip(drafts, proxies, batch):
        single = dtw_align_batch([d], [p], PACKED, PACKED, 0)[0]
        assert r.cost == single.cost and np.array_equal(r.path, single.path)
        if not d or not p:
            assert len(r.path) == 0


def test_unicode_split_across_tokens() -> None:
    """'😀' as two byte-fallback halves vs one token: cost counts bytes, not characters."""
    split = [VOCAB.index(b"\xf0\x9f"), VOCAB.index(b"\x98\x80")]
    whole = [VOCAB.index("😀".encode())]
    res = dtw_align_batch([split], [whole], PACKED, PACKED, 8)[0]
    assert [tuple(p) for p in res.path] == [(0, 0), (1, 0)]
    assert res.cost == 2 + 2


def test_compiled_module_is_in_use() -> None:
    assert alignment.compiled_module.__file__.endswith((".so", ".pyd"))
    assert alignment.common_prefix([1, 2, 3, 4], [1, 2, 9]) == 2


def test_transfer_probs_takes_first_aligned_draft_token() -> None:
    from vllm_hetero_spec.vocab.dtw import transfer_probs

    # draft "hel","lo"," wor","ld" vs proxy "hello"," world": two merges
    path = np.array([[0, 0], [1, 0], [2, 1], [3, 1]])
    assert transfer_probs(path, [0.5, 0.9, 0.3, 0.8], 2) == [0.5, 0.3]
    # one draft token split into two proxies: both get its probability; an appended
    # end-of-sequence proxy past the path takes the last draft token's
    path = np.array([[0, 0], [0, 1]])
    assert transfer_probs(path, [0.7, 0.2], 3) == [0.7, 0.7, 0.2]
