# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled alignment core: banded DTW over token strings, and the realignment search.

Token sequences arrive as (start, end) int64 offsets into a packed vocabulary byte table
(each tokenizer's token bytes concatenated once at start-up), so nothing is copied per
step and no Python object is touched in the inner loops. A batch of requests is packed
one level up (request -> token range), so a whole step is aligned in one call with the
GIL released.
"""

from libc.stdlib cimport free, malloc
from libc.string cimport memcmp

import numpy as np

ctypedef long long i64


cdef inline i64 _min3(i64 a, i64 b, i64 c) noexcept nogil:
    if b < a:
        a = b
    if c < a:
        a = c
    return a


cdef i64 _levenshtein(const unsigned char* a, i64 la, const unsigned char* b, i64 lb, i64* row) noexcept nogil:
    """Edit distance between two byte strings; ``row`` has room for lb + 1 entries."""
    cdef i64 i, j, prev, cur, cost
    for j in range(lb + 1):
        row[j] = j
    for i in range(1, la + 1):
        prev = row[0]
        row[0] = i
        for j in range(1, lb + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            cur = _min3(row[j] + 1, row[j - 1] + 1, prev + cost)
            prev = row[j]
            row[j] = cur
    return row[lb]


cdef inline bint _in_band(i64 i, i64 j, i64 n, i64 m, i64 w) noexcept nogil:
    """Sakoe-Chiba band around the (scaled) diagonal; w <= 0 means no band."""
    cdef i64 center
    if w <= 0:
        return True
    if n <= 1:
        center = 0
    else:
        center = (i * (m - 1) + (n - 1) // 2) // (n - 1)
    return center - w <= j <= center + w


cdef i64 _dtw_one(
    const unsigned char* abytes, const i64* astart, const i64* aend, i64 n,
    const unsigned char* bbytes, const i64* bstart, const i64* bend, i64 m,
    i64 w, int* path_out, i64* path_len, i64* work,
) noexcept nogil:
    """DTW of n draft tokens against m proxy tokens. Writes the path (pairs, from (0, 0)
    to (n-1, m-1)) into ``path_out`` (room for 2 * (n + m)) and returns its cost, or -1
    if the band admits no path. ``work`` holds n * m costs plus a Levenshtein row."""
    cdef i64 INF = 1 << 60
    cdef i64* D = work
    cdef i64* row = work + n * m
    cdef i64 i, j, best, c, k, ti, tj
    if n == 0 or m == 0:
        path_len[0] = 0
        return 0
    for i in range(n):
        for j in range(m):
            if not _in_band(i, j, n, m, w):
                D[i * m + j] = INF
                continue
            c = _levenshtein(abytes + astart[i], aend[i] - astart[i], bbytes + bstart[j], bend[j] - bstart[j], row)
            if i == 0 and j == 0:
                best = 0
            else:
                best = INF
                if i > 0 and j > 0 and D[(i - 1) * m + j - 1] < best:
                    best = D[(i - 1) * m + j - 1]
                if i > 0 and D[(i - 1) * m + j] < best:
                    best = D[(i - 1) * m + j]
                if j > 0 and D[i * m + j - 1] < best:
                    best = D[i * m + j - 1]
            D[i * m + j] = INF if best >= INF else best + c
    if D[n * m - 1] >= INF:
        path_len[0] = 0
        return -1
    # Backtrack; ties prefer the diagonal, then (i-1, j), then (i, j-1).
    k = 0
    i = n - 1
    j = m - 1
    while True:
        path_out[2 * k] = <int>i
        path_out[2 * k + 1] = <int>j
        k += 1
        if i == 0 and j == 0:
            break
        ti = i
        tj = j
        best = INF
        if i > 0 and j > 0 and D[(i - 1) * m + j - 1] < best:
            best = D[(i - 1) * m + j - 1]
            ti = i - 1
            tj = j - 1
        if i > 0 and D[(i - 1) * m + j] < best:
            best = D[(i - 1) * m + j]
            ti = i - 1
            tj = j
        if j > 0 and D[i * m + j - 1] < best:
            best = D[i * m + j - 1]
            ti = i
            tj = j - 1
        i = ti
        j = tj
    # Reverse in place so the path runs forward.
    for c in range(k // 2):
        ti = path_out[2 * c]
        tj = path_out[2 * c + 1]
        path_out[2 * c] = path_out[2 * (k - 1 - c)]
        path_out[2 * c + 1] = path_out[2 * (k - 1 - c) + 1]
        path_out[2 * (k - 1 - c)] = <int>ti
        path_out[2 * (k - 1 - c) + 1] = <int>tj
    path_len[0] = k
    return D[n * m - 1]


def dtw_batch(
    const unsigned char[::1] a_bytes, const i64[::1] a_start, const i64[::1] a_end, const i64[::1] a_req,
    const unsigned char[::1] b_bytes, const i64[::1] b_start, const i64[::1] b_end, const i64[::1] b_req,
    i64 window,
):
    """Align every request of a step. Request r's draft tokens are entries
    ``a_req[r]:a_req[r+1]`` of ``a_start``/``a_end`` (byte ranges in ``a_bytes``);
    its proxy tokens likewise in ``b``.

    Returns ``(paths, path_offsets, costs)``: ``paths[path_offsets[r]:path_offsets[r+1]]``
    is request r's path as (draft index, proxy index) rows; cost -1 means no path.
    """
    cdef i64 n_req = a_req.shape[0] - 1
    cdef i64 r, n, m, total = 0, max_work = 0, max_lb = 0, t
    for r in range(n_req):
        n = a_req[r + 1] - a_req[r]
        m = b_req[r + 1] - b_req[r]
        total += n + m
        if n * m > max_work:
            max_work = n * m
    for t in range(b_start.shape[0]):
        if b_end[t] - b_start[t] > max_lb:
            max_lb = b_end[t] - b_start[t]
    paths = np.zeros((max(total, 1), 2), dtype=np.int32)
    offsets = np.zeros(n_req + 1, dtype=np.int64)
    costs = np.zeros(n_req, dtype=np.int64)
    cdef int[:, ::1] pv = paths
    cdef i64[::1] ov = offsets
    cdef i64[::1] cv = costs
    cdef i64* work = <i64*>malloc((max_work + max_lb + 1) * sizeof(i64))
    cdef i64 plen = 0, pos = 0
    cdef const unsigned char* ab = &a_bytes[0] if a_bytes.shape[0] else NULL
    cdef const unsigned char* bb = &b_bytes[0] if b_bytes.shape[0] else NULL
    if work == NULL:
        raise MemoryError()
    try:
        with nogil:
            for r in range(n_req):
                n = a_req[r + 1] - a_req[r]
                m = b_req[r + 1] - b_req[r]
                if n == 0 or m == 0:
                    cv[r] = 0
                    ov[r + 1] = pos
                    continue
                cv[r] = _dtw_one(
                    ab, &a_start[a_req[r]], &a_end[a_req[r]], n,
                    bb, &b_start[b_req[r]], &b_end[b_req[r]], m,
                    window, &pv[pos, 0], &plen, work,
                )
                pos += plen
                ov[r + 1] = pos
    finally:
        free(work)
    return paths[:pos], offsets, costs


def matching_prefix(
    const unsigned char[::1] text, i64 limit, const i64[::1] ids, const i64[::1] ends, i64 start, i64 n_fixed,
    const unsigned char[::1] vocab_bytes, const i64[::1] vocab_off,
):
    """How many leading ids (checking from ``start``) spell ``text[:limit]``'s prefix,
    token bytes looked up in the packed vocabulary table. ``ids`` and ``ends`` may be
    longer than the live tokenization; pass views of its length."""
    cdef i64 j = start if start > n_fixed else n_fixed
    cdef i64 n = ids.shape[0], n_vocab = vocab_off.shape[0] - 1, begin, end, tid, blen
    with nogil:
        while j < n:
            begin = ends[j - 1] if j > 0 else 0
            end = ends[j]
            tid = ids[j]
            # Ids past the table (a model's padded embedding rows) spell nothing.
            blen = vocab_off[tid + 1] - vocab_off[tid] if 0 <= tid < n_vocab else 0
            if end > limit or end - begin != blen:
                break
            if blen and memcmp(&text[begin], &vocab_bytes[vocab_off[tid]], blen) != 0:
                break
            j += 1
    return j


def common_prefix(const i64[::1] a, const i64[::1] b):
    """Length of the longest common prefix of two id arrays (the realignment overlap)."""
    cdef i64 i = 0, n = min(a.shape[0], b.shape[0])
    with nogil:
        while i < n and a[i] == b[i]:
            i += 1
    return i


def realign(
    const i64[::1] window, i64[::1] ids, i64[::1] ends, i64 start, i64 keep, i64 begin, const i64[::1] lengths,
):
    """Realign a tokenization with its re-encoded look-behind window, in place.

    ``window`` is the encoding of the text from byte ``begin`` (where token ``start``
    begins); ids ``[start, keep)`` are the old tokens there. The longest common prefix of
    the two is kept, the rest of the window is written after it with its byte ends.
    ``ids``/``ends`` need room for ``start + len(window)`` entries; ``lengths`` holds
    each id's byte length plus a trailing zero used for ids past the table.
    Returns (tokens kept from the old ids, byte offset where the window's tokens end).
    """
    cdef i64 n = window.shape[0], last = lengths.shape[0] - 1, p = 0, i, tid, pos = begin
    if ids.shape[0] < start + n or ends.shape[0] < start + n:
        raise ValueError("realign: ids/ends too short for the window")
    with nogil:
        while p < n and start + p < keep and window[p] == ids[start + p]:
            p += 1
        for i in range(n):
            tid = window[i]
            pos += lengths[tid if 0 <= tid < last else last]
            if i >= p:
                ids[start + i] = tid
                ends[start + i] = pos
    return start + p, pos
