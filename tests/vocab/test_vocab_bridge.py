"""The vocabulary bridge on the real tokenizers (SmolLM2, Gemma-3, Qwen2.5-Coder)."""

from __future__ import annotations

import random

import pytest

from hetero_harness.prompts import BRIDGE_STRESS
from vllm_hetero_spec.vocab.bridge import VocabBridge, load_tokenizer, text_encoder
from vllm_hetero_spec.vocab.retokenize import (
    AlignedTokens,
    complete_utf8_prefix,
    propose_continuation,
    propose_continuations,
    sync_batch,
)
from vllm_hetero_spec.vocab.token_bytes import token_bytes_table

TEXTS = BRIDGE_STRESS + ["<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "ÅÉÎÕÜ ñ ç ß œ", "x" * 300]


@pytest.fixture(scope="module")
def tokenizers(smollm2: str, gemma: str, qwen05: str) -> dict[str, object]:
    return {name: load_tokenizer(path) for name, path in
            (("smollm2", smollm2), ("gemma", gemma), ("qwen", qwen05))}


@pytest.mark.parametrize("name", ["smollm2", "gemma", "qwen"])
def test_token_bytes_spell_the_text(tokenizers: dict, name: str) -> None:
    """Space markers (Ġ, ▁), byte fallback and split UTF-8 all decode to the exact bytes."""
    tok = tokenizers[name]
    table = token_bytes_table(tok)
    for text in TEXTS[:-3] + TEXTS[-2:]:
        ids = tok.encode(text, add_special_tokens=False)
        assert b"".join(table[i] for i in ids) == text.encode(), (name, text)


def test_special_and_padding_ids(tokenizers: dict, qwen05: str) -> None:
    qwen = tokenizers["qwen"]
    table = token_bytes_table(qwen, 151936)
    assert table[qwen.eos_token_id] is None  # specials are not text
    assert len(table) == 151936 and table[-1] is None  # embedding rows past the tokenizer
    gemma = tokenizers["gemma"]
    gtable = token_bytes_table(gemma)
    byte_tokens = [i for i, p in enumerate(gemma.convert_ids_to_tokens(list(range(300)))) if p.startswith("<0x")]
    assert byte_tokens and all(len(gtable[i]) == 1 for i in byte_tokens)
    smol = token_bytes_table(tokenizers["smollm2"])
    space_hello = tokenizers["smollm2"].encode(" hello", add_special_tokens=False)
    assert [smol[i] for i in space_hello] == [b" hello"]


@pytest.mark.parametrize("draft,target,lo,hi", [("smollm2", "qwen", 35_000, 45_000), ("smollm2", "gemma", 40_000, 49_152)])
def test_intersection_sizes(tokenizers: dict, smollm2: str, gemma: str, qwen05: str, draft: str, target: str,
                            lo: int, hi: int) -> None:
    paths = {"smollm2": smollm2, "gemma": gemma, "qwen": qwen05}
    sizes = {"smollm2": 49152, "gemma": 262144, "qwen": 151936}
    bridge = VocabBridge.build(paths[draft], paths[target], sizes[draft], sizes[target])
    inter = bridge.intersection
    assert lo <= inter.size <= hi
    d_bytes = token_bytes_table(bridge.draft_tokenizer, sizes[draft])
    t_bytes = token_bytes_table(bridge.target_tokenizer, sizes[target])
    for d, t in zip(inter.shared_draft_ids[:2000].tolist(), inter.shared_target_ids[:2000].tolist()):
        assert d_bytes[d] == t_bytes[t] and d_bytes[d]
    assert not bridge.same_vocab


@pytest.mark.parametrize("src,dst", [("qwen", "smollm2"), ("gemma", "smollm2"), ("smollm2", "gemma")])
def test_aligned_tokens_follow_growing_text(tokenizers: dict, smollm2: str, gemma: str, qwen05: str,
                                            src: str, dst: str) -> None:
    """Text arriving a few source tokens at a time keeps the destination tokenization
    spelling it exactly, and (with look-behind) equal to a full re-encode at the end."""
    paths = {"smollm2": smollm2, "gemma": gemma, "qwen": qwen05}
    bridge = VocabBridge.build(paths[dst], paths[src], None, None)
    src_enc, dst_enc = bridge.target_encoder, bridge.draft_encoder
    rng = random.Random(0)
    canonical = 0
    for text in TEXTS:
        ids = tokenizers[src].encode(text, add_special_tokens=False)
        aligned = AlignedTokens(dst_enc, [], lookbehind=4)
        buf = bytearray()
        i = 0
        while i < len(ids):
            n = rng.randint(1, 5)
            for t in ids[i : i + n]:
                buf += src_enc.bytes_of(t)
            i += n
            aligned.sync(buf)
            spelled = b"".join(dst_enc.bytes_of(t) for t in aligned.ids)
            assert spelled == bytes(buf[: complete_utf8_prefix(buf)])
        canonical += aligned.ids.tolist() == tokenizers[dst].encode(text, add_special_tokens=False)
    assert canonical >= len(TEXTS) - 1


@pytest.mark.parametrize("name", ["smollm2", "gemma", "qwen"])
def test_batched_encoder_matches_tokenizer(tokenizers: dict, name: str) -> None:
    """The hot path's batched Rust call gives exactly the tokenizer's own encoding."""
    tok = tokenizers[name]
    enc = text_encoder(tok, token_bytes_table(tok))
    windows = [t.encode() for t in TEXTS] + [b"", "é".encode()[:1], b" \n\n  x"]
    expected = [tokenizers[name].encode(w.decode(errors="replace"), add_special_tokens=False) for w in windows]
    assert enc.encode_many(windows) == expected


def test_sync_batch_equals_one_by_one(tokenizers: dict, smollm2: str, qwen05: str) -> None:
    """Batched realignment over many requests is the per-request sync, request by request."""
    bridge = VocabBridge.build(smollm2, qwen05, None, None)
    src_enc, dst_enc = bridge.target_encoder, bridge.draft_encoder
    streams = [tokenizers["qwen"].encode(t, add_special_tokens=False) for t in TEXTS]
    single = [AlignedTokens(dst_enc, [], lookbehind=4) for _ in streams]
    batched = [AlignedTokens(dst_enc, [], lookbehind=4) for _ in streams]
    bufs = [bytearray() for _ in streams]
    for step in range(0, max(len(s) for s in streams), 3):
        for buf, ids in zip(bufs, streams):
            buf += b"".join(src_enc.bytes_of(t) for t in ids[step : step + 3])
        kept_single = [a.sync(b) for a, b in zip(single, bufs)]
        assert sync_batch(batched, bufs) == kept_single
        assert all(a.ids.tolist() == b.ids.tolist() for a, b in zip(single, batched))
    tails = [s[:4] for s in streams]
    texts = [b"".join(src_enc.bytes_of(t) for t in s[4:12]) for s in streams]
    outs = propose_continuations(src_enc, tails, texts, 6)
    for text, out in zip(texts, outs):
        assert text.startswith(b"".join(src_enc.bytes_of(t) for t in out))
    assert sum(out == s[4:10] for out, s in zip(outs, streams)) >= len(streams) - 1


def test_propose_continuation_realigns_mid_word(tokenizers: dict, smollm2: str, qwen05: str) -> None:
    bridge = VocabBridge.build(smollm2, qwen05, None, None)
    qwen = tokenizers["qwen"]
    enc = bridge.target_encoder
    ids = qwen.encode("The extraordinary performance of the orchestra", add_special_tokens=False)
    for cut in range(1, len(ids)):
        rest = b"".join(enc.bytes_of(t) for t in ids[cut:])
        assert propose_continuation(enc, ids[:cut][-4:], rest, 16) == ids[cut:]
    # A tail that ends mid-word still yields a continuation that spells the draft text.
    tail = qwen.encode("The extra", add_special_tokens=False)
    out = propose_continuation(enc, tail, b"ordinary day", 8)
    assert b"".join(enc.bytes_of(t) for t in out) == b"ordinary day"


def test_complete_utf8_prefix() -> None:
    s = "a😀é".encode()
    assert [complete_utf8_prefix(s[:n]) for n in range(len(s) + 1)] == [0, 1, 1, 1, 1, 5, 5, 7]
