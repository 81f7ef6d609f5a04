"""One vocabulary's token strings in byte order, for prefix questions about text.

String-level rejection sampling (``slrs``) asks, about the draft vocabulary, "which
tokens start with these bytes?" (a contiguous range in byte order, so the drafter's mass
on them is a difference of two cumulative sums), and about the target vocabulary, "which
tokens are the shortest ones extending this token?" (one pass over a contiguous range).
Both are answered here with bisection over a sorted list, once per vocabulary.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

import numpy as np


def _successor(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string starting with ``prefix``;
    ``None`` when there is none (``prefix`` is all 0xff bytes)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


class SortedStrings:
    """Token ids ordered by their bytes. Tokens without text (specials, ``None``) and
    empty strings are left out: no text starts with them.

    Attributes:
        strings: the distinct token strings, sorted.
        order: ``[n]`` token ids in byte order (duplicated strings keep every id), the
            permutation that makes ``prefix_range`` a slice of a cumulative sum.
        ids: string -> every id spelling it, smallest first.
    """

    def __init__(self, token_bytes: Sequence[bytes | None]):
        pairs = sorted((b, i) for i, b in enumerate(token_bytes) if b)
        self.order = np.array([i for _, i in pairs], dtype=np.int64)
        self._keys = [b for b, _ in pairs]
        self.ids: dict[bytes, list[int]] = {}
        for b, i in pairs:
            self.ids.setdefault(b, []).append(i)
        self.strings = sorted(self.ids)
        self.max_len = max((len(s) for s in self.strings), default=0)

    def prefix_range(self, prefix: bytes) -> tuple[int, int]:
        """``[lo, hi)`` in :attr:`order` of the tokens whose bytes start with ``prefix``."""
        lo = bisect_left(self._keys, prefix)
        nxt = _successor(prefix)
        hi = len(self._keys) if nxt is None else bisect_left(self._keys, nxt, lo)
        return lo, hi

    def extending(self, prefix: bytes) -> list[bytes]:
        """The distinct strings that start with ``prefix`` and are longer, in order."""
        lo = bisect_left(self.strings, prefix)
        nxt = _successor(prefix)
        hi = len(self.strings) if nxt is None else bisect_left(self.strings, nxt, lo)
        return [s for s in self.strings[lo:hi] if len(s) > len(prefix)]

    def minimal_extensions(self, token: bytes) -> list[bytes]:
        """The strings extending ``token`` with no other string of this vocabulary
        strictly between (in byte order every extension of a string directly follows it,
        so one pass keeps each string that does not extend the last one kept)."""
        out: list[bytes] = []
        for s in self.extending(token):
            if not out or not s.startswith(out[-1]):
                out.append(s)
        return out

    def longest_prefix(self, text: bytes) -> bytes | None:
        """The longest string of this vocabulary that ``text`` starts with."""
        for end in range(min(len(text), self.max_len), 0, -1):
            if text[:end] in self.ids:
                return text[:end]
        return None

    def segment(self, text: bytes) -> list[int] | None:
        """Greedy longest-match ids spelling ``text`` exactly; ``None`` when some byte
        cannot be spelled."""
        out, pos = [], 0
        while pos < len(text):
            piece = self.longest_prefix(text[pos:])
            if piece is None:
                return None
            out.append(self.ids[piece][0])
            pos += len(piece)
        return out
