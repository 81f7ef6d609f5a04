"""How many tokens to draft this step, per request, 0 included: a cost model fitted online.

Speculation pays only when the tokens a step adds outweigh what it costs, and both move
with the batch size, the prompt mix and the machine. So each step :class:`AdaptiveBudget`
picks the k (0..``num_speculative_tokens``) that maximises expected tokens per second,

    rate(k) = sum_r E_r(k) / cost(k),     E_r(k) = 1 + sum_{j<=k} P_r(j),

from three models that let old evidence fade, so they follow change (the two costs learn only
from *steady* steps, nobody joined or prefilling, so a prefill never passes for verification):

- **acceptance**: per rule and draft position, overall and per request, each position learnt
  from the steps that judged it (:class:`~vllm_hetero_spec.policy.acceptance.PositionAcceptance`);
- **the target's step**: its time against the tokens it runs, one curve for every batch size,
  and one apart for steps that draft for sampled rows (their verification costs more);
- **drafting**: proposer time linear in k, k x rows and catch-up tokens, per set of rules
  (both costs: :mod:`~vllm_hetero_spec.policy.step_costs`).

A sampled row's rule is learnt under its own label (:func:`sampled_label`): its acceptance
and costs are not those of the same rule drafting greedily.

A draft state that has fallen behind (a new request, or one idle a while) must first read what
it missed, a lump the following steps live on, so k prices it spread over the steps the request
can be expected to run still, from the replies that ended (``horizon`` steps until some have).
Per request, a proposal past the first is kept only while its P_r(j) exceeds the tokens the
step's rate buys in the time one more verified token costs; and a k > 0 must beat k = 0 by
``margin``. Exploration: the first steps try k = 1, 0, 2, twice, then every ``explore_every`` steps
per batch-size bucket the length most likely to beat the chosen k, if any can at the bounds of
what is known of its acceptance or its step's price is a guess, only while the bucket's allowance,
fed with ``explore_share`` of each of its steps' time, covers its expected loss, so a target no drafter helps
loses little. ``fixed`` always drafts ``num_speculative_tokens``. Why each choice, with its evidence:
docs/algorithms.md#draft-length. The choice never touches verification, so every rule stays
exactly as lossless as it is at any fixed k.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from vllm_hetero_spec.policy.acceptance import PositionAcceptance
from vllm_hetero_spec.policy.reply_length import ReplyLengths
from vllm_hetero_spec.policy.step_costs import DraftCost, TargetCost
from vllm_hetero_spec.policy.step_log import is_steady

# k for the engine's first steps: small, because a long draft verified at a large batch
# can cost several plain steps, and a short run (32 tokens at batch 8 is ~30 steps) cannot
# pay that back; longer drafts are reached by the probes, one step up at a time.
_WARMUP = (1, 0, 2)


# The mark of a sampled row's rule in the labels the budget keys its estimates by
# (:func:`sampled_label`).
SAMPLED = "@sampled"


def sampled_label(rule: str) -> str:
    """The label a sampled row's ``rule`` is learnt under. A sampled row's drafts are
    judged by rejection sampling and carry q rows (the drafter's distribution over the
    target's vocabulary), so its acceptance and its costs are not a greedy row's: priced
    alike, a rule's greedy steps at batch 8 made its sampled drafts look worth paying
    for where they ran far below plain decoding (docs/benchmarks.md#batch-8-probes-and-sampled-steps)."""
    return rule + SAMPLED


def _is_sampled(key: str) -> bool:
    """Whether a set of rules drafting together (a key) has a sampled row."""
    return SAMPLED in key


def _greedy_kin(label: str) -> str | None:
    """The label a sampled row's rule leans on while its own verdicts are few: the same
    rule drafting greedily (:class:`PositionAcceptance`'s ``kin``)."""
    return label.removesuffix(SAMPLED) if _is_sampled(label) else None


def _cost_group(key: str, forward_rules: frozenset[str]) -> str:
    """The fit a set of rules drafting together is priced by: ``"forwards"`` when every
    rule drafts by the drafter's forwards alone, one per draft token, so a token costs
    them the same (and for an engine's one rule, ``""``), else its own; a set with a
    sampled row in a group apart, since its q rows add to each token's cost."""
    rules = {label.removesuffix(SAMPLED) for label in key.split("+")}
    if rules <= forward_rules | {""}:
        return "forwards" + (SAMPLED if _is_sampled(key) else "")
    return key


@dataclass
class _Bucket:
    """Exploration bookkeeping of one batch-size bucket (the costs are shared).

    Each bucket pays for its probes from its own ``allowance``, earned from its own steps:
    with one allowance for the engine, a stretch at batch 1 filled it, and the first steps
    at batch 8, where a probe costs several batch-1 steps, spent it at once: exploration
    took a share of them far above ``explore_share``."""

    steps: int = 0
    probes: int = 0
    allowance: float = 0.0  # seconds of expected loss that this bucket's probes may still spend


@dataclass
class _Expected:
    """What each k would give one step: ``rates`` [max_tokens + 1] tokens per second,
    ``gains`` [rows, max_tokens] each row's P_r(j) where it can earn it, ``reach``
    [rows, max_tokens] 1 where a row's proposal j can earn anything (it drafts, and its
    request does not end first), the drafting rows, their catch-up ``lump`` (tokens),
    the steps it is ``spread`` over, and the key of their rules."""

    rates: list[float]
    gains: np.ndarray
    reach: np.ndarray
    n_drafting: int
    lump: float
    spread: float
    key: str


@dataclass
class Exploration:
    """What exploring cost: steps planned before the costs were known (``warmup``),
    probes made and the loss the model expected of them against the chosen k (seconds),
    and probe slots skipped because no length could beat the chosen one even at the
    bounds of what its acceptance is known to be; and steps where ``auto``, comparing
    its rules, drafted one token where this budget chose none (``compared``, counted by
    :class:`~vllm_hetero_spec.policy.step_policy.StepPolicy`)."""

    warmup: int = 0
    probes: int = 0
    probe_loss_s: float = 0.0
    skipped: int = 0
    compared: int = 0


@dataclass
class _Step:
    """The last step as planned, for what the next call learns from it."""

    req_ids: list[str]
    proposed: dict[str, int]
    rules: dict[str, str]
    draft_key: str
    tokens: int
    k: int
    catchup: int
    propose_s: float
    end: float


def _steps_to_go(left: int | None, to_go: float | None, accepted: float, horizon: float) -> float:
    """The steps a row's catch-up is spread over: the tokens it can be expected to emit
    still (``to_go``, learnt; ``horizon`` steps where unknown), at most ``left``, over the
    ``1 + accepted`` tokens a step at k = 1 gives it; one at least."""
    if to_go is None:
        steps = horizon if left is None else min(horizon, left / (1.0 + accepted))
    else:
        steps = min(to_go, float("inf") if left is None else left) / (1.0 + accepted)
    return max(steps, 1.0)


def _draft_key(rules: list[str] | None, drafting: list[bool]) -> str:
    """The set of rules the drafting rows use, as a key (``""`` without ``auto``)."""
    if not rules:
        return ""
    return "+".join(sorted({rule for rule, d in zip(rules, drafting) if d}))


def bucket_of(batch: int) -> int:
    """1, 2, 3-4, 5-8, ... -> 0, 1, 2, 3, ..."""
    return max(0, int(batch - 1).bit_length())


class AdaptiveBudget:
    """Chooses each step's draft length per request (see the module docstring).

    Per step the proposer calls :meth:`observe` first (what the last step showed),
    then :meth:`plan` (the k per request), then :meth:`record` (what was proposed)."""

    def __init__(
        self,
        max_tokens: int,
        min_tokens: int = 0,
        *,
        explore_every: int = 10,
        cost_memory: float = 0.9,
        accept_memory: float = 0.97,
        stale_memory: float = 1 - 1 / 500,
        request_weight: float = 4.0,
        prior_accept: float = 0.5,
        optimism: float = 1.0,
        margin: float = 0.03,
        horizon: float = 16.0,
        explore_share: float = 0.02,
        explore_memory: float = 1 - 1 / 300,
        warmup_catchup: int = 512,
        forward_rules: frozenset[str] = frozenset(),
    ):
        if not 0 <= min_tokens <= max_tokens or max_tokens < 1:
            raise ValueError(f"need 0 <= min_tokens <= max_tokens and max_tokens >= 1, got {min_tokens}, {max_tokens}")
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.forward_rules = forward_rules
        self.explore_every = explore_every
        self.margin = margin
        self.horizon = horizon
        self.explore_share = explore_share
        self.explore_memory = explore_memory
        self.warmup_catchup = warmup_catchup
        self.accept = PositionAcceptance(max_tokens, memory=accept_memory, stale_memory=stale_memory,
                                         request_weight=request_weight, prior=prior_accept, optimism=optimism,
                                         kin=_greedy_kin)
        self.exploration = Exploration()
        self.target = TargetCost(cost_memory)  # plain steps, and drafting steps of greedy rows only
        self.sampled_target = TargetCost(cost_memory)  # plain steps, and drafting steps with a sampled row
        self.sampled_sizes: set[int] = set()  # the sizes sampled drafting steps ran
        self.cost_memory = cost_memory
        # per cost group of the sets of rules drafting: proposer seconds ~ c_key + c1 k + c2 k rows
        # + c3 catch-up tokens (see record)
        self.drafts: dict[str, DraftCost] = {}
        self.synced: dict[str, int] = {}  # per request: its length when it last drafted
        self.replies = ReplyLengths()  # how far requests in flight can be expected to go
        self.buckets: dict[int, _Bucket] = {}
        self.warmup_steps = 0
        self.chosen = Counter()  # steps per chosen k (the step's largest)
        self.steps = 0  # steps recorded
        self.last_k = max_tokens
        # Why the last plan chose what it did, its expected rate per k and its catch-up
        # lump (tokens): for the proposer's debug log (a step planned k > 0 and sent no
        # proposal, or planned k = 0, looks the same in the counters).
        self.last_plan: tuple[str, list[float], float] = ("", [], 0.0)
        self._last: _Step | None = None

    # -- learning ---------------------------------------------------------------------

    def observe(self, now: float, req_ids: list[str], sampled: list[int]) -> None:
        """Learn from the step that just ran: ``sampled[i]`` tokens came out for row
        ``req_ids[i]`` (accepted drafts + 1; 0 while it is still prefilling)."""
        self.replies.add(req_ids, sampled)
        last, self._last = self._last, None
        if last is None:
            return
        n_sampled = dict(zip(req_ids, sampled))
        verdicts = []
        for req_id, k in last.proposed.items():
            if k <= 0 or n_sampled.get(req_id, 0) <= 0:
                continue
            rule = last.rules.get(req_id, "")
            verdicts.append((req_id, rule, k, n_sampled[req_id] - 1))
        self.accept.add_step(verdicts)
        target_s = now - last.end
        bucket = self.buckets.setdefault(bucket_of(len(last.req_ids)), _Bucket())
        earned = self.explore_share * max(target_s + last.propose_s, 0.0)
        bucket.allowance = self.explore_memory * bucket.allowance + earned
        if target_s > 0 and is_steady(req_ids, last.req_ids, sampled):
            if last.k == 0 or not _is_sampled(last.draft_key):
                self.target.add(last.tokens, target_s)
            if last.k == 0 or _is_sampled(last.draft_key):
                self.sampled_target.add(last.tokens, target_s)
            if last.k > 0 and _is_sampled(last.draft_key):
                self.sampled_sizes.add(last.tokens)
            if last.k > 0:
                drafting = sum(1 for k in last.proposed.values() if k > 0)
                self._draft_cost(last.draft_key).add(last.draft_key, [last.k, last.k * drafting, last.catchup],
                                                     last.propose_s, self.steps)

    def record(self, req_ids: list[str], proposed: list[int], propose_s: float, end: float,
               lengths: list[int] | None = None, rules: list[str] | None = None) -> None:
        """What this step proposed per row (every row of the batch, 0 for none) and with
        which rule (``auto``), how long proposing took, when it ended, and each row's
        length (prompt + output): the tokens a drafting row's draft state had to catch up
        on since it last drafted (its whole context the first time) are a cost of their
        own, which must not pass for the cost of drafting k."""
        catchup = 0
        for i, (req_id, k) in enumerate(zip(req_ids, proposed)):
            if k > 0 and lengths is not None:
                catchup += self._behind(req_id, lengths[i])
                self.synced[req_id] = lengths[i]
        k = max(proposed, default=0)
        key = _draft_key(rules, [p > 0 for p in proposed])
        self._last = _Step(list(req_ids), dict(zip(req_ids, proposed)), dict(zip(req_ids, rules or ())), key,
                           len(req_ids) + sum(proposed), k, catchup, propose_s, end)
        self.chosen[k] += 1
        self.steps += 1
        self.last_k = k

    def forget(self, req_id: str) -> None:
        """A finished, aborted or preempted request."""
        self.accept.forget(req_id)
        self.synced.pop(req_id, None)
        self.replies.end(req_id)

    def _behind(self, req_id: str, length: int) -> int:
        """The tokens a request's draft state has to read before it can draft: its
        length (prompt + output) less what it had when it last drafted."""
        return length - self.synced.get(req_id, 0)

    def _draft_cost(self, key: str) -> DraftCost:
        """The fit that prices the set of rules ``key`` (``""``: the engine's one rule)."""
        group = _cost_group(key, self.forward_rules)
        if group not in self.drafts:
            self.drafts[group] = DraftCost(self.cost_memory, features=3)
        return self.drafts[group]

    def draft_seconds(self, key: str, k: int, drafting: int, catchup: float) -> float:
        """Expected proposer seconds for ``drafting`` rows of the rules ``key`` drafting k
        tokens with ``catchup`` tokens to read.

        A cost group never timed is priced at the mean of the timed groups of its kind
        (sampled or greedy), and at 0 where none is (one step times it). ``auto`` moves a
        sampled batch between tli, slrs and their mix, each a group of its own, and a
        sampled draft token costs several times a greedy one (its q row): priced at 0, each
        new set looked free for its first step, whatever the timed ones had shown."""
        x = [k, k * drafting, catchup]
        cost = self._draft_cost(key)
        if cost.n > 0:
            return max(cost.predict(key, x), 0.0)
        kin = [fit.predict(fit.keys[0], x) for group, fit in self.drafts.items()
               if fit.n > 0 and _is_sampled(group) == _is_sampled(key)]
        return max(float(np.mean(kin)), 0.0) if kin else 0.0

    def curve(self, key: str) -> TargetCost:
        """The target's step curve a step drafting with the rules ``key`` is priced on.
        Verifying a sampled row costs more than a greedy one (its q rows, rejection
        sampling), so such steps have a curve of their own -- once it has priced a
        drafting step; until then the greedy curve stands in, as it did for every step."""
        if _is_sampled(key) and any(self.sampled_target.priced(t) for t in self.sampled_sizes):
            return self.sampled_target
        return self.target

    # -- deciding ---------------------------------------------------------------------

    def acceptance(self, req_id: str | None = None, rule: str = "", side: int = 0) -> np.ndarray:
        """a_j per position (conditional on the earlier ones accepted) under ``rule``,
        overall or for one request; ``side`` +1 / -1: at the bound of what is known
        (:class:`PositionAcceptance`)."""
        return self.accept.estimate(req_id, rule, side)

    @property
    def ready(self) -> bool:
        """Both cost models have something to go on: the warm-up's three step sizes (two
        when k <= 1), each priced from a second step, and a drafting step.

        A second step, because a size's first step may pay one-time costs (see
        :class:`TargetCost`) and while fewer than two sizes have a second step, first
        steps stand in: the first decisions then rested on them. Priced so, on a simulated
        machine whose first step per shape costs 0.3 s more, k = 1 and 2 looked twice as
        dear as k = 0, the budget chose k = 0, and a size it does not run gets no second
        step -- stuck at plain speed until a probe, which that price made look too dear
        to afford. Warm-up steps cost little
        (k <= 2, few rows), so the warm-up runs its cycle twice; after that, if the batch
        kept changing under it, first steps stand in as before."""
        needed = min(len(_WARMUP), self.max_tokens + 1)
        # The warm-up prices the curve of the traffic it meets (greedy or sampled rows).
        curve = max(self.target, self.sampled_target, key=lambda c: c.sizes)
        if curve.sizes < needed or not any(f.n > 0 for f in self.drafts.values()):
            return False
        return len(curve.by_size) >= needed or self.warmup_steps >= 2 * len(_WARMUP)

    def rates(self, rows: int, gain: np.ndarray, drafting: int, lump: float = 0.0, spread: float = 1.0,
              draft_key: str = "") -> list[float]:
        """Expected tokens per second for k = 0..max_tokens; ``gain[j]``: the sum over
        rows of P_r(j + 1), ``drafting`` rows draft (with the rules ``draft_key`` names).
        The draft states' catch-up is priced at its steady size, the tokens the step
        will emit, plus ``lump`` tokens they have fallen behind by, divided by ``spread``.
        A cost group never timed is priced as its kind's timed groups (:meth:`draft_seconds`)."""
        curve = self.curve(draft_key)
        out = []
        for k in range(self.max_tokens + 1):
            emitted = rows + float(gain[:k].sum())
            cost = curve.predict(rows + k * drafting)
            if k > 0:
                steady = drafting + float(gain[:k].sum())
                cost += self.draft_seconds(draft_key, k, drafting, steady + lump / spread)
            out.append(emitted / max(cost, 1e-6))
        return out

    def plan(self, req_ids: list[str], drafting: list[bool], lengths: list[int] | None = None,
             rules: list[str] | None = None, left: list[int | None] | None = None) -> list[int]:
        """The draft length per row of the batch (0 for rows not ``drafting``);
        ``lengths``: each row's length (prompt + output), to price the catch-up of
        draft states that have fallen behind; ``rules``: each row's rule (``auto``);
        ``left``: the most tokens each row may still emit (its ``max_tokens`` less its
        output; ``None``: unbounded), which bounds what its drafts can earn and the steps
        its catch-up is spread over."""
        rows = len(req_ids)
        if not self.ready:
            k = min(_WARMUP[self.warmup_steps % len(_WARMUP)], self.max_tokens)
            self.warmup_steps += 1
            self.exploration.warmup += 1
            self.last_plan = ("warm-up", [], 0.0)
            return self._clamp([k] * rows, self._warmup_rows(req_ids, drafting, lengths))
        bucket = self.buckets.setdefault(bucket_of(rows), _Bucket())
        step = bucket.steps
        bucket.steps += 1
        seen = self._expected(req_ids, drafting, lengths, rules, left)
        if not seen.reach.any():  # every drafting row ends before a draft could count
            self.last_plan = ("no row has tokens left to draft", seen.rates, seen.lump)
            return [0] * rows
        rates, gains, n_drafting, lump, key = seen.rates, seen.gains, seen.n_drafting, seen.lump, seen.key
        gain = gains.sum(0)
        best, why = self._best(rates)
        self.last_plan = (why, rates, lump)
        if self.explore_every and step % self.explore_every == self.explore_every // 2:
            # A probe drafts with the rows already caught up (the least behind, one at least)
            # and is judged on them: made with a batch that had not drafted lately, it had
            # every row's draft state read its whole context in one step to try one length.
            probing = self._caught_up_rows(req_ids, drafting, lengths)
            tried = seen if probing == list(drafting) else self._expected(req_ids, probing, lengths, rules, left)
            probe = self._probe(req_ids, rules, tried, best, whole=tried is seen)
            if probe is not None:
                # What the probe is expected to lose against `best`: the time its tokens
                # take beyond what they would at best's rate, its rows' catch-up paid now.
                tried_gain = tried.gains.sum(0)
                now = self.rates(rows, tried_gain, tried.n_drafting, tried.lump, draft_key=tried.key)
                emitted = rows + float(tried_gain[:probe].sum())
                loss = max(emitted / now[probe] - emitted / rates[best], 0.0)
                if loss <= bucket.allowance:
                    bucket.allowance -= loss
                    bucket.probes += 1
                    self.exploration.probes += 1
                    self.exploration.probe_loss_s += loss
                    self.last_plan = ("probe", rates, tried.lump)
                    return self._clamp([probe] * rows, probing)
        if best == 0:
            return [0] * rows
        # Trimmed per request, but never to nothing while the step drafts: a request at
        # 0 shows no new verdicts, so one run of rejections (common at T > 0) would
        # silence it for dozens of steps; one proposal is cheap beside the others' k.
        bar = self.curve(key).slope(rows, rows + best * n_drafting) * rates[best]
        return self._clamp([max(1, int((g[:best] > bar).sum())) for g in gains], drafting)

    def would_draft(self, req_ids: list[str], drafting: list[bool], lengths: list[int] | None = None,
                    rules: list[str] | None = None, left: list[int | None] | None = None) -> bool:
        """Whether :meth:`plan` would draft this step with ``rules``, probes aside, without
        changing any state: ``auto`` asks it before a challenger's turn, since a rule the
        budget would not draft with runs at plain speed, which says nothing of the rule."""
        if not self.ready:
            return any(drafting)
        return self._best(self._expected(req_ids, drafting, lengths, rules, left).rates)[0] > 0

    def _probe(self, req_ids: list[str], rules: list[str] | None, seen: _Expected, best: int, *,
               whole: bool) -> int | None:
        """The length worth a probe, or ``None`` when none could beat ``best``.

        Each other length is judged at the edge of what is known of the positions where
        it differs from ``best``: a longer one with those positions' acceptance at its
        upper bound, against ``best`` as estimated; a shorter one as estimated, against
        ``best`` with the positions it drops at their lower bound. A length that loses
        even so is not worth paying for: its positions have been judged often enough,
        and lately enough, to rule it out (before, every tenth step tried a neighbour
        whatever the evidence). A length whose step size the target's curve has not
        priced, or not lately, stays worth a probe: its cost is a guess until it runs
        (in one run on the 1.5B target at batch 1, with other work on the machine, the plain
        step stayed priced at twice its cost to the end, and k = 3 and 4 looked best), and so
        does every k > 0 while the draft price rests on few or old steps
        (:meth:`DraftCost.priced`) -- when the probe drafts with the ``whole`` batch. One that
        drafts with a few rows caught up runs a size no plan runs (a plan drafts with every
        row): pricing it is not worth a step, and judged worth one it probed every slot at
        batch 32 where nothing pays. The most
        promising one is tried, the nearest on a tie; a position left alone grows
        uncertain again with time (:class:`PositionAcceptance`), so a change is still
        found."""
        rules = rules or [""] * len(req_ids)
        rates, n_drafting = seen.rates, seen.n_drafting
        point = np.stack([self.acceptance(r, rule) for r, rule in zip(req_ids, rules)])
        rows = len(req_ids)
        promise: dict[int, float] = {}
        draft_guessed = not self._draft_cost(seen.key).priced(seen.key, self.steps)
        for k in range(self.min_tokens, self.max_tokens + 1):
            if k == best:
                continue
            a = point.copy()
            lo, hi = min(k, best), max(k, best)
            a[:, lo:hi] = np.stack([self.acceptance(r, rule, 1 if k > best else -1)[lo:hi]
                                    for r, rule in zip(req_ids, rules)])
            edge = self.rates(rows, (np.cumprod(a, axis=1) * seen.reach).sum(0), n_drafting, seen.lump, seen.spread,
                              seen.key)
            promise[k] = edge[k] / rates[best] if k > best else rates[k] / max(edge[best], 1e-12)
            guessed = not self.curve(seen.key).priced(rows + k * n_drafting)
            guessed |= k > 0 and draft_guessed
            if whole and guessed:
                promise[k] = max(promise[k], 1.0)  # its price is a guess or stale: only running it tells
        if not promise or max(promise.values()) < 1.0:
            self.exploration.skipped += 1
            return None
        return max(promise, key=lambda k: (promise[k], -abs(k - best)))

    def _expected(self, req_ids: list[str], drafting: list[bool], lengths: list[int] | None,
                  rules: list[str] | None, left: list[int | None] | None) -> _Expected:
        """What each k is expected to give this step (:class:`_Expected`).

        A row with ``left`` tokens to go earns nothing from a draft past its ``left - 1``-th
        (the request ends there, whatever is accepted). It repays its catch-up over the
        steps it can be expected to run still: the tokens the ended replies longer than
        its output went on for (:class:`ReplyLengths`; ``horizon`` steps until enough have
        ended), at most ``left``, at the tokens a step at k = 1 gives it. At the tail of a
        batch, the requests that finish last fall below the batch size a schedule keeps
        from drafting, and priced over ``horizon`` steps their whole contexts' catch-up
        looked affordable; over a reply of hundreds of tokens, ``horizon`` steps made a
        batch of 8 that had stayed at k = 0 a while never start again where k = 1 paid."""
        rows = len(req_ids)
        rules = rules or [""] * rows
        left = left or [None] * rows
        ends = np.array([self.max_tokens if n is None else n - 1 for n in left])  # [rows] positions that can count
        reach = (np.arange(self.max_tokens) < ends[:, None]) & np.asarray(drafting, dtype=bool)[:, None]
        reach = reach.astype(np.float64)
        gains = np.stack([np.cumprod(self.acceptance(r, rule)) for r, rule in zip(req_ids, rules)]) * reach
        n_drafting = int(sum(drafting))
        # Tokens the drafting rows' states have fallen behind by, beyond the one token a
        # request that drafted last step has to read anyway (the steady catch-up), and
        # the steps they are spread over (the lump's harmonic share of each row's).
        behind = [0.0 if lengths is None or not d else float(max(self._behind(r, n) - 1, 0))
                  for r, n, d in zip(req_ids, lengths or [0] * rows, drafting)]
        lump = sum(behind)
        to_go = self.replies.to_go(req_ids)
        steps = [_steps_to_go(n, t, g, self.horizon) for n, t, g in zip(left, to_go, gains[:, 0])]
        per_step = sum(b / s for b, s in zip(behind, steps))
        spread = lump / per_step if per_step > 0 else self.horizon
        key = _draft_key(rules, drafting)
        rates = self.rates(rows, gains.sum(0), n_drafting, lump, spread, key)
        return _Expected(rates, gains, reach, n_drafting, lump, spread, key)

    def _best(self, rates: list[float]) -> tuple[int, str]:
        """The k of the best expected rate, and why."""
        best = int(np.argmax(rates[self.min_tokens :])) + self.min_tokens
        if best > 0 and self.min_tokens == 0 and rates[best] < (1 + self.margin) * rates[0]:
            # A gain this small is inside the model's error, and drafting has a cost the
            # steady-state rate leaves out: the drafter's first pass over each context.
            return 0, "gain inside the margin"
        return best, "best rate"

    def _warmup_rows(self, req_ids: list[str], drafting: list[bool], lengths: list[int] | None) -> list[bool]:
        """The rows a warm-up step drafts with: the least behind first, while their
        catch-up stays within ``warmup_catchup`` tokens, one row at least. The warm-up
        only has to time a drafting step and two more sizes of the target's step; made
        with a whole batch of new requests it had every draft state read its prompt at
        once, a large share of a short batch job (docs/algorithms.md#draft-length), before
        the budget could price that lump. The second cycle (:attr:`ready`) only re-times
        the first's sizes: it drafts with the rows already caught up, one at least. A floor
        (``min_tokens``) drafts every row, as it promises."""
        if self.warmup_steps > len(_WARMUP):
            return self._caught_up_rows(req_ids, drafting, lengths)
        return self._least_behind(req_ids, drafting, lengths, lambda total, lag: total + lag > self.warmup_catchup)

    def _caught_up_rows(self, req_ids: list[str], drafting: list[bool], lengths: list[int] | None) -> list[bool]:
        """The drafting rows whose draft states are at most two full drafts behind, or the
        least behind one where none is; every row under a floor (``min_tokens``)."""
        return self._least_behind(req_ids, drafting, lengths, lambda total, lag: lag > 2 * (self.max_tokens + 1))

    def _least_behind(self, req_ids: list[str], drafting: list[bool], lengths: list[int] | None,
                      full: Callable[[int, int], bool]) -> list[bool]:
        """Drafting rows, the least behind first, until ``full(tokens behind so far, the
        next row's)``; one row at least, and every drafting row under a floor or without
        ``lengths``."""
        if self.min_tokens > 0 or lengths is None:
            return list(drafting)
        behind = sorted((self._behind(r, n), i)
                        for i, (r, n, d) in enumerate(zip(req_ids, lengths, drafting)) if d)
        chosen = [False] * len(req_ids)
        total, count = 0, 0
        for lag, i in behind:
            if count and full(total, lag):
                break
            chosen[i] = True
            total, count = total + lag, count + 1
        return chosen

    def _clamp(self, ks: list[int], drafting: list[bool]) -> list[int]:
        """Each drafting row's k within [min_tokens, max_tokens]; 0 for the others."""
        return [max(self.min_tokens, min(self.max_tokens, k)) if d else 0 for k, d in zip(ks, drafting)]


class FixedBudget:
    """``draft_budget: fixed``: always ``num_speculative_tokens`` for every row."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.chosen = Counter()
        self.last_k = max_tokens
        self.last_plan: tuple[str, list[float], float] = ("fixed", [], 0.0)

    def observe(self, now: float, req_ids: list[str], sampled: list[int]) -> None:
        """Nothing to learn."""

    def would_draft(self, req_ids: list[str], drafting: list[bool], lengths: list[int] | None = None,
                    rules: list[str] | None = None, left: list[int | None] | None = None) -> bool:
        """Every drafting row always drafts."""
        return any(drafting)

    def plan(self, req_ids: list[str], drafting: list[bool], lengths: list[int] | None = None,
             rules: list[str] | None = None, left: list[int | None] | None = None) -> list[int]:
        return [self.max_tokens if d else 0 for d in drafting]

    def record(self, req_ids: list[str], proposed: list[int], propose_s: float, end: float,
               lengths: list[int] | None = None, rules: list[str] | None = None) -> None:
        k = max(proposed, default=0)
        self.chosen[k] += 1
        self.last_k = k

    def forget(self, req_id: str) -> None:
        """No per-request state."""


def make_budget(mode: str, max_tokens: int, min_tokens: int = 0,
                forward_rules: frozenset[str] = frozenset()) -> AdaptiveBudget | FixedBudget:
    """The budget policy ``draft_budget`` names (``forward_rules``: the rules whose draft
    tokens cost one drafter forward each, priced with one fit)."""
    if mode == "adaptive":
        return AdaptiveBudget(max_tokens, min_tokens, forward_rules=forward_rules)
    return FixedBudget(max_tokens)
