"""Keeping two tokenizations of one growing text in step, touching only its tail.

Tokenizers are not prefix-stable: appending text can change how the last few tokens of
the old text split ("hel" + "lo" -> "hello"), and whitespace runs, byte fallback,
partial UTF-8 and CJK all split differently in two vocabularies. Re-encoding the whole
context every step would be correct but O(context) per step. Instead we re-encode a
look-behind window (the last few tokens plus the new bytes) and realign it with the
tokens we already have by their longest common prefix; only tokens after that point are
replaced. Byte strings are the common currency, so UTF-8 sequences split across tokens
are held back until complete.

This runs for every request at every step, so the per-step work is batched: one
tokenizer call (the Rust ``encode_batch_fast``) covers the windows of all requests, and
the overlap search runs in the compiled core on numpy id arrays.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
from transformers import PreTrainedTokenizerBase

from vllm_hetero_spec import _alignment
from vllm_hetero_spec.vocab.alignment import PackedVocab


def complete_utf8_prefix(data: bytes | bytearray) -> int:
    """Length of the longest prefix of ``data`` that does not end inside a UTF-8
    sequence (a split character waits for its remaining bytes)."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        if b & 0x80 == 0:
            return n
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return n if back >= need else n - back
    return n


class TokenEncoder:
    """Encodes byte windows with one tokenizer and reports each token's bytes."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, token_bytes: list[bytes | None]):
        self.tokenizer = tokenizer
        self.token_bytes = token_bytes
        self.packed = PackedVocab.build(token_bytes)
        # Byte length per id, with one zero-length sentinel for ids past the table.
        self.lengths = np.append(np.diff(self.packed.offsets), 0)
        # The Rust tokenizer encodes a whole batch in one call, skipping the Python
        # wrapper's per-call overhead (which dominated the bridge's cost per step).
        self._backend = getattr(tokenizer, "backend_tokenizer", None)

    def encode_many(self, datas: Sequence[bytes | bytearray]) -> list[list[int]]:
        """Token ids of each byte string, without special prefixes. Invalid UTF-8
        (which only a model can produce) is replaced rather than crashing the step."""
        texts = [bytes(d).decode("utf-8", errors="replace") for d in datas]
        if self._backend is not None:
            return [e.ids for e in self._backend.encode_batch_fast(texts, add_special_tokens=False)]
        return [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]

    def encode(self, data: bytes | bytearray) -> list[int]:
        return self.encode_many([data])[0]

    def bytes_of(self, tid: int) -> bytes:
        b = self.token_bytes[tid] if 0 <= tid < len(self.token_bytes) else None
        return b or b""

class AlignedTokens:
    """One tokenization of a byte text, kept in step with the text as it grows.

    ``ids[:n_fixed]`` is a fixed prefix (e.g. a ``<bos>`` the tokenizer adds) that stands
    for no text; every later id stands for ``encoder.bytes_of(id)``, and ``ends[i]`` is the
    byte offset where token ``i`` ends. Ids live in growable numpy arrays so that the
    compiled overlap search reads them without conversion.
    """

    def __init__(self, encoder: TokenEncoder, prefix_ids: list[int], lookbehind: int):
        self.encoder = encoder
        self.lookbehind = lookbehind
        cap = max(64, 2 * len(prefix_ids))
        self._ids = np.zeros(cap, dtype=np.int64)
        self._ends = np.zeros(cap, dtype=np.int64)
        self._ids[: len(prefix_ids)] = prefix_ids
        self.n = len(prefix_ids)
        self.n_fixed = len(prefix_ids)
        self.n_verified = len(prefix_ids)  # ids known to spell a prefix of the text
        self.mismatches = 0
        self._pending: tuple[int, int, int, int] | None = None

    @property
    def ids(self) -> np.ndarray:
        return self._ids[: self.n]

    @property
    def ends(self) -> np.ndarray:
        return self._ends[: self.n]

    @property
    def nbytes(self) -> int:
        """Memory held by the id and byte-offset arrays (for the state-size metric)."""
        return self._ids.nbytes + self._ends.nbytes

    def __len__(self) -> int:
        return self.n

    @property
    def covered(self) -> int:
        """Bytes of text the current ids stand for."""
        return int(self._ends[self.n - 1]) if self.n else 0

    def _reserve(self, n: int) -> None:
        if n > len(self._ids):
            cap = max(n, 2 * len(self._ids))
            self._ids = np.concatenate([self._ids, np.zeros(cap - len(self._ids), dtype=np.int64)])
            self._ends = np.concatenate([self._ends, np.zeros(cap - len(self._ends), dtype=np.int64)])

    def matching_prefix(self, text: bytes | bytearray, limit: int, start: int = 0) -> int:
        """Number of ids (checking from ``start``) whose bytes spell ``text[:limit]``'s prefix."""
        packed = self.encoder.packed
        return int(_alignment.matching_prefix(
            text if len(text) else b"\0", limit, self.ids, self.ends, start, self.n_fixed, packed.data, packed.offsets
        ))

    def window(self, text: bytes | bytearray) -> bytes:
        """First half of :meth:`sync`: the byte window to re-encode for ``text`` (the
        caller may encode many requests' windows in one batch, then :meth:`apply`)."""
        usable = complete_utf8_prefix(text)
        keep = self.matching_prefix(text, usable, self.n_verified)
        start = max(self.n_fixed, keep - self.lookbehind)
        ends = self._ends
        begin = int(ends[start - 1]) if start > 0 else 0
        # Byte-level tokens may end inside a UTF-8 character; a window must not start there.
        while start > self.n_fixed and begin < len(text) and text[begin] & 0xC0 == 0x80:
            start -= 1
            begin = int(ends[start - 1]) if start > 0 else 0
        self._pending = (usable, keep, start, begin)
        return bytes(text[begin:usable]) if usable > begin else b""

    def apply(self, window_ids: Sequence[int]) -> int:
        """Second half of :meth:`sync`: realign with the encoded window."""
        assert self._pending is not None, "apply() needs a window() first"
        usable, keep, start, begin = self._pending
        self._pending = None
        window = np.asarray(window_ids, dtype=np.int64)
        self._reserve(start + len(window))
        kept, pos = _alignment.realign(window, self._ids, self._ends, start, keep, begin, self.encoder.lengths)
        if kept < keep:
            self.mismatches += 1
        self.n = start + len(window)
        # A tokenizer that normalizes text (so its tokens do not spell the window
        # byte-exactly) gets its new ids rechecked next time instead of trusted.
        self.n_verified = self.n if pos == usable else kept
        return kept

    def sync(self, text: bytes | bytearray) -> int:
        """Make the ids spell ``text`` (minus an incomplete UTF-8 tail).

        ``text`` only ever grows, so ids verified by an earlier sync are not rechecked:
        the work per call is proportional to the new text, not the context.
        Returns the number of leading ids kept unchanged, so the caller can roll back
        state that depends on the dropped ones (the draft KV cache).
        """
        return self.apply(self.encoder.encode(self.window(text)))

    def fork(self) -> "AlignedTokens":
        """An independent copy of the ids and offsets (the encoder is shared)."""
        other = copy.copy(self)
        other._ids, other._ends = self._ids.copy(), self._ends.copy()
        return other

    def append_drafted(self, tid: int) -> None:
        """Record a token the drafter produced (it spells text the target has not
        confirmed yet; the next :meth:`sync` keeps it only if the text agrees)."""
        end = self.covered + len(self.encoder.bytes_of(tid))
        self._reserve(self.n + 1)
        self._ids[self.n] = tid
        self._ends[self.n] = end
        self.n += 1


