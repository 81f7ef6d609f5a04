"""Keeping two tokenizations of one growing text in step, touching only its tail.

Tokenizers are not prefix-stable: appending text can change how the last few tokens of
the old text split ("hel" + "lo" -> "hello"), and whitespace runs, byte fallback,
partial UTF-8 and CJK all split differently in two vocabularies. Re-encoding the whole
context every step would be correct but O(context) per step. Instead we re-encode a
look-behind window (the last few tokens plus the new bytes) and realign it with the
tokens we already have by their longest common prefix; only tokens after that point are
replaced. Byte strings are the common currency, so UTF-8 sequences split across tokens
are held back until complete.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


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

    def encode(self, data: bytes | bytearray) -> list[int]:
        """Token ids of ``data`` without special prefixes; invalid UTF-8 (which only a
        model can produce) is replaced rather than crashing the step."""
        text = bytes(data).decode("utf-8", errors="replace")
        return self.tokenizer.encode(text, add_special_tokens=False)

    def bytes_of(self, tid: int) -> bytes:
        b = self.token_bytes[tid] if 0 <= tid < len(self.token_bytes) else None
        return b or b""


class AlignedTokens:
    """One tokenization of a byte text, kept in step with the text as it grows.

    ``ids[:n_fixed]`` is a fixed prefix (e.g. a ``<bos>`` the tokenizer adds) that stands
    for no text; every later id stands for ``encoder.bytes_of(id)``, and ``ends[i]`` is the
    byte offset where token ``i`` ends.
    """

    def __init__(self, encoder: TokenEncoder, prefix_ids: list[int], lookbehind: int):
        self.encoder = encoder
        self.lookbehind = lookbehind
        self.ids: list[int] = list(prefix_ids)
        self.ends: list[int] = [0] * len(prefix_ids)
        self.n_fixed = len(prefix_ids)
        self.n_verified = len(prefix_ids)  # ids known to spell a prefix of the text
        self.mismatches = 0

    @property
    def covered(self) -> int:
        """Bytes of text the current ids stand for."""
        return self.ends[-1] if self.ends else 0

    def _truncate(self, n: int) -> None:
        del self.ids[n:]
        del self.ends[n:]
        self.n_verified = min(self.n_verified, n)

    def matching_prefix(self, text: bytes | bytearray, limit: int, start: int = 0) -> int:
        """Number of ids (checking from ``start``) whose bytes spell ``text[:limit]``'s prefix."""
        j = max(start, self.n_fixed)
        while j < len(self.ids):
            begin = self.ends[j - 1] if j > 0 else 0
            end = self.ends[j]
            if end > limit or text[begin:end] != self.encoder.bytes_of(self.ids[j]):
                break
            j += 1
        return j

    def sync(self, text: bytes | bytearray) -> int:
        """Make the ids spell ``text`` (minus an incomplete UTF-8 tail).

        ``text`` only ever grows, so ids verified by an earlier sync are not rechecked:
        the work per call is proportional to the new text, not the context.
        Returns the number of leading ids kept unchanged, so the caller can roll back
        state that depends on the dropped ones (the draft KV cache).
        """
        usable = complete_utf8_prefix(text)
        keep = self.matching_prefix(text, usable, self.n_verified)
        start = max(self.n_fixed, keep - self.lookbehind)
        begin = self.ends[start - 1] if start > 0 else 0
        # Byte-level tokens may end inside a UTF-8 character; a window must not start there.
        while start > self.n_fixed and begin < len(text) and text[begin] & 0xC0 == 0x80:
            start -= 1
            begin = self.ends[start - 1] if start > 0 else 0
        window = self.encoder.encode(text[begin:usable]) if usable > begin else []
        p = 0
        while p < len(window) and start + p < keep and window[p] == self.ids[start + p]:
            p += 1
        if start + p < keep:
            self.mismatches += 1
        kept = start + p
        self._truncate(kept)
        pos = begin + sum(len(self.encoder.bytes_of(t)) for t in window[:p])
        for tid in window[p:]:
            pos += len(self.encoder.bytes_of(tid))
            self.ids.append(tid)
            self.ends.append(pos)
        # A tokenizer that normalizes text (so its tokens do not spell the window
        # byte-exactly) gets its new ids rechecked next time instead of trusted.
        self.n_verified = len(self.ids) if pos == usable else kept
        return kept

    def append_drafted(self, tid: int) -> None:
        """Record a token the drafter produced (it spells text the target has not
        confirmed yet; the next :meth:`sync` keeps it only if the text agrees)."""
        self.ids.append(tid)
        self.ends.append(self.covered + len(self.encoder.bytes_of(tid)))


def propose_continuation(
    encoder: TokenEncoder, tail_ids: list[int], draft_text: bytes, max_tokens: int
) -> list[int]:
    """Target-vocabulary tokens that continue ``tail_ids`` with ``draft_text``.

    Encodes the tail's text plus the draft text; if the encoding starts with the tail's
    own ids, the rest is the continuation. If the boundary merges differently (the tail
    ends mid-word), retry with a shorter tail, down to encoding the draft text alone.
    """
    usable = complete_utf8_prefix(draft_text)
    if usable == 0:
        return []
    body = draft_text[:usable]
    for n_tail in range(len(tail_ids), -1, -1):
        tail = tail_ids[len(tail_ids) - n_tail :]
        prefix = b"".join(encoder.bytes_of(t) for t in tail)
        ids = encoder.encode(prefix + body)
        if ids[:n_tail] == tail:
            return ids[n_tail : n_tail + max_tokens]
    return []
