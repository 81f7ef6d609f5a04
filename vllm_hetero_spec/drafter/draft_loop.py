"""The bookkeeping of one step's draft loop (``DraftEngine._draft`` runs it).

It keeps the rows in the order the loop runs them (longest step count first), samples
each position through the algorithm's strategy, and turns what comes back to the host
(the sampled ids, their probabilities, the token-level mapping, the stop rule's
confidence) into per-request drafts. The same stop rules apply whether the host reads
each position as it is drafted (CPU) or all positions once at the end (accelerators):
a request stops after a text-less draft token, after an absent one (``union``), or once
its own token's probability drops below ``draft_stop_prob``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from vllm_hetero_spec.drafter.messages import DraftOutput
from vllm_hetero_spec.drafter.sampling import GREEDY_EPS
from vllm_hetero_spec.host_to_device import to_device
from vllm_hetero_spec.verify.draft_probs import DraftProbs

if TYPE_CHECKING:
    from vllm_hetero_spec.drafter.engine import DraftEngine
    from vllm_hetero_spec.drafter.proposals import StringLevel

# Columns of a position's packed host record.
_ID, _PROB, _TARGET, _ABSENT = 0, 1, 2, 3


def _is_prefix(live: list[int]) -> bool:
    return live == list(range(len(live)))


class DraftLoop:
    """One step's draft loop state for ``req_ids``, drafted with ``strategy`` (request
    i drafts at most ``caps[i]`` target tokens of ``budget``). Loop positions ``j`` index the rows in
    loop order; results are kept by request index ``i``."""

    def __init__(self, engine: DraftEngine, strategy: StringLevel, req_ids: list[str], caps: list[int],
                 budget: int):
        self.strategy = strategy
        self.token_level = strategy.token_level
        self.specials = engine.draft_specials
        self.stop_prob = engine.settings.draft_stop_prob
        self.n_draft = engine.intersection.draft_to_target.numel()
        self.support = engine.intersection.support
        steps = [strategy.draft_steps(c) for c in caps]
        self.order = sorted(range(len(req_ids)), key=lambda i: -steps[i])
        self.steps = [steps[i] for i in self.order]
        self.states = [engine.states[req_ids[i]] for i in self.order]
        n = len(req_ids)
        self.drafts: list[list[int]] = [[] for _ in range(n)]
        self.proposals: list[list[int]] = [[] for _ in range(n)]
        self.absent: list[list[bool]] = [[] for _ in range(n)]
        self.token_q: list[list[float]] = [[] for _ in range(n)]
        self.q_index: list[list[int]] = [[] for _ in range(n)]
        self.q_parts: list[torch.Tensor] = []
        self._n_q = 0
        self._done = [False] * n
        self._deferred: list[tuple[torch.Tensor, list[int], list[int]]] = []
        self._prev_live: list[int] = []
        if not n:
            return
        self.rows = engine.sampling_rows([req_ids[i] for i in self.order])
        # Greedy rows verify by argmax, so their q is never read (fsd's divergence
        # excepted): decided from the host-side settings, no sync.
        self.keeps_q = [t >= GREEDY_EPS or strategy.greedy_reads_q for t in self.rows.host[0]]
        keepers = [j for j, keep in enumerate(self.keeps_q) if keep]
        # The q-keeping rows among a prefix of the loop's rows are a prefix of these.
        self._keepers = None
        if self.token_level and 0 < len(keepers) < n:
            self._keepers = to_device(keepers, torch.long, engine.runtime.device)

    def rows_of(self, sampled: torch.Tensor, live: list[int]) -> torch.Tensor:
        """The previous position's samples ``[len(prev_live)]`` of the rows in ``live``."""
        prev = self._prev_live
        if live == prev[: len(live)]:
            return sampled.narrow(0, 0, len(live))
        where = {j: pos for pos, j in enumerate(prev)}
        return sampled.index_select(0, to_device([where[j] for j in live], torch.long, sampled.device))

    def sample(self, logits: torch.Tensor, live: list[int]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Sample one position for the rows in ``live`` from their logits ``[n, vocab]``.
        Returns the sampled draft ids ``[n]`` (on the device, the next forward's input),
        the position's packed record ``[n, C]`` for the host, and each row's q row (-1:
        none)."""
        self._prev_live = live
        prefix = _is_prefix(live)
        logits = logits.narrow(1, 0, self.n_draft)
        mapped = self.strategy.sample(logits, self.rows.head(len(live)) if prefix else self.rows.select(live))
        pick = mapped.ids.unsqueeze(1)
        cols = [mapped.ids, mapped.q.gather(1, pick).squeeze(1)]
        q_rows = [-1] * len(live)
        if self.token_level:
            cols += [mapped.target_ids, mapped.absent]
            with_q = [pos for pos, j in enumerate(live) if self.keeps_q[j]]
            if with_q:
                part = mapped.verify_q
                if len(with_q) < len(live):
                    if prefix:
                        index = self._keepers.narrow(0, 0, len(with_q))
                    else:
                        index = to_device(with_q, torch.long, part.device)
                    part = part.index_select(0, index)
                self.q_parts.append(part)
                for rank, pos in enumerate(with_q):
                    q_rows[pos] = self._n_q + rank
                self._n_q += len(with_q)
        if self.stop_prob > 0:
            confidence = self.strategy.confidence_logits(logits).softmax(dim=-1)
            cols.append(confidence.gather(1, pick).squeeze(1))
        return mapped.ids, torch.stack([c.double() for c in cols], dim=1), q_rows

    def consume(self, host: list[list[float]], live: list[int], q_rows: list[int], step: int) -> list[int]:
        """Take a position read back at once (CPU): returns the rows that draft on."""
        return [j for pos, j in enumerate(live) if self._take(j, host[pos], q_rows[pos]) and step + 1 < self.steps[j]]

    def defer(self, packed: torch.Tensor, live: list[int], q_rows: list[int]) -> None:
        """Keep a position's record on the device until :meth:`consume_deferred`."""
        self._deferred.append((packed, live, q_rows))

    def consume_deferred(self) -> None:
        """Take every deferred position, read back in one transfer, applying the stop
        rules in order; then roll each sequence's KV back to its kept draft (positions
        fed after a row's stop were drafted but are not kept)."""
        if not self._deferred:
            return
        host = torch.cat([packed for packed, _, _ in self._deferred]).cpu().tolist()
        start = 0
        for _, live, q_rows in self._deferred:
            for pos, j in enumerate(live):
                if not self._done[j] and not self._take(j, host[start + pos], q_rows[pos]):
                    self._done[j] = True
            start += len(live)
        for state in self.states:
            state.cache.truncate(len(state.draft))

    def _take(self, j: int, rec: list[float], q_row: int) -> bool:
        """Record row ``j``'s token; False when the row stops after it."""
        i = self.order[j]
        tok = int(rec[_ID])
        self.drafts[i].append(tok)
        self.token_q[i].append(rec[_PROB])
        if self.token_level:
            is_absent = bool(rec[_ABSENT])
            self.proposals[i].append(int(rec[_TARGET]))
            self.absent[i].append(is_absent)
            self.q_index[i].append(q_row)
            if is_absent:
                return False  # union: rejected for sure, so nothing after it can be accepted
        if tok in self.specials:
            return False
        self.states[j].draft.append_drafted(tok)
        return not (self.stop_prob > 0 and rec[-1] < self.stop_prob)

    def output(self) -> DraftOutput:
        if not self.token_level:
            return DraftOutput(self.drafts, self.token_q, self.absent)
        q = DraftProbs(torch.cat(self.q_parts), self.support) if self.q_parts else None
        return DraftOutput(self.proposals, self.token_q, self.absent, q, self.q_index if q is not None else [])