def sync_batch(aligned: Sequence[AlignedTokens], texts: Sequence[bytes | bytearray]) -> list[int]:
    """:meth:`AlignedTokens.sync` for many tokenizations sharing one encoder, with a
    single tokenizer call for all their windows."""
    if not aligned:
        return []
    encoder = aligned[0].encoder
    windows = [a.window(t) for a, t in zip(aligned, texts)]
    encoded = encoder.encode_many(windows)
    return [a.apply(ids) for a, ids in zip(aligned, encoded)]


def propose_continuations(
    encoder: TokenEncoder, tails: Sequence[list[int]], draft_texts: Sequence[bytes], max_tokens: int
) -> list[list[int]]:
    """Target-vocabulary tokens that continue each ``tails[i]`` with ``draft_texts[i]``.

    Encodes the tail's text plus the draft text; if the encoding starts with the tail's
    own ids, the rest is the continuation. Where the boundary merges differently (the
    tail ends mid-word), that request is retried with a shorter tail, down to encoding
    the draft text alone. Each round is one batched tokenizer call for all requests
    still unresolved.
    """
    bodies = [t[: complete_utf8_prefix(t)] for t in draft_texts]
    out: list[list[int]] = [[] for _ in tails]
    n_tail = {i: len(tail) for i, tail in enumerate(tails) if bodies[i]}
    while n_tail:
        pending = list(n_tail)
        shorts = [list(tails[i][len(tails[i]) - n_tail[i] :]) for i in pending]
        encoded = encoder.encode_many(
            [b"".join(encoder.bytes_of(x) for x in short) + bodies[i] for i, short in zip(pending, shorts)]
        )
        for i, short, ids in zip(pending, shorts, encoded):
            if ids[: len(short)] == short:
                out[i] = ids[len(short) : len(short) + max_tokens]
                del n_tail[i]
            elif n_tail[i] == 0:
                del n_tail[i]  # cannot happen for a real tokenizer: encoding the body alone
            else:
                n_tail[i] -= 1
    return out


def propose_continuation(encoder: TokenEncoder, tail_ids: list[int], draft_text: bytes, max_tokens: int) -> list[int]:
    """One request's :func:`propose_continuations`."""
    return propose_continuations(encoder, [tail_ids], [draft_text], max_tokens)[0]
