"""What a step costs, learnt online: the target's step time as a curve of the tokens it
runs (:class:`TargetCost`), and the proposer's time as a linear fit of its work
(:class:`DraftCost`).

Both let old evidence fade, so they follow a machine whose speed drifts, and both are
pure: :class:`~vllm_hetero_spec.policy.budget.AdaptiveBudget` feeds them the steady
steps it times and reads their prices when it weighs each draft length.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class LinearFit:
    """y = c0 + c . x by exponentially weighted least squares, with a weak ridge towards
    zero so that too few distinct points still give an answer.

    ``intercept=False`` drops c0 (the caller's features carry it); ``nonnegative`` keeps
    every coefficient >= 0, for a cost made of parts none of which can be negative. That
    bound is what lets a fit forget: forgetting scales all evidence alike, so a direction
    the recent steps do not vary keeps what old steps said of it for as long as nothing
    new contradicts them, and a bound that binds is such a contradiction."""

    def __init__(self, memory: float, features: int = 1, ridge: float = 1e-6, *, intercept: bool = True,
                 nonnegative: bool = False):
        self.memory = memory
        self.ridge = ridge
        self.intercept = intercept
        self.nonnegative = nonnegative
        size = features + intercept
        self.xtx = np.zeros((size, size))
        self.xty = np.zeros(size)
        self.n = 0.0
        self._coef: np.ndarray | None = None  # solved once per sample, read every step

    def _row(self, x: float | Sequence[float]) -> np.ndarray:
        v = np.atleast_1d(np.asarray(x, dtype=np.float64))
        return np.concatenate([[1.0], v]) if self.intercept else v

    def add(self, x: float | Sequence[float], y: float) -> None:
        v = self._row(x)
        self.xtx = self.memory * self.xtx + np.outer(v, v)
        self.xty = self.memory * self.xty + v * y
        self.n = self.memory * self.n + 1.0
        self._coef = None

    @property
    def coef(self) -> np.ndarray:
        """(c0, c1, ...), or (c1, ...) without an intercept."""
        if self._coef is None:
            gram = self.xtx + self.ridge * np.diag(np.maximum(np.diag(self.xtx), 1.0))
            self._coef = _nonnegative_solve(gram, self.xty) if self.nonnegative else np.linalg.solve(gram, self.xty)
        return self._coef

    def predict(self, x: float | Sequence[float]) -> float:
        return float(self.coef @ self._row(x))

    def fade(self, factor: float) -> None:
        """Weigh every sample so far by ``factor`` more."""
        self.xtx = factor * self.xtx
        self.xty = factor * self.xty
        self.n = factor * self.n
        self._coef = None

    def widen(self) -> None:
        """One more feature, zero in every sample so far."""
        self.xtx = np.pad(self.xtx, ((0, 1), (0, 1)))
        self.xty = np.pad(self.xty, (0, 1))
        self._coef = None


class DraftCost:
    """Proposer seconds ~ c_key + c . x for the sets of rules (keys) of one cost group:
    one fixed cost per key, the slopes shared. ``auto`` drafts at batch 1 nearly always
    at k = 1, where a per-key fit cannot tell the cost of a token from the fixed cost:
    fitted apart, slem came out far dearer per token than tli though both cost one forward
    per token, and the dear-looking slem stayed at k = 1. Sharing the slope lets every key's
    steps at any k inform it. A set with ``slrs`` is a group of its own (the budget's ``_cost_group``):
    its psi tree costs several forwards per position, and a fit shared with it made the
    others look so dear that the budget stopped drafting, which a step at k = 0 never
    corrects. A key not yet timed is priced at the first key's fixed cost.

    Every part is >= 0 (a fixed cost, a cost per token, per token and row, per token
    caught up on). Unbounded, one slow step did lasting harm: a one-time cost on a k = 2
    step among k = 1 steps was read as a steep cost per token with a negative fixed cost,
    the budget then drafted only k = 1, and steps that all run k = 1 cannot move the split
    between the two, so k >= 2 stayed priced out for the rest of the run. Bounded, the
    k = 1 steps pin the cost per token at most at their own cost, and the slow step
    fades (``tests/policy/test_compared_drafting.py::test_a_one_time_cost_does_not_hold_k_at_1``).
    Evidence: docs/algorithms.md#auto ("With the budget")."""

    def __init__(self, memory: float, features: int, evidence: float = 3.0, stale_after: int = 100):
        self.keys: list[str] = []
        self.fit = LinearFit(memory, features, intercept=False, nonnegative=True)
        self.evidence = evidence  # the weight of recent steps a key's price needs to count as known
        self.stale_after = stale_after  # the budget's steps after which a key's price is stale
        self.seen_at: dict[str, int] = {}  # per key: the budget's step count when it was last timed

    @property
    def n(self) -> float:
        return self.fit.n

    def priced(self, key: str, step: int) -> bool:
        """Whether ``key``'s price rests on enough steps of its own, recent ones. One that
        does not is worth a probe: a price set too high stops the budget drafting with
        the key, and then no step corrects it (``tests/policy/test_budget.py::
        test_follows_the_drafter_back_after_a_slow_patch``)."""
        if key not in self.keys or step - self.seen_at[key] > self.stale_after:
            return False
        column = len(self.fit.xtx) - len(self.keys) + self.keys.index(key)
        return self.fit.xtx[column, column] >= self.evidence  # the key's samples, each weighed as the fit does

    def add(self, key: str, x: Sequence[float], y: float, step: int = 0) -> None:
        """One timed step; ``step``: the budget's step count (for :meth:`priced`).

        A step that costs under half its price shows the evidence behind that price to be
        inflated -- a one-time cost only ever adds (a first sampled draft took 557 ms
        where later ones took about 150) -- so that evidence is faded to half a step's
        weight before the step counts. Without it, the steps of a run's first seconds,
        one-time costs and all, outweighed the few cheaper ones that came next, and the
        price stayed high for as long as it kept the budget from drafting."""
        self.seen_at[key] = step
        if key not in self.keys:
            self.keys.append(key)
            self.fit.widen()
        elif self.fit.n > 0.5 and y < 0.5 * self.predict(key, x):
            self.fit.fade(0.5 / self.fit.n)
        self.fit.add([*x, *self._indicators(key)], y)

    def predict(self, key: str, x: Sequence[float]) -> float:
        return self.fit.predict([*x, *self._indicators(key if key in self.keys else self.keys[0])])

    def _indicators(self, key: str) -> list[float]:
        return [float(key == other) for other in self.keys]


class Ema:
    """An exponentially weighted mean (``None`` until the first sample). A sample above
    twice the mean counts as twice the mean: one stall (a collection, a neighbour's
    burst) must not make a choice look bad for the next dozen steps."""

    def __init__(self, memory: float):
        self.memory = memory
        self.value: float | None = None

    def add(self, y: float) -> None:
        if self.value is None:
            self.value = y
        else:
            self.value = self.memory * self.value + (1 - self.memory) * min(y, 2 * self.value)


class TargetCost:
    """The target's step time (everything but proposing) as a function of the tokens the
    step runs, rows + proposals -- one curve for plain and speculative steps and for
    every batch size.

    One curve, because the target's forward sees tokens, not requests: plain steps and
    speculative steps of any batch size fall on one curve of the tokens run
    (docs/algorithms.md#draft-length). So what one batch size showed prices every
    other: a batch size seen for the first time needs no warm-up of its own, and never
    borrows the costs of another regime (a batch of 32 once verified k = 8 on costs
    measured at batch 1).

    A size priced from steps of its own is priced at their mean, even where that breaks
    the rise: a CPU's curve need not rise (oneDNN picks its kernels per shape, and a
    2-token step can cost more than a 5-token one). A fit forced to rise priced the
    cheap longer sizes above their cost, and a size priced too high is one the policy
    seldom runs, so its price is seldom corrected; a price too low by noise is run, and
    so corrected. Between sizes the prices are interpolated. Beyond the largest size the
    curve rises with the steeper of the last segment and the secant from the smallest
    size, both taken on the closest non-decreasing fit of the prices, so a flat stretch
    of memory-bound sizes is not extrapolated into a compute-bound batch; below the
    smallest it stays at the smallest size's price.

    A size is priced from its second step on: the first time a step runs a token count
    it may pay one-time costs (on a CPU, oneDNN builds its matmul kernels per shape, so a
    first step can cost far more than its neighbours'). Averaged in, that one sample kept
    k = 3 and 4 priced out for a whole run -- a size the policy finds dear is seldom run
    again, so its price is seldom corrected. So the first sample waits, and the second
    starts the size's mean at the lower of the two (a one-time cost only ever adds); until
    then the curve passes the size by, interpolating its neighbours (during the warm-up,
    until two sizes have a second step, first steps stand in). The simulated effect is
    ``tests/policy/test_budget.py::test_a_shape_s_first_step_does_not_price_it``.

    A size not run for ``stale_after`` steps comes back at the lower of its old price and
    its new step (:meth:`add`), and counts as unpriced meanwhile (:meth:`priced`), which
    makes it worth a probe: a price set too high by a slow patch is never corrected by
    a policy that avoids the size for it. Meanwhile it is priced at the lower of its old
    price and what the fresh sizes around it say (their interpolation), so the plan itself
    may run it again: on the 1.5B target at T = 1 a 3-token step stayed priced at 858 ms
    where fixed k = 2 ran them at about 740, and probes alone, drawn to other lengths,
    left the budget at k = 1 for the whole run.

    The curve is a shape times a level. The machine's speed drifts (a shared CPU's plain
    steps move within minutes), and drift moves every size at once, so
    one level follows it from every step (``memory``), whatever size the step ran, while
    each size keeps its cost in units of the level, averaged slowly (``shape_memory``).
    With a mean per size alone, a size the policy stopped running kept the price of the
    moment it stopped, and the policy switched when noise made one size look cheap: each
    estimate was read at its most favourable, and `tli` ran below plain decoding
    (docs/benchmarks.md#qwen25-coder-05b-at-t--1-a-price-per-size-went-stale)."""

    def __init__(self, memory: float, shape_memory: float = 0.97, stale_after: int = 100):
        self.shape_memory = shape_memory
        self.stale_after = stale_after  # steps after which a size's price is stale
        self.samples = 0  # steps timed
        self.seen_at: dict[int, int] = {}  # per size: the step count when it last ran
        # Seconds per unit of the shape, now: a mean of what each step says of it (a step's
        # seconds over its size's cost in units), so a stall counts as twice, as in Ema.
        self.level = Ema(memory)
        self.level.value = 1.0
        self.by_size: dict[int, Ema] = {}  # per size: its cost in units of the level
        self.first: dict[int, float] = {}  # sizes seen once: their first step's cost, in units of the level
        # (sizes, their prices, the slope beyond the largest): fitted once per sample, read every step
        self._fit: tuple[list[int], np.ndarray, float] | None = None

    def add(self, tokens: int, seconds: float) -> None:
        mean = self.by_size.get(tokens)
        stale = self.samples - self.seen_at.get(tokens, self.samples) > self.stale_after
        self.samples += 1
        self.seen_at[tokens] = self.samples
        if mean is not None and stale:
            # Back after a long gap: the lower of its old price and this step. A price
            # too high is the one that lasts -- the policy stops running the size, so
            # nothing corrects it -- while one too low is run, and so corrected.
            mean.value = min(float(mean.value), seconds / self.level.value)
        elif mean is not None:
            self.level.add(seconds / max(mean.value, 1e-12))
            mean.add(seconds / self.level.value)
        elif tokens in self.first:
            self.by_size[tokens] = Ema(self.shape_memory)
            self.by_size[tokens].add(min(self.first.pop(tokens), seconds / self.level.value))
        else:
            self.first[tokens] = seconds / self.level.value
        self._fit = None

    def priced(self, tokens: int) -> bool:
        """Whether a size has a price from steps of its own, recent ones."""
        return tokens in self.by_size and self.samples - self.seen_at[tokens] <= self.stale_after

    @property
    def sizes(self) -> int:
        """The sizes seen, those seen once included (the warm-up needs a curve at once)."""
        return len(self.by_size) + len(self.first)

    def predict(self, tokens: float) -> float:
        if self._fit is None:
            known = {t: float(e.value) for t, e in self.by_size.items()}
            fresh = sorted(t for t in known if self.priced(t))
            if len(fresh) >= 2:  # a stale size at the lower of its price and its fresh neighbours'
                between = np.interp(list(known), fresh, [known[t] for t in fresh])
                known = {t: min(known[t], float(v)) for t, v in zip(known, between)}
            standing_in = len(known) < 2
            if standing_in:
                known = {**self.first, **known}
            sizes = sorted(known)
            fit = _monotone([known[t] for t in sizes])
            # First steps standing in are priced on the fit: they may carry one-time costs.
            values = fit if standing_in else np.array([known[t] for t in sizes])
            slope = 0.0
            if len(sizes) > 1:
                slope = max((fit[-1] - fit[-2]) / (sizes[-1] - sizes[-2]), (fit[-1] - fit[0]) / (sizes[-1] - sizes[0]))
            self._fit = sizes, values, slope
        sizes, values, slope = self._fit
        if tokens <= sizes[-1]:
            return self.level.value * float(np.interp(tokens, sizes, values))
        return self.level.value * float(values[-1] + slope * (tokens - sizes[-1]))

    def slope(self, low: float, high: float) -> float:
        """Seconds per extra token between ``low`` and ``high`` tokens (>= 0)."""
        return max(self.predict(high) - self.predict(low), 0.0) / max(high - low, 1.0)


def _monotone(values: list[float]) -> np.ndarray:
    """The closest non-decreasing sequence in least squares (pool adjacent violators):
    a run that dips is replaced by its mean."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return np.concatenate([np.full(int(n), m) for m, n in blocks])


def _nonnegative_solve(gram: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """argmin c'Gc / 2 - r'c over c >= 0, for a positive definite G (Lawson and Hanson's
    active set, on the normal equations): the few coefficients of a cost fit, once per step."""
    size = len(rhs)
    free = np.zeros(size, dtype=bool)
    coef = np.zeros(size)
    for _ in range(3 * size):
        gradient = rhs - gram @ coef
        gradient[free] = -np.inf
        if gradient.max() <= 1e-12 * max(np.abs(rhs).max(), 1e-300):
            break
        free[int(gradient.argmax())] = True
        while True:
            trial = np.zeros(size)
            trial[free] = np.linalg.solve(gram[np.ix_(free, free)], rhs[free])
            if (trial[free] > 0).all():
                coef = trial
                break
            # Step from coef towards trial until the first free coefficient reaches 0, and bind it.
            falling = free & (trial <= 0)
            step = np.min(coef[falling] / (coef[falling] - trial[falling]))
            coef = coef + step * (trial - coef)
            free &= coef > 1e-15
            coef[~free] = 0.0
    return coef
