"""The exact byte string each token id stands for.

Vocabularies can only be compared on what their tokens *mean* as text, not on how the
tokenizer spells them internally: byte-level BPE spells a leading space as ``Ġ`` and raw
bytes as printable stand-ins, SentencePiece spells it ``▁`` and keeps ``<0xNN>`` byte
fallback tokens. This module undoes those spellings once per tokenizer so that every
later step (intersection, re-tokenization, alignment) works on plain bytes.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

from transformers import PreTrainedTokenizerBase

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_SPM_SPACE = "\u2581"
# llama.cpp fills a vocabulary padded to the embedding size with "[PAD<id>]" entries;
# they are not text and no merge can produce them.
_GGUF_PAD = re.compile(r"^\[PAD(\d+)\]$")


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's printable-character stand-in for each byte, inverted."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _is_byte_level(tokenizer: PreTrainedTokenizerBase) -> bool:
    """True when the fast tokenizer's decoder is (or contains) a ByteLevel decoder. Reads
    the decoder's own state, not the whole tokenizer's: serializing Gemma-3's 262k-entry
    vocabulary just to find its decoder is slow."""
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is None or backend.decoder is None:
        return False
    decoder = json.loads(backend.decoder.__getstate__())
    kinds = [decoder.get("type")] + [d.get("type") for d in decoder.get("decoders", []) or []]
    return "ByteLevel" in kinds


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Ids that are control tokens rather than text (bos, eos, chat markers, pads)."""
    ids = set(tokenizer.all_special_ids)
    for tid, added in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(added, "special", False):
            ids.add(int(tid))
    return ids


def token_bytes_table(tokenizer: PreTrainedTokenizerBase, vocab_size: int | None = None) -> list[bytes | None]:
    """Bytes of every id in ``[0, vocab_size)``; ``None`` for special tokens and ids the
    tokenizer does not know (e.g. Qwen's padding rows beyond ``len(tokenizer)``).

    ``vocab_size`` is the model's embedding size, which may exceed the tokenizer's.
    """
    size = vocab_size if vocab_size is not None else len(tokenizer)
    table: list[bytes | None] = [None] * size
    specials = special_token_ids(tokenizer)
    byte_level = _is_byte_level(tokenizer)
    inv = _byte_level_decoder()
    for piece, tid in tokenizer.get_vocab().items():
        if tid >= size or tid in specials:
            continue
        pad = _GGUF_PAD.match(piece)
        if pad and int(pad.group(1)) == tid:
            continue
        if byte_level:
            try:
                table[tid] = bytes(inv[ch] for ch in piece)
            except KeyError:
                # Added non-special tokens are stored verbatim, not byte-mapped.
                table[tid] = piece.encode("utf-8")
            continue
        m = _BYTE_FALLBACK.match(piece)
        if m:
            table[tid] = bytes([int(m.group(1), 16)])
        else:
            table[tid] = piece.replace(_SPM_SPACE, " ").encode("utf-8")
    return table
