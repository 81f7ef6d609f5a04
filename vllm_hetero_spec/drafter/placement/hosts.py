"""Where drafting runs: in the engine's process (the default) or in a Ray actor.

The proposer talks to either through the same three calls per step -- ``step`` (drafts
for a batch, or ``None`` when there are none this step), ``drop`` (forget a request)
and ``stats`` -- so everything about where drafting happens stays out of the
vLLM-facing code. The Ray host lives in ``drafter/placement/ray_host.py``.
"""

from __future__ import annotations

from typing import Protocol

from vllm_hetero_spec.config import HeteroSettings
from vllm_hetero_spec.drafter.batch_drafter import BatchDrafter
from vllm_hetero_spec.drafter.messages import DrafterStats, StepBatch, StepDrafts
from vllm_hetero_spec.drafter.runtime.config import RuntimeConfig


class DrafterHost(Protocol):
    """What the proposer needs from a place that drafts."""

    def step(self, batch: StepBatch, live: set[str]) -> StepDrafts | None:
        """Drafts for ``batch`` (``live``: every request the engine still holds), or
        ``None`` when this step must run without drafts. May raise; the proposer
        then runs the step undrafted and calls :meth:`reset`."""

    def drop(self, req_id: str) -> None:
        """Forget a finished, aborted or preempted request."""

    def reset(self) -> None:
        """Forget every request (their state may be inconsistent after a failure)."""

    def stats(self) -> DrafterStats:
        """Counters so far (with the current state size)."""

    def capture_graphs(self) -> int:
        """Capture the drafter's CUDA graphs, when the engine captures its own; how many
        (0 where it drafts eagerly)."""

    def graph_memory(self) -> int:
        """Bytes the drafter's CUDA graphs will take on the engine's device (measured by
        capturing them once, then dropping them); 0 where it drafts eagerly."""

    def profile(self, num_tokens: int, num_rows: int) -> None:
        """Run the drafter's largest transient (``BatchDrafter.profile``) where vLLM's
        memory profile sees it; nothing where drafting runs elsewhere."""

    def close(self) -> None:
        """Release what the host started (idempotent)."""


class InProcessHost:
    """Drafting inline, in the caller's process and thread."""

    def __init__(self, settings: HeteroSettings, runtime: RuntimeConfig, target_tokenizer: str, target_vocab: int,
                 seed: int = 0):
        self.drafter = BatchDrafter(settings, target_tokenizer, target_vocab, seed, runtime)

    def step(self, batch: StepBatch, live: set[str]) -> StepDrafts:
        self.drafter.keep_only(live)
        return self.drafter.step(batch)

    def drop(self, req_id: str) -> None:
        self.drafter.drop(req_id)

    def reset(self) -> None:
        self.drafter.reset()

    def stats(self) -> DrafterStats:
        return self.drafter.snapshot_stats()

    def capture_graphs(self) -> int:
        return self.drafter.runtime.capture_graphs()

    def graph_memory(self) -> int:
        return self.drafter.runtime.graph_memory()

    def profile(self, num_tokens: int, num_rows: int) -> None:
        self.drafter.profile(num_tokens, num_rows)

    def close(self) -> None:
        """Nothing to release."""


def make_host(settings: HeteroSettings, runtime: RuntimeConfig, target_tokenizer: str, target_vocab: int,
              seed: int = 0) -> DrafterHost:
    """The host the config asks for (its key is ``executor``), drafting with the concrete ``runtime``
    (``drafter/runtime/config.py``); ``seed`` seeds the draft random streams."""
    if settings.executor == "ray":
        from vllm_hetero_spec.drafter.placement.ray_host import RayHost

        return RayHost(settings, runtime, target_tokenizer, target_vocab, seed)
    return InProcessHost(settings, runtime, target_tokenizer, target_vocab, seed)
