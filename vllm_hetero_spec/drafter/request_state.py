"""What the drafter keeps for one request between steps."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_hetero_spec.drafter.messages import RequestParams
from vllm_hetero_spec.drafter.runtime.paged_kv import PagedCache
from vllm_hetero_spec.vocab.id_map import MappedTokens
from vllm_hetero_spec.vocab.retokenize import AlignedTokens


@dataclass
class RequestState:
    """One request's draft side: its committed text, the last committed target tokens
    (re-encoded with draft text by the string-level draft rules), its draft-side
    tokenization (the target's ids mapped, for a pair that agrees id for id), its KV
    cache, and its own random stream when it is seeded."""

    text: bytearray
    n_target: int
    target_tail: list[int]
    draft: AlignedTokens | MappedTokens
    cache: PagedCache
    generator: torch.Generator | None
    params: RequestParams

    def fork(self) -> "RequestState":
        """An independent copy (KV cache shared copy-on-write, tokenization and random
        stream), so a speculative continuation can be drafted without touching this state."""
        gen = None
        if self.generator is not None:
            gen = torch.Generator(device=self.generator.device).set_state(self.generator.get_state())
        return RequestState(
            bytearray(self.text), self.n_target, list(self.target_tail), self.draft.fork(),
            self.cache.fork(), gen, self.params,
        )

    def pending(self) -> list[int]:
        """The draft tokens not in the KV cache yet (the next forward's input)."""
        return self.draft.ids[self.cache.length :].tolist()
