"""``algorithm: auto``: which lossless rule each request drafts with, chosen each step.

No rule is fastest everywhere. Measured on a CPU with the 1.5B target: at T = 0 ``slem``
ran 1.61x plain at batch 1 where ``tli`` ran 1.32x, and at batch 8 ``tli`` led (0.97x
against 0.91x); at T = 1 ``tli`` ran 1.26x and ``slrs`` 0.99x. Which one wins depends on
the pair of models, the prompts, the batch and the machine, so it is measured here, on
the engine, rather than fixed.

Requests are split by their sampling into two kinds, greedy (T = 0) and sampled, each
with its own candidate rules (``auto_greedy``, ``auto_sampled``). Within a kind, every
request of a step drafts with the kind's current rule, and the rule is kept for a
*block* of ``block`` informative steps (steps that drafted, and were steady: nobody
joined, nobody prefilled). A block's measure is the tokens the kind's rows emitted per
second of those steps. Each candidate first gets ``trials`` blocks, in the order listed
(only one when its first fell more than ``decisive`` behind the best: measured on the
1.5B target at T = 0, ``tli``'s first blocks ran 5.0 tok/s against ``slem``'s 7.1, and a
second trial would only have repeated the loss); then the best (an exponentially weighted mean of its blocks) runs, and every
``recheck_every`` blocks the candidate measured longest ago runs one block, so the
choice follows a change of workload. Comparing blocks of the same kind in the same
engine compares rules under the same mix of everything else.

The choice is made before drafting and never looks at a draft, so each request is
verified exactly as its rule alone would verify it: every candidate is lossless, so
the mix is.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from vllm_hetero_spec.drafter.sampling import GREEDY_EPS

GREEDY, SAMPLED = "greedy", "sampled"


@dataclass
class _Arm:
    """One candidate rule of one kind: its block rates' weighted mean, how many blocks
    it has run, and the kind's block count when it last ran one."""

    rate: float = 0.0
    blocks: int = 0
    last: int = -1


@dataclass
class _Kind:
    """One kind of request (greedy or sampled): its candidates and the block running."""

    candidates: tuple[str, ...]
    arms: dict[str, _Arm] = field(default_factory=dict)
    current: str = ""
    blocks: int = 0
    steps: int = 0
    tokens: float = 0.0
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self.arms = {rule: _Arm() for rule in self.candidates}
        self.current = self.candidates[0]


@dataclass
class _Step:
    """The last step as planned: its rows, each row's kind and draft length, its start."""

    req_ids: list[str]
    kinds: list[str]
    proposed: list[int]
    start: float


class RuleChooser:
    """Chooses each request's rule per step (see the module docstring).

    Per step the proposer calls :meth:`observe` (what the last step showed), then
    :meth:`choose` (the rule per row), then :meth:`record` (what was proposed)."""

    def __init__(self, greedy: tuple[str, ...], sampled: tuple[str, ...], *, block: int = 8, trials: int = 2,
                 recheck_every: int = 16, memory: float = 0.7, decisive: float = 0.25):
        self.kinds = {GREEDY: _Kind(tuple(greedy)), SAMPLED: _Kind(tuple(sampled))}
        self.block = block
        self.trials = trials
        self.recheck_every = recheck_every
        self.memory = memory
        self.decisive = decisive
        self.chosen: Counter[str] = Counter()  # drafted request-steps per rule
        self._last: _Step | None = None
        self._start = 0.0

    @staticmethod
    def kind_of(temperature: float) -> str:
        return GREEDY if temperature < GREEDY_EPS else SAMPLED

    def observe(self, now: float, req_ids: list[str], sampled: list[int]) -> None:
        """Learn from the step that just ran: ``sampled[i]`` tokens came out for row
        ``req_ids[i]`` (0 while it is still prefilling); ``now``: this step's start."""
        self._start = now
        last, self._last = self._last, None
        if last is None or not set(req_ids) <= set(last.req_ids) or any(s <= 0 for s in sampled):
            return
        seconds = now - last.start
        if seconds <= 0:
            return
        emitted = dict(zip(req_ids, sampled))
        for name, kind in self.kinds.items():
            rows = [i for i, k in enumerate(last.kinds) if k == name]
            if not any(last.proposed[i] > 0 for i in rows):
                continue  # nothing drafted: the step says nothing about the rule
            kind.steps += 1
            kind.tokens += sum(emitted.get(last.req_ids[i], 0) for i in rows)
            kind.seconds += seconds
            if kind.steps >= self.block:
                self._end_block(kind)

    def choose(self, temperatures: list[float]) -> list[str]:
        """The rule of each row, from its temperature."""
        return [self.kinds[self.kind_of(t)].current for t in temperatures]

    def record(self, req_ids: list[str], temperatures: list[float], rules: list[str], proposed: list[int]) -> None:
        """What this step proposed per row (0: none), and with which rule."""
        self._last = _Step(list(req_ids), [self.kind_of(t) for t in temperatures], list(proposed), self._start)
        self.chosen.update(rule for rule, k in zip(rules, proposed) if k > 0)

    def rates(self) -> dict[str, dict[str, float]]:
        """Per kind, each measured rule's tokens per second (for logs and benchmarks)."""
        return {name: {r: a.rate for r, a in kind.arms.items() if a.blocks} for name, kind in self.kinds.items()}

    def _end_block(self, kind: _Kind) -> None:
        arm = kind.arms[kind.current]
        rate = kind.tokens / kind.seconds
        arm.rate = rate if arm.blocks == 0 else self.memory * arm.rate + (1 - self.memory) * rate
        arm.blocks += 1
        arm.last = kind.blocks
        kind.blocks += 1
        kind.steps, kind.tokens, kind.seconds = 0, 0.0, 0.0
        kind.current = self._next(kind)

    def _next(self, kind: _Kind) -> str:
        measured = [a.rate for a in kind.arms.values() if a.blocks]
        bar = max(measured, default=0.0) / (1 + self.decisive)
        # A candidate whose first block fell far behind the best is not tried again
        # until a recheck: a second trial there would only repeat the loss.
        untried = [r for r in kind.candidates
                   if kind.arms[r].blocks < self.trials and not (kind.arms[r].blocks and kind.arms[r].rate < bar)]
        if untried:
            return min(untried, key=lambda r: kind.arms[r].blocks)
        best = max(kind.candidates, key=lambda r: kind.arms[r].rate)
        others = [r for r in kind.candidates if r != best]
        if others and kind.blocks % self.recheck_every == 0:
            return min(others, key=lambda r: kind.arms[r].last)
        return best
