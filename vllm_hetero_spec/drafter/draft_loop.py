"""One step's packed draft loop, shared by every rule: :func:`run_draft_loop`.

:class:`DraftLoop` keeps the rows in the order the loop runs them (longest step count first), samples
each position through the algorithm's draft rule, and turns what comes back to the host
(the sampled ids, their probabilities, the token-level mapping, the stop rule's
confidence) into per-request drafts. The same stop rules apply whether the host reads
each position as it is drafted (CPU) or all positions once at the end (accelerators):
a request stops after a text-less draft token, after an absent one (``union``), or once
its own token's probability drops below ``draft_stop_prob``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vllm_hetero_spec.drafter.context import DraftContext
from vllm_hetero_spec.drafter.messages import DraftOutput
from vllm_hetero_spec.drafter.request_state import RequestState
from vllm_hetero_spec.drafter.sampling import GREEDY_EPS
from vllm_hetero_spec.drafter.rules.base import DraftRule
from vllm_hetero_spec.host_to_device import to_device
from vllm_hetero_spec.verify.draft_probs import DraftProbs

# Columns of a position's packed host record.
_ID, _PROB, _TARGET, _ABSENT = 0, 1, 2, 3


def _is_prefix(live: list[int]) -> bool:
    return live == list(range(len(live)))


class DraftLoop:
    """One step's draft loop state for ``states``, drafted with ``draft rule`` (request
    i drafts at most ``caps[i]`` target tokens of ``budget``). Loop positions ``j`` index the rows in
    loop order; results are kept by request index ``i``."""

    def __init__(self, ctx: DraftContext, draft_rule: DraftRule, states: list[RequestState], caps: list[int],
                 budget: int):
        self.draft_rule = draft_rule
        self.token_level = draft_rule.token_level
        self.specials = ctx.draft_specials
        self.stop_prob = ctx.settings.draft_stop_prob
        self.n_draft = ctx.intersection.draft_to_target.numel()
        self.support = ctx.intersection.support
        steps = [draft_rule.draft_steps(c) for c in caps]
        self.order = sorted(range(len(states)), key=lambda i: -steps[i])
        self.steps = [steps[i] for i in self.order]
        self.states = [states[i] for i in self.order]
        n = len(states)
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
        self.rows = ctx.sampling_rows(self.states)
        # Greedy rows verify by argmax, so their q is never read (fsd's divergence
        # excepted): decided from the host-side settings, no sync.
        self.keeps_q = [t >= GREEDY_EPS or draft_rule.greedy_reads_q for t in self.rows.host[0]]
        keepers = [j for j, keep in enumerate(self.keeps_q) if keep]
        # The q-keeping rows among a prefix of the loop's rows are a prefix of these.
        self._keepers = None
        if self.token_level and 0 < len(keepers) < n:
            self._keepers = to_device(keepers, torch.long, ctx.device)

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
        mapped = self.draft_rule.sample(logits, self.rows.head(len(live)) if prefix else self.rows.select(live))
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
            confidence = self.draft_rule.confidence_logits(logits).softmax(dim=-1)
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


def run_draft_loop(
    ctx: DraftContext, draft_rule: DraftRule, states: list[RequestState], budget: int, caps: list[int], defer: bool,
    stop: Callable[[], bool] | None = None,
) -> DraftOutput:
    """Run the packed draft loop: per request the proposals (draft ids for slem and
    dtw, target ids for the token-level algorithms), each token's probability under
    the distribution it was sampled from, and for the token-level algorithms the q
    rows verification reads (compact, on the drafter's device: see
    ``verify/draft_probs.py``) and which proposals the target lacks (union). Request
    i drafts for at most ``caps[i]`` target tokens (each at most ``budget``).

    Each position's samples feed the next forward on the device. Rows run in order
    of their step count, longest first, so the rows still drafting at a position
    are a prefix of the previous position's: the hand-over is a slice, with no
    index from the host. What the host needs (the ids for the bridge, the stop
    rules) comes back once per step when ``defer`` (an accelerator, where each read
    would stall the loop): every row drafts its full length and the stop rules cut
    the drafts afterwards. On the CPU a read costs nothing, so it happens every
    position and a row that stops leaves the batch at once. ``stop`` ends the loop
    early (shorter drafts are still valid drafts)."""
    loop = DraftLoop(ctx, draft_rule, states, caps, budget)
    if not states:
        return loop.output()
    n_steps = draft_rule.draft_steps(budget)
    live = list(range(len(states)))
    sampled: torch.Tensor | None = None
    for step in range(n_steps):
        caches = [loop.states[j].cache for j in live]
        if step == 0:
            logits = ctx.runtime.forward(caches, [s.pending() for s in loop.states])
        else:
            logits = ctx.runtime.forward_next(caches, loop.rows_of(sampled, live), step)
        ctx.stats.draft_forwards += 1
        sampled, packed, q_rows = loop.sample(logits, live)
        if defer:
            loop.defer(packed, live, q_rows)
            live = [j for j in live if step + 1 < loop.steps[j]]
        else:
            live = loop.consume(packed.cpu().tolist(), live, q_rows, step)
        if not live or (stop is not None and stop()):
            break
    loop.consume_deferred()
    return loop.output()
