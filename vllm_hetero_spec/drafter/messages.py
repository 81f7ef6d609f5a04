"""The messages of one drafting step, and the drafter's counters.

What the proposer (vLLM's side) hands the drafting engine, what comes back, and what
travels to a Ray actor and back: plain data, no behaviour beyond layout, the way vLLM
keeps its own ``v1/spec_decode/metadata.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from vllm_hetero_spec.verify.draft_probs import DraftProbs


@dataclass(frozen=True)
class RequestParams:
    """A request's sampling settings, as the drafter needs them (read from vLLM's
    ``SamplingParams`` by the proposer, which alone sees the runner)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    fsd_threshold: float = 0.0
    rule: str = ""  # with ``algorithm: auto``, the rule this step drafts with ("" = the engine's default)


@dataclass
class StepBatch:
    """One step's rows to draft: each request's committed target tokens (prompt and
    output) and its sampling settings; ``budget`` caps the target tokens proposed, and
    ``lengths`` (when given) each row's own cap, at most ``budget``: a row stops drafting
    there, so its draft random stream advances by its own length, not the batch's
    longest (and no forward is spent on proposals that would be cut)."""

    req_ids: list[str]
    tokens: list[np.ndarray]
    params: list[RequestParams]
    budget: int
    lengths: list[int] | None = None

    def cap(self, row: int) -> int:
        """Row ``row``'s cap on target tokens proposed."""
        return self.budget if self.lengths is None else min(self.lengths[row], self.budget)


@dataclass
class StepDrafts:
    """One step's proposals, per row of the :class:`StepBatch`.

    Attributes:
        ids: target-vocabulary proposals (possibly empty).
        q: the q rows of the proposals that carry one, in compact form
            (``verify/draft_probs.py``), or ``None`` when none does.
        q_index: per row, per proposal, its row of ``q`` or -1: a one-hot proposal
            (``slem``, lossless ``dtw``, ``slrs`` after its first token) or one whose q
            verification never reads (greedy rows, except ``fsd``'s). Empty lists when
            ``q`` is ``None``.
        force_reject: ``union``: per row with an absent proposal, which positions.
        fsd_threshold: ``fsd``: per row its tau; ``None`` for other algorithms.
        ready: per row, False when there was nothing to draft from yet.
    """

    ids: list[list[int]]
    q: DraftProbs | None = None
    q_index: list[list[int]] = field(default_factory=list)
    force_reject: dict[int, list[bool]] = field(default_factory=dict)
    fsd_threshold: list[float] | None = None
    ready: list[bool] = field(default_factory=list)

    def q_rows_of(self, row: int) -> list[int]:
        """Row ``row``'s q rows per proposal (-1: none)."""
        return self.q_index[row] if self.q is not None else [-1] * len(self.ids[row])

    def truncate(self, lengths: list[int]) -> None:
        """Keep row i's first ``lengths[i]`` proposals. A prefix of a draft is a draft
        drawn the same way, so every rule verifies it as losslessly; the q rows of the
        dropped proposals are simply never read."""
        for row, n in enumerate(lengths):
            if len(self.ids[row]) <= n:
                continue
            self.ids[row] = self.ids[row][:n]
            if self.q is not None:
                self.q_index[row] = self.q_index[row][:n]
            if row in self.force_reject:
                self.force_reject[row] = self.force_reject[row][:n]

    def select(self, rows: list[int]) -> "StepDrafts":
        """The drafts of ``rows`` only, renumbered in that order."""
        where = {r: i for i, r in enumerate(rows)}
        q, q_index = None, []
        if self.q is not None:
            used = [j for r in rows for j in self.q_index[r] if j >= 0]
            renumber = {j: n for n, j in enumerate(used)}
            q_index = [[renumber.get(j, -1) for j in self.q_index[r]] for r in rows]
            q = self.q.take(used) if used else None
            if q is None:
                q_index = []
        return StepDrafts(
            [self.ids[r] for r in rows],
            q,
            q_index,
            {where[r]: f for r, f in self.force_reject.items() if r in where},
            None if self.fsd_threshold is None else [self.fsd_threshold[r] for r in rows],
            [self.ready[r] for r in rows],
        )

    @staticmethod
    def concat(parts: list["StepDrafts"]) -> "StepDrafts":
        """Rows of ``parts`` (at least one; ``fsd``'s thresholds in all or none) one after the other."""
        out = StepDrafts([], None, [], {}, None, [])
        if parts[0].fsd_threshold is not None:
            out.fsd_threshold = []
        with_q = [p.q for p in parts if p.q is not None]
        base_q = 0
        for part in parts:
            base = len(out.ids)
            out.ids += part.ids
            if with_q:
                out.q_index += [[j + base_q if j >= 0 else -1 for j in part.q_rows_of(r)] for r in range(len(part.ids))]
                base_q += part.q.num_rows if part.q is not None else 0
            out.force_reject.update({base + r: f for r, f in part.force_reject.items()})
            if out.fsd_threshold is not None:
                out.fsd_threshold += part.fsd_threshold
            out.ready += part.ready
        if with_q:
            out.q = DraftProbs.cat(with_q)
        return out


