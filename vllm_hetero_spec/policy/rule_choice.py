"""``algorithm: auto``: which lossless rule each request drafts with, chosen each step.

No rule is fastest everywhere: the same pair of models can favour ``slem`` at batch 1 and
``tli`` at batch 8, or ``tli`` at T = 1 (docs/algorithms.md#auto). Which one wins depends on
the pair of models, the prompts, the batch and the machine, so it is measured here, on
the engine, rather than fixed.

Requests are split by their sampling into two kinds, greedy (T = 0) and sampled, each
with its own candidate rules (``auto_greedy``, ``auto_sampled``). Within a kind, every
request of a step drafts with the same rule. A kind alternates between two phases:

- **Compare.** The candidates take turns of two *informative* steps (steady steps:
  nobody joined, nobody prefilled; drafted or not, since a rule the draft budget will
  not draft with runs at plain speed, and that is its measure). Only a turn's second
  step is counted: the first pays the draft states' catch-up on what the rule before
  left (``tli``'s restricted tokens are re-tokenized for the drafter after a step), and
  counted, that debt made ``slem`` look slower than ``tli`` in most comparisons at T = 0,
  where ``slem`` alone is faster. The comparison ends when each rule has
  ``window`` counted steps -- or, from ``min_steps`` each, as soon as every challenger
  either trails the incumbent (the rule running, at first the first listed) by more
  than ``futility`` standard errors or leads it by more than a switch needs (below): a
  comparison runs half its steps on the slower rule and pays a catch-up at every turn,
  and a batch-1 job of a few hundred steps may otherwise be mostly comparison, spending
  much of its drafting on the slower rule
  (docs/benchmarks.md#the-defaults-matrix). Taking
  turns step by step compares the rules on the same stretch of text: a first version ran
  each rule for blocks of 8 steps, and the blocks' texts differed more than the rules did,
  so one run settled on the slower rule (docs/algorithms.md#auto, "Why turns").
  Before a challenger's turn the draft budget is asked whether it would draft with it.
  If it would not, the turn is declined and the next rule's begins: that turn would
  run at plain speed, which the budget already ranks below the incumbent's (it drafts
  only where that beats plain), so it tells nothing of the rule and costs what plain
  decoding does (at batch 1, T = 1 the budget left ``slrs``'s turns undrafted, and
  ``auto`` ran several times the undrafted steps of ``tli`` alone). A challenger declined
  ``min_steps`` times leaves the comparison; it is asked again at the next one, when its
  acceptance counts have faded towards the prior.
- **Run.** The fastest -- tokens the kind's rows emitted per second of its steps, pooled
  over the comparison, weighed with the earlier comparisons' -- runs for
  ``run_steps`` informative steps; then the kind compares again, so the choice follows
  a change of workload. A challenger replaces the incumbent only when it leads by more
  than ``switch_margin`` *and* by more than ``confidence`` standard errors of the
  comparison itself. At batch 1 the tokens a step emits swing from 1 to k + 1, so a few
  dozen steps resolve a difference of the size that separates the rules only roughly:
  with a fixed margin alone, comparisons put ``tli`` ahead where ``slem`` alone then ran
  faster than ``auto`` (docs/algorithms.md#auto). The listed order is
  the measured prior (``slem`` for greedy requests, ``tli`` for sampled ones), so a
  call inside the noise keeps it; a larger batch sums its rows' tokens per step, swings
  less, and resolves finer differences.

The choice is made before drafting and never looks at a draft, so each request is
verified exactly as its rule alone would verify it: every candidate is lossless, so
the mix is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from math import hypot, sqrt

from vllm_hetero_spec.drafter.sampling import GREEDY_EPS

GREEDY, SAMPLED = "greedy", "sampled"
#: The kind of a row whose request named its rule: no kind's comparison counts it.
PINNED = "pinned"


@dataclass
class _Tally:
    """The counted steps of one rule in one comparison: tokens emitted and seconds each."""

    per_step: list[tuple[float, float]] = field(default_factory=list)  # (tokens, seconds)

    @property
    def steps(self) -> int:
        return len(self.per_step)

    @property
    def rate(self) -> float:
        """Tokens per second over the steps (a ratio of sums: long steps weigh more)."""
        seconds = sum(s for _, s in self.per_step)
        return sum(t for t, _ in self.per_step) / seconds if seconds > 0 else 0.0

    @property
    def noise(self) -> float:
        """The rate's relative standard error (the ratio estimator's, by the delta
        method); 0 below two steps, where there is nothing to estimate it from."""
        n, rate = self.steps, self.rate
        if n < 2 or rate <= 0:
            return 0.0
        mean_seconds = sum(s for _, s in self.per_step) / n
        spread = sum((t - rate * s) ** 2 for t, s in self.per_step) / (n - 1)
        return sqrt(spread / n) / mean_seconds / rate


@dataclass
class _Kind:
    """One kind of request (greedy or sampled): its candidates and where it stands."""

    candidates: tuple[str, ...]
    rates: dict[str, float] = field(default_factory=dict)  # rule -> weighed rate over comparisons
    noise: dict[str, float] = field(default_factory=dict)  # rule -> that rate's relative standard error
    tallies: dict[str, _Tally] = field(default_factory=dict)  # the comparison running
    declined: Counter[str] = field(default_factory=Counter)  # turns the budget would not draft, this comparison
    comparing: bool = True
    turn: int = 0
    best: str = ""
    ran: int = 0  # informative steps since the last comparison ended

    def __post_init__(self) -> None:
        self.best = self.candidates[0]
        self.tallies = {rule: _Tally() for rule in self.candidates}

    @property
    def current(self) -> str:
        """The rule the kind's rows draft with next."""
        if self.comparing and len(self.candidates) > 1:
            return self.candidates[self.turn // 2 % len(self.candidates)]
        return self.best

    def out(self, min_steps: int) -> set[str]:
        """The challengers that left this comparison, declined ``min_steps`` times."""
        return {rule for rule, n in self.declined.items() if n >= min_steps}


@dataclass
class _Step:
    """The last step as planned: its rows, each row's kind, rule and draft length, its start."""

    req_ids: list[str]
    kinds: list[str]
    rules: list[str]
    proposed: list[int]
    start: float


class RuleChooser:
    """Chooses each request's rule per step (see the module docstring).

    Per step the proposer calls :meth:`observe` (what the last step showed), then
    :meth:`choose` (the rule per row), then :meth:`record` (what was proposed)."""

    def __init__(self, greedy: tuple[str, ...], sampled: tuple[str, ...], *, window: int = 24, min_steps: int = 10,
                 switch_margin: float = 0.1, confidence: float = 2.0, futility: float = 1.0, run_steps: int = 512,
                 memory: float = 0.5):
        self.kinds = {GREEDY: _Kind(tuple(greedy)), SAMPLED: _Kind(tuple(sampled))}
        self.window = window
        self.min_steps = min_steps
        self.switch_margin = switch_margin
        self.confidence = confidence
        self.futility = futility
        self.run_steps = run_steps
        self.memory = memory
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
            if not rows:
                continue
            # A step the budget left undrafted counts too: a rule the budget will not
            # draft with runs at plain speed, and that is its measure. (Skipping such
            # steps stalled a comparison on slrs's turn for dozens of plain steps.)
            tokens = sum(emitted.get(last.req_ids[i], 0) for i in rows)
            self._learn(kind, last.rules[rows[0]], tokens, seconds)

    def choose(self, temperatures: list[float], drafts: Callable[[list[str]], bool] | None = None) -> list[str]:
        """The rule of each row, from its temperature. ``drafts(rules)``: whether the draft
        budget would draft this step with those rules; a challenger's turn it would not
        draft is declined (see the module docstring)."""
        kinds = [self.kind_of(t) for t in temperatures]
        rules = [self.kinds[k].current for k in kinds]
        if drafts is None:
            return rules
        for name in dict.fromkeys(kinds):
            kind = self.kinds[name]
            for _ in range(len(kind.candidates) - 1):
                challenger = kind.comparing and kind.turn % 2 == 0 and kind.current != kind.best
                if not challenger or (kind.current not in kind.out(self.min_steps) and drafts(rules)):
                    break
                self._decline(kind)
                rules = [self.kinds[k].current for k in kinds]
        return rules

    def record(self, req_ids: list[str], temperatures: list[float], rules: list[str], proposed: list[int],
               pinned: list[bool] | None = None) -> None:
        """What this step proposed per row (0: none), and with which rule. ``pinned``
        rows drafted with a rule their request named: counted in :attr:`chosen`, but
        left out of the comparison, which measures the rules this chooser picked."""
        kinds = [self.kind_of(t) for t in temperatures]
        if pinned is not None:
            kinds = [PINNED if p else k for k, p in zip(kinds, pinned)]
        self._last = _Step(list(req_ids), kinds, list(rules), list(proposed), self._start)
        self.chosen.update(rule for rule, k in zip(rules, proposed) if k > 0)

    def rates(self) -> dict[str, dict[str, float]]:
        """Per kind, each compared rule's tokens per second (for logs and benchmarks)."""
        return {name: dict(kind.rates) for name, kind in self.kinds.items()}

    def _learn(self, kind: _Kind, rule: str, tokens: float, seconds: float) -> None:
        if not kind.comparing or len(kind.candidates) == 1:
            kind.ran += 1
            if kind.ran >= self.run_steps and len(kind.candidates) > 1:
                kind.comparing, kind.turn = True, 0
            return
        if kind.turn % 2:  # a turn's second step: free of the previous rule's catch-up
            kind.tallies[rule].per_step.append((tokens, seconds))
        kind.turn += 1
        if self._compared(kind):
            self._settle(kind)

    def _decline(self, kind: _Kind) -> None:
        """The budget would not draft with the challenger whose turn begins: the next
        rule's turn begins instead."""
        kind.declined[kind.current] += 1
        kind.turn += 2
        if self._compared(kind):
            self._settle(kind)

    def _compared(self, kind: _Kind) -> bool:
        """Whether the comparison running has seen enough."""
        out = kind.out(self.min_steps)
        if all(r in out for r in kind.candidates if r != kind.best):
            return True
        tallies = [t for r, t in kind.tallies.items() if r not in out]
        if all(t.steps >= self.window for t in tallies):
            return True
        if any(t.steps < self.min_steps for t in tallies):
            return False
        best = kind.tallies[kind.best]
        return all(self._decided(best, t) for r, t in kind.tallies.items() if r != kind.best and r not in out)

    def _decided(self, best: _Tally, other: _Tally) -> bool:
        """Whether more steps would hardly change the verdict between the incumbent and
        one challenger: it trails by more than ``futility`` standard errors (more steps
        would rarely lift it past the ``confidence`` it needs to switch), or it already
        leads by more than a switch needs."""
        noise = hypot(best.noise, other.noise)
        if best.rate > other.rate * (1 + self.futility * noise):
            return True
        return self._beats(other.rate, best.rate, noise)

    def _beats(self, challenger: float, incumbent: float, noise: float) -> bool:
        """Whether a challenger's rate leads enough to replace the incumbent: by more
        than ``switch_margin`` and by more than ``confidence`` times ``noise``, the
        relative standard error of their difference."""
        return challenger > incumbent * (1 + max(self.switch_margin, self.confidence * noise))

    def _settle(self, kind: _Kind) -> None:
        """End a comparison: weigh its rates into the earlier ones and run the best. A
        challenger that left it keeps its earlier rate but cannot win this time."""
        m = self.memory
        out = kind.out(self.min_steps)
        for rule, tally in kind.tallies.items():
            if rule in out or tally.steps == 0:
                continue
            if rule not in kind.rates:
                kind.rates[rule], kind.noise[rule] = tally.rate, tally.noise
            else:
                kind.rates[rule] = m * kind.rates[rule] + (1 - m) * tally.rate
                kind.noise[rule] = hypot(m * kind.noise[rule], (1 - m) * tally.noise)
        best = kind.best
        rivals = [r for r in kind.candidates if r != best and r not in out and r in kind.rates]
        if rivals and best in kind.rates:
            challenger = max(rivals, key=lambda r: kind.rates[r])
            if self._beats(kind.rates[challenger], kind.rates[best], hypot(kind.noise[challenger], kind.noise[best])):
                kind.best = challenger
        kind.tallies = {rule: _Tally() for rule in kind.candidates}
        kind.declined = Counter()
        kind.comparing, kind.ran = False, 0
