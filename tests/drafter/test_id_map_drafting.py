"""Drafting over an id map (a draft and target that agree id for id), with the proposer's
own sync and draft loop and a scripted draft model: the drafter reads the target's ids
as they are, its drafts reach the target as the same ids, and the KV of the drafts the
target accepted is kept, so the next step feeds only what the target added."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vllm import SamplingParams

from test_proposer_token_level import K, ScriptedRuntime, _attach, target_config
from vllm_hetero_spec.vllm_integration import proposer as proposer_module
from vllm_hetero_spec.config import HeteroSettings
from vllm_hetero_spec.drafter import batch_drafter as engine_module
from vllm_hetero_spec.vocab.bridge import VocabBridge

QWEN_VOCAB = 151936


class QwenScripted(ScriptedRuntime):
    """The scripted draft model over Qwen's vocabulary, recording every forward's new tokens."""

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.vocab_size = QWEN_VOCAB
        self.inputs: list[list[list[int]]] = []

    def forward(self, caches, new_tokens):
        self.inputs.append([list(t) for t in new_tokens])
        return super().forward(caches, new_tokens)


@pytest.fixture(scope="module")
def same(qwen05: str) -> VocabBridge:
    return VocabBridge.build(qwen05, qwen05, QWEN_VOCAB, QWEN_VOCAB)


@pytest.mark.parametrize("id_map", ["auto", "off"])
def test_the_drafter_reads_the_target_ids_and_keeps_accepted_drafts(monkeypatch, same, qwen05, id_map) -> None:
    script = [1000, 2000, 3000, 4000]
    monkeypatch.setattr(engine_module, "DraftModel", QwenScripted)
    monkeypatch.setattr(engine_module.VocabBridge, "build", lambda *a: same)
    QwenScripted.script, QwenScripted.confidence = script, {}
    settings = HeteroSettings(algorithm="tli", draft_model=qwen05, draft_tokenizer=qwen05, num_speculative_tokens=K,
                              draft_budget="fixed", draft_kv_pool_mb=64, id_map=id_map)
    prop = proposer_module.HeteroProposer(target_config(settings, qwen05))
    prop.load_model(None)
    engine = prop.host.drafter
    assert (engine.id_map is not None) == (id_map == "auto")
    _attach(prop, {"r": SamplingParams(temperature=0.0)}, ["r"])
    # A target-side spelling the draft tokenizer would not choose for this text: "hello"
    # as "hel" + "lo". The id map hands it over as it is; re-tokenization respells it.
    hel, lo = same.target_tokenizer.convert_tokens_to_ids(["hel", "lo"])
    prompt = same.target_tokenizer.encode("Say:") + [hel, lo]
    assert same.target_tokenizer.encode("Say:hello") != prompt

    out = prop.propose([[prompt[-1]]], np.array([len(prompt)]), np.array([prompt]))
    assert out == [script] and prop.stats.fallbacks == 0
    first = engine.runtime.inputs[0][0]
    if id_map == "auto":
        assert first == prompt
    else:
        assert first != prompt
    # The target accepts the first two drafts and samples its own third token.
    committed = prompt + script[:2] + [5]
    engine.runtime.inputs.clear()
    prop.propose([[*script[:2], 5]], np.array([len(committed)]), np.array([committed]))
    if id_map == "auto":
        assert engine.runtime.inputs[0] == [[5]]  # the accepted drafts' KV stayed
        assert engine.states["r"].draft.ids[: len(committed)].tolist() == committed
    assert torch.equal(engine.intersection.draft_to_target[torch.tensor(script)], torch.tensor(script))
