"""The id map: found for a pair that agrees id for id (the same tokenizer, or a near-same
one built here the way the R1-Distill Qwen models differ from Qwen2.5: added tokens
respelled, one more added), not for different vocabularies; and a request's mapped ids
follow the committed tokens, keeping the drafts the target accepted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from vllm_hetero_spec.vocab.bridge import VocabBridge
from vllm_hetero_spec.vocab.id_map import MIN_DIFFERING_ALLOWED, IdMap, MappedTokens

QWEN_VOCAB = 151936
# R1-Distill-Qwen's spellings of four of Qwen2.5's added tokens, and one token it adds.
RESPELLED = {151644: "<｜User｜>", 151645: "<｜Assistant｜>", 151648: "<think>", 151649: "</think>"}
ADDED = (151665, "<｜pad｜>")


@pytest.fixture(scope="module")
def near_same(qwen05: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tokenizer folder: Qwen2.5's, with :data:`RESPELLED` and :data:`ADDED`."""
    folder = tmp_path_factory.mktemp("r1_like")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(qwen05) / name, folder / name)
    tok = json.loads((folder / "tokenizer.json").read_text())
    for added in tok["added_tokens"]:
        added["content"] = RESPELLED.get(added["id"], added["content"])
    tok["added_tokens"].append({**tok["added_tokens"][-1], "id": ADDED[0], "content": ADDED[1]})
    vocab = tok["model"]["vocab"]  # spells the added ids too (and pads the table to the embedding)
    for old in [text for text, tid in vocab.items() if tid in RESPELLED or tid == ADDED[0]]:
        tid = vocab.pop(old)
        vocab[RESPELLED.get(tid, ADDED[1])] = tid
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    assert not cfg.get("added_tokens_decoder"), "the added tokens are spelled in tokenizer.json alone"
    for key in ("eos_token", "pad_token", "bos_token"):
        if cfg.get(key) in {"<|im_start|>", "<|im_end|>"}:
            cfg[key] = "<|endoftext|>"
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return str(folder)


def test_the_same_tokenizer_maps_every_id_to_itself(qwen05: str) -> None:
    bridge = VocabBridge.build(qwen05, qwen05, QWEN_VOCAB, QWEN_VOCAB)
    assert bridge.id_map is not None and not bridge.id_map.differing
    ids = np.array(bridge.target_tokenizer.encode("<|im_start|>user\ndef f(x):\n    return x  # ✓"))
    assert bridge.id_map.to_draft(ids).tolist() == ids.tolist()


def test_different_vocabularies_get_no_id_map(smollm2: str, qwen05: str, gemma: str) -> None:
    assert VocabBridge.build(smollm2, qwen05, 49152, QWEN_VOCAB).id_map is None
    assert VocabBridge.build(smollm2, gemma, 49152, 262144).id_map is None


@pytest.mark.parametrize("direction", ["r1-like drafts", "r1-like target"])
def test_a_near_same_pair_maps_by_id_and_carries_the_differing_ids_by_text(
        qwen05: str, near_same: str, direction: str) -> None:
    draft, target = (near_same, qwen05) if direction == "r1-like drafts" else (qwen05, near_same)
    bridge = VocabBridge.build(draft, target, QWEN_VOCAB, QWEN_VOCAB)
    assert not bridge.same_vocab and bridge.id_map is not None
    # The respelled ids differ, and the added one where the target is the one that has it.
    texts = RESPELLED if target == qwen05 else {**RESPELLED, ADDED[0]: ADDED[1]}
    assert {t for t, d in bridge.id_map.differing.items() if d} == set(texts)
    t_enc, d_enc = bridge.target_encoder, bridge.draft_encoder
    text = "Hi<|im_start|>x" if target == qwen05 else "Hi<｜User｜>x<think><｜pad｜>y"
    ids = np.array(bridge.target_tokenizer.encode(text))
    mapped = bridge.id_map.to_draft(ids)
    # The draft ids spell the same text, and every id both spell alike maps to itself.
    assert b"".join(d_enc.bytes_of(int(d)) for d in mapped) == b"".join(t_enc.bytes_of(int(t)) for t in ids)
    assert mapped[0] == ids[0] and mapped[-1] == ids[-1] and int(ids[1]) in texts
    if target == qwen05:  # the draft respelled <|im_start|>: its text takes several draft ids
        assert len(mapped) > len(ids)


def test_too_many_differing_ids_is_not_near_same() -> None:
    n = 20 * MIN_DIFFERING_ALLOWED
    target = [bytes([65 + i % 26]) * (1 + i // 26) for i in range(n)]
    close = list(target)
    for i in range(MIN_DIFFERING_ALLOWED):
        close[i] = b"#" + close[i]
    far = list(close)
    far[MIN_DIFFERING_ALLOWED] = b"#" + far[MIN_DIFFERING_ALLOWED]

    def encode(text: bytes) -> list[int]:
        return [0] * len(text)

    assert IdMap.detect(close, target, encode) is not None
    assert IdMap.detect(far, target, encode) is None
    # Padding the target's embedding further (ids without text) is not a difference.
    padded = IdMap.detect(target, target + [None] * 100, encode)
    assert padded is not None and padded.to_draft(np.array([1, n + 5, 2])).tolist() == [1, 2]


def test_mapped_tokens_keep_the_accepted_drafts() -> None:
    tokens = MappedTokens(IdMap({}, np.ones(1000, dtype=bool)))
    assert tokens.commit(np.array([5, 6, 7])) == 0 and tokens.ids.tolist() == [5, 6, 7]
    for d in (8, 9, 10):
        tokens.append_drafted(d)
    fork = tokens.fork()
    # The target accepted 8 and 9, then sampled 11 where the draft said 10.
    assert tokens.commit(np.array([8, 9, 11])) == 5 and tokens.ids.tolist() == [5, 6, 7, 8, 9, 11]
    assert fork.ids.tolist() == [5, 6, 7, 8, 9, 10]
    tokens.append_drafted(12)
    assert tokens.commit(np.array([13])) == 6 and len(tokens) == 7
