"""What a rule's draft rule and the draft loop may read of the engine that drafts.

A narrow view instead of the engine itself: fixed for the engine's lifetime, so a
draft rule cannot reach into other requests' state or the engine's bookkeeping, and the
draft loop and draft rules need not import the engine (which imports them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_hetero_spec.config import HeteroSettings
from vllm_hetero_spec.drafter.messages import DrafterStats
from vllm_hetero_spec.drafter.request_state import RequestState
from vllm_hetero_spec.drafter.runtime.model import DraftModel
from vllm_hetero_spec.drafter.sampling import SamplingRows
from vllm_hetero_spec.vocab.bridge import VocabBridge
from vllm_hetero_spec.vocab.intersection import VocabIntersection


@dataclass(frozen=True)
class DraftContext:
    """The engine's fixed parts.

    Attributes:
        settings: the plugin's settings (the rule-specific keys a draft rule reads).
        runtime: the draft model.
        bridge: the two tokenizers' byte-level views.
        intersection: the shared-token map, on the drafter's device.
        draft_specials: draft ids without text (a draft stops after one).
        target_eos: the target's EOS id, proposed after a draft that ended.
        target_vocab: the target's vocabulary size.
        generator: the unseeded rows' draft stream, shared by all of them.
        stats: the engine's counters, which draft rules add to.
    """

    settings: HeteroSettings
    runtime: DraftModel
    bridge: VocabBridge
    intersection: VocabIntersection
    draft_specials: frozenset[int]
    target_eos: int | None
    target_vocab: int
    generator: torch.Generator
    stats: DrafterStats

    @property
    def device(self) -> torch.device:
        return self.runtime.device

    def sampling_rows(self, states: list[RequestState]) -> SamplingRows:
        """The sampling settings of ``states``' rows, on the device."""
        params = [s.params for s in states]
        return SamplingRows.build(
            [p.temperature for p in params], [p.top_k for p in params], [p.top_p for p in params],
            [s.generator for s in states], self.device, self.generator,
        )

    def next_logits(self, states: list[RequestState]) -> torch.Tensor:
        """The drafter's logits ``[n, draft_vocab]`` after each state's current draft
        tokens (each must have a token pending, as after the engine's sync)."""
        self.stats.draft_forwards += 1
        return self.runtime.forward([s.cache for s in states], [s.pending() for s in states])