@dataclass
class DraftOutput:
    """One draft loop's result for the active requests (see ``draft_loop.run_draft_loop``)."""

    ids: list[list[int]]
    token_q: list[list[float]]
    absent: list[list[bool]]
    q: DraftProbs | None = None
    q_index: list[list[int]] = field(default_factory=list)


class FirstToken(NamedTuple):
    """An ``slrs`` request's first proposal this step: the target token, the psi row it
    was drawn from, and whether drafting continues after it (not after EOS or a token
    the draft vocabulary cannot spell)."""

    target_id: int
    q: DraftProbs
    continues: bool


@dataclass
class DrafterStats:
    """Counters exposed to benchmarks and metrics (see ``metrics.COUNTERS``).

    The ``ray_*``, ``pipeline_*`` and ``budget_*`` counters stay zero in process; with
    the Ray executor the drafting counters come from the actor and the rest are kept
    by the client (``drafter/placement/ray_host.py``)."""

    steps: int = 0
    bridge_s: float = 0.0
    draft_s: float = 0.0
    draft_forwards: int = 0
    proposed: int = 0
    realign_mismatches: int = 0
    fallbacks: int = 0
    rank_checks: int = 0
    rank_mismatches: int = 0
    undrafted: int = 0
    pool_full: int = 0
    pool_bytes: int = 0
    slrs_nodes: int = 0
    slrs_capped: int = 0
    slrs_uncovered: int = 0
    request_states: int = 0
    state_bytes: int = 0
    pipeline_hits: int = 0
    pipeline_misses: int = 0
    pipeline_branches: int = 0
    pipeline_s: float = 0.0
    pipeline_errors: int = 0
    actor_idle_s: float = 0.0
    ray_wait_s: float = 0.0
    ray_target_s: float = 0.0
    ray_timeouts: int = 0
    ray_restarts: int = 0
    ray_undrafted_steps: int = 0
    budget_sum: int = 0
    budget_steps: int = 0
    undrafted_steps: int = 0

    def as_metrics(self) -> dict[str, float]:
        """The counters under their ``hetero:*`` metric names."""
        return {
            "steps": self.steps,
            "bridge_seconds": self.bridge_s,
            "draft_seconds": self.draft_s,
            "proposed_tokens": self.proposed,
            "realign_mismatches": self.realign_mismatches,
            "fallbacks": self.fallbacks,
            "rank_checks": self.rank_checks,
            "rank_mismatches": self.rank_mismatches,
            "undrafted_requests": self.undrafted,
            "pool_full_requests": self.pool_full,
            "slrs_tree_nodes": self.slrs_nodes,
            "slrs_capped_candidates": self.slrs_capped,
            "slrs_uncovered_requests": self.slrs_uncovered,
            "pipeline_hits": self.pipeline_hits,
            "pipeline_misses": self.pipeline_misses,
            "pipeline_branches": self.pipeline_branches,
            "pipeline_errors": self.pipeline_errors,
            "ray_wait_seconds": self.ray_wait_s,
            "ray_timeouts": self.ray_timeouts,
            "ray_restarts": self.ray_restarts,
            "ray_undrafted_steps": self.ray_undrafted_steps,
            "draft_length_sum": self.budget_sum,
            "budget_steps": self.budget_steps,
            "undrafted_steps": self.undrafted_steps,
        }
