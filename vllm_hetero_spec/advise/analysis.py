"""From ``advise``'s measured runs (:mod:`~vllm_hetero_spec.advise.session`) to projected
speedups, per drafter, rule, temperature and batch size, and the configuration to use.

Per batch size ``b`` the hetero engine's sweep gives the target's step at each draft
length ``k`` (the median steady step verifying ``b (k + 1)`` tokens) and the proposal's
cost as a fixed part plus a part per draft position; each rule's run at the longest
length gives its acceptance per position (pooled over batch sizes: acceptance is the
pair's and the prompts', not the batch's), its own cost per position, and what the
drafter's reading of each prompt adds. The plain engine gives the unit, its decode
step, and the prefill's share of a run. :mod:`~vllm_hetero_spec.advise.projection`
turns them into a speedup per ``k``.
vLLM's ``draft_model`` drafts a fixed ``k``, so its figure is the one measured on the
sample, with its acceptance pooled over batch sizes like ours. Each run at the longest
length is also a measurement of that setting on the sample; it is reported beside the
projection as a check.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_hetero_spec.advise.projection import (
    Acceptance, Phased, StepCosts, at_length, best_at_lengths, expected_tokens, group_steps)
from vllm_hetero_spec.config import SCHEDULE_KEY

DRAFT_MODEL = "draft_model"
#: Output tokens per request projected at by default: a short reply, a typical one, a long one.
OUTPUT_LENGTHS = (64, 256, 1024)
#: The fewest drafts a phase of a reply (:func:`_phases`) is estimated from; with fewer,
#: one acceptance for the whole reply.
MIN_PHASE_DRAFTS = 30
#: The last batch size a written schedule names: a round figure past any measured size
#: (vLLM carries the last range's k on past it, up to ``max_num_seqs``).
SCHEDULE_END = 1024


def draft_model_label(drafter: str) -> str:
    """The name a session of vLLM's ``draft_model`` with ``drafter`` goes by."""
    return f"{drafter} (vLLM {DRAFT_MODEL})"


class AdviseError(RuntimeError):
    """A measurement too thin to project from, naming what to change."""


@dataclass(frozen=True)
class Option:
    """One (drafter, method) at one temperature and batch size. ``rule``: ours, or
    :data:`DRAFT_MODEL`; ``acceptance``: per position at the measured length;
    ``draft_cost``: one draft position's cost in target steps; ``projected``: the best
    ``k``'s speedup, the geometric mean over the output lengths projected at, each in
    ``by_length``; ``sample``: the speedup measured on the sample at the longest ``k``;
    ``phases``: the acceptance early in a reply and past it, where it was measured so
    (the projection's, else ``acceptance``)."""

    drafter: str
    rule: str
    temperature: float
    batch: int
    k: int
    projected: float
    sample: float
    acceptance: list[float]
    draft_cost: float
    by_k: dict[int, float] = field(default_factory=dict)
    by_length: dict[int, float] = field(default_factory=dict)
    phases: Phased | None = None

    @property
    def mean_accepted(self) -> float:
        """E(k) at the measured length: tokens per step."""
        return expected_tokens(self.acceptance, len(self.acceptance))


def _tok_per_s(run: dict[str, Any]) -> float:
    return sum(run["lengths"]) / run["wall"]


def _median_step(steps: list[dict[str, Any]], b: int, k: int, key: str) -> float | None:
    """The median ``key`` over the steady steps of ``b`` rows that verified ``k`` drafts a
    row (the steps the sweep pinned), else over every steady step."""
    steady = [s for s in steps if s["steady"]]
    exact = [s[key] for s in steady if s["rows"] == b and s["tokens"] == b * (k + 1)]
    values = exact or [s[key] for s in steady]
    return statistics.median(values) if values else None


def _acceptance(runs: list[dict[str, Any]], k: int) -> list[float]:
    """Per position, the share of drafts accepted there, pooled over ``runs``."""
    drafts = sum(r["counters"]["num_drafts"] for r in runs)
    if drafts <= 0:
        return [0.0] * k
    accepted = [0.0] * k
    for r in runs:
        for i, n in enumerate(r["counters"]["accepted_per_position"][:k]):
            accepted[i] += n
    return [a / drafts for a in accepted]


def _phases(runs: list[dict[str, Any]], k: int) -> Phased | None:
    """Per position, the share of drafts accepted there over the first half of the
    sample's replies and over the second (the proposer's step log records each row's
    point in its reply, :class:`~vllm_hetero_spec.policy.step_log.StepTiming`), pooled
    over ``runs``: a reply's first tokens accept less than the rest, so a long reply's
    steady state is the second half's. None where either half has fewer than
    :data:`MIN_PHASE_DRAFTS` drafts, or the log records none (an older result)."""
    switch = max(r.get("max_tokens", 0) for r in runs) // 2
    accepted = [(position, a) for r in runs for step in r.get("steps", []) for position, _, a in
                step.get("verified", [])]
    early = [a for position, a in accepted if position < switch]
    late = [a for position, a in accepted if position >= switch]
    if min(len(early), len(late)) < MIN_PHASE_DRAFTS:
        return None

    def rates(xs: list[int]) -> tuple[float, ...]:
        return tuple(sum(a >= i for a in xs) / len(xs) for i in range(1, k + 1))

    return Phased(rates(early), rates(late), switch)


def rescaled(own: list[float], phases: Phased, pooled: list[float]) -> Phased:
    """``own`` acceptance (over a whole sample) in two phases, rising from one to the
    other as ``phases`` does against its own whole-sample figure ``pooled``: how
    ``draft_model``, whose engine logs no steps, takes the phases its drafter showed
    under the plugin. Each position's share stays at most 1 and at most the one before
    it (cumulative)."""
    def scaled(phase: tuple[float, ...]) -> tuple[float, ...]:
        out, cap = [], 1.0
        for a, p, q in zip(own, phase, pooled):
            cap = min(cap, a * p / q if q > 0 else a)
            out.append(cap)
        return tuple(out)

    return Phased(scaled(phases.early), scaled(phases.late), phases.switch)


def _plain(plain: dict[str, Any], t: float, b: int) -> dict[str, Any]:
    for run in plain["runs"]:
        if run["T"] == t and run["b"] == b:
            return run
    raise AdviseError(f"the plain engine measured no run at T = {t}, batch {b}")


def _groups(lengths: list[int], b: int) -> list[list[int]]:
    return [lengths[i:i + b] for i in range(0, len(lengths), b)]


def plain_step(run: dict[str, Any], b: int) -> float:
    """Seconds per decode step of the plain engine: its run's time past the first token,
    over its decode steps (per group of ``b`` requests, the longest output less one)."""
    steps = sum(max(g) - 1 for g in _groups(run["lengths"], b))
    return (run["wall"] - run["wall_first"]) / max(steps, 1)


def sweep_costs(hetero: dict[str, Any], b: int) -> tuple[dict[int, float], float, float]:
    """At batch ``b``, from the sweep: the target's step per swept ``k`` (seconds), and
    the proposal's fixed cost and cost per draft position (a least-squares line through
    its median at each ``k > 0``)."""
    target: dict[int, float] = {}
    propose: dict[int, float] = {}
    for sweep in hetero["sweep"]:
        if sweep["b"] == b:
            t = _median_step(sweep["steps"], b, sweep["k"], "target_s")
            if t is not None:
                target[sweep["k"]] = t
                if sweep["k"] > 0:
                    propose[sweep["k"]] = _median_step(sweep["steps"], b, sweep["k"], "propose_s")
    if not propose:
        raise AdviseError(f"no steady drafting step at batch {b}; raise --sweep-tokens")
    ks, ys = list(propose), list(propose.values())
    if len(ks) == 1:
        return dict(sorted(target.items())), 0.0, ys[0] / ks[0]
    mean_k, mean_y = statistics.fmean(ks), statistics.fmean(ys)
    slope = sum((k - mean_k) * (y - mean_y) for k, y in zip(ks, ys)) / sum((k - mean_k) ** 2 for k in ks)
    slope = max(slope, 0.0)
    return dict(sorted(target.items())), max(mean_y - slope * mean_k, 0.0), slope


def _tail(run: dict[str, Any], acceptance: Acceptance, k: int, b: int) -> float:
    """The run's decode steps (its proposals, less one prefill step per group) over the
    count its pooled acceptance predicts: above 1 where some requests of a batch accept
    less than others and the batch waits for them."""
    groups = _groups(run["lengths"], b)
    predicted = group_steps(acceptance, k, groups)
    observed = len(run["steps"]) - len(groups)
    return max(observed / predicted, 1.0) if predicted > 0 and observed > 0 else 1.0


def hetero_options(drafter: str, hetero: dict[str, Any], plain: dict[str, Any], k_max: int,
                   lengths: tuple[int, ...] = OUTPUT_LENGTHS) -> list[Option]:
    """Our rules' options for one drafter, projected at output ``lengths``. Costs are in
    units of the plain engine's decode step; a rule's cost per draft position is its own
    (its median proposal at the longest ``k``, less the sweep's fixed cost); a group's
    prefill is the plain run's time to its first tokens, and the drafter's reading of its
    prompts what the run's non-steady proposals took beyond a steady one, each per group
    of ``b`` requests: paid once per request, whatever its length. Acceptance is in two
    phases of a reply where the step log allows (:func:`_phases`)."""
    out = []
    by_b = {b: sweep_costs(hetero, b) for b in sorted({s["b"] for s in hetero["sweep"]})}
    for rule, t in sorted({(r["rule"], r["T"]) for r in hetero["runs"]}):
        runs = [r for r in hetero["runs"] if r["rule"] == rule and r["T"] == t]
        acceptance = _acceptance(runs, k_max)
        phases = _phases(runs, k_max)
        projected_with = phases or acceptance
        for run in runs:
            b = run["b"]
            target, host, per_position = by_b[b]
            plain_run = _plain(plain, t, b)
            unit = plain_step(plain_run, b)
            propose = _median_step(run["steps"], b, k_max, "propose_s")
            if propose is None:
                propose = host + per_position * k_max
            reading = sum(max(s["propose_s"] - propose, 0.0) for s in run["steps"] if not s["steady"])
            groups = len(_groups(run["lengths"], b))
            costs = StepCosts({k: v / unit for k, v in target.items()}, max(propose - host, 0.0) / k_max / unit,
                              host / unit, plain_run["wall_first"] / len(_groups(plain_run["lengths"], b)) / unit,
                              reading / groups / unit)
            chosen = best_at_lengths(projected_with, costs, b, lengths, _tail(run, projected_with, k_max, b))
            out.append(Option(drafter, rule, t, b, chosen.k, chosen.speedup, _tok_per_s(run) / _tok_per_s(plain_run),
                              acceptance, costs.draft_forward, chosen.by_k, chosen.by_length, phases))
    return out


def draft_model_options(drafter: str, measured: dict[str, Any], plain: dict[str, Any], k_max: int,
                        lengths: tuple[int, ...] = OUTPUT_LENGTHS, ours: Sequence[Option] = ()) -> list[Option]:
    """vLLM's ``draft_model`` with the same drafter at its fixed ``k``, projected at output
    ``lengths`` from each run's measured decode step: the run's time past the plain
    run's prefill, over the decode steps its own acceptance predicts. At each length the
    steps are counted with the acceptance pooled over the runs at its temperature.
    Acceptance is the pair's and the prompts', not the batch's, yet one run's at T > 0
    is a draw (on one sample, batch 1 and batch 8 accepted 2.4 and 2.8 tokens a step);
    pooled, as :func:`hetero_options` pools ours, the draw weighs half as much. Its
    prefill is the plain run's, so the drafter's first pass over each prompt counts as part
    of the measured steps: at lengths past the sample's it is counted again per step,
    which errs against ``draft_model``, never for it. Its acceptance rises along a reply
    as the same drafter's did under the plugin at the same temperature (``ours``, where
    it measured two phases, :func:`rescaled`), under the rule whose whole-sample
    acceptance is nearest its own: with one vocabulary, ``tli`` drafts what
    ``draft_model`` drafts, so long replies project alike for both."""
    out = []
    for run in measured["runs"]:
        t, b = run["T"], run["b"]
        plain_run = _plain(plain, t, b)
        unit = plain_step(plain_run, b)
        own = _acceptance([run], k_max)
        pooled = _acceptance([r for r in measured["runs"] if r["T"] == t], k_max)
        rising = [o for o in ours if o.drafter == drafter and o.temperature == t and o.phases is not None]
        nearest = min(rising, key=lambda o: sum((a - b) ** 2 for a, b in zip(o.acceptance, pooled)), default=None)
        phases = None if nearest is None else rescaled(pooled, nearest.phases, nearest.acceptance)
        groups = _groups(run["lengths"], b)
        first = min(plain_run["wall_first"], run["wall"])
        steps = group_steps(own, k_max, groups)
        step = (run["wall"] - first) / steps / unit if steps > 0 else 1.0
        costs = StepCosts({k_max: step}, 0.0, 0.0, first / len(groups) / unit)
        by_length = {n: at_length(phases or pooled, costs, k_max, b, n) for n in lengths}
        projected = geometric_mean(list(by_length.values()))
        out.append(Option(drafter, DRAFT_MODEL, t, b, k_max, projected, _tok_per_s(run) / _tok_per_s(plain_run),
                          pooled, float("nan"), {k_max: projected}, by_length, phases))
    return out


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values)) if values else 0.0


def best_per_setting(options: list[Option], drafter: str, method: str) -> dict[tuple[float, int], Option]:
    """Per (temperature, batch): the drafter's best option of ``method`` (ours: the
    fastest rule, as ``auto`` would settle on; ``draft_model``: its one)."""
    out: dict[tuple[float, int], Option] = {}
    for o in options:
        if o.drafter != drafter or (o.rule == DRAFT_MODEL) != (method == DRAFT_MODEL):
            continue
        key = (o.temperature, o.batch)
        if key not in out or o.projected > out[key].projected:
            out[key] = o
    return out


@dataclass(frozen=True)
class Recommendation:
    """The fastest choice over the measured settings (geometric mean of the projected
    speedups), its speedup per (temperature, batch), and its speculative config (``None``:
    plain decoding is fastest). ``configs``: every (drafter, method)'s own best config
    and score, for a user bound to one drafter."""

    drafter: str | None
    method: str | None
    score: float
    per_setting: dict[tuple[float, int], Option]
    config: dict[str, Any] | None
    configs: list[dict[str, Any]] = field(default_factory=list)


def _rule_order(options: list[Option], drafter: str, greedy: bool,
                per: dict[tuple[float, int], Option]) -> list[str]:
    """The drafter's rules for one kind of request, fastest first (mean projected speedup):
    those that are the best of some setting of the kind where drafting pays (k > 0), or
    every rule where none does.

    ``auto`` compares its candidates by taking turns, each turn paying the draft states'
    catch-up on what the rule before left, so a candidate that won nowhere in the
    measurements only costs (docs/advise.md#how-close-it-comes: the config listing both
    greedy rules against each one pinned)."""
    by_rule: dict[str, list[float]] = {}
    for o in options:
        if o.drafter == drafter and o.rule != DRAFT_MODEL and (o.temperature == 0) == greedy:
            by_rule.setdefault(o.rule, []).append(o.projected)
    winners = {o.rule for (t, _), o in per.items() if (t == 0) == greedy and o.k > 0}
    return sorted(winners or by_rule, key=lambda r: -geometric_mean(by_rule[r]))


@dataclass(frozen=True)
class ConfigNames:
    """How a config names a drafter: ours takes a set-up short name or a folder, vLLM's
    ``draft_model`` needs the folder."""

    hetero: str
    draft_model: str


def config_for(options: list[Option], drafter: str, method: str, names: ConfigNames,
               per: dict[tuple[float, int], Option]) -> dict[str, Any]:
    """The speculative config of one (drafter, method), as close to what was measured
    as a config can say, decided in two independent parts:

    - the draft length: where every setting favours the same k (above 0), exactly that
      (``draft_budget: fixed``), without the budget's probes, which cost steps of their
      own; otherwise the adaptive budget up to the longest k any setting favours (it
      drafts less, or nothing, where that pays), and where batch sizes favour different
      longest k, vLLM's batch-size schedule (:func:`batch_schedule`) caps each size at
      its own, so that a size where drafting never paid (k = 0) spends nothing finding
      that out again; and where sampled requests favour a shorter longest k than greedy
      ones, ``sampled_speculative_tokens`` caps them the same way (a schedule is per
      batch size only);
    - the rule: where every setting favours the same rule, that rule; otherwise ``auto``
      with each kind's rules fastest first, those that won a setting (:func:`_rule_order`)."""
    k = max(max(o.k for o in per.values()), 1)
    if method == DRAFT_MODEL:
        return {"method": "draft_model", "model": names.draft_model, "num_speculative_tokens": k}
    config: dict[str, Any] = {"method": "hetero", "model": names.hetero, "num_speculative_tokens": k}
    # a setting where nothing drafts (k = 0) favours no rule
    ks = {o.k for o in per.values()}
    rules = {o.rule for o in per.values() if o.k > 0} or {o.rule for o in per.values()}
    if len(ks) == 1 and 0 not in ks:
        config["draft_budget"] = "fixed"
    schedule = batch_schedule(per)
    if schedule is not None:
        config[SCHEDULE_KEY] = schedule
    greedy = [o.k for (t, _), o in per.items() if t == 0]
    sampled = [o.k for (t, _), o in per.items() if t > 0]
    if greedy and sampled and max(sampled) < max(greedy):
        config["sampled_speculative_tokens"] = max(sampled)
    if len(rules) == 1:
        return {**config, "algorithm": rules.pop()}
    config["algorithm"] = "auto"
    for key, greedy in (("auto_greedy", True), ("auto_sampled", False)):
        order = _rule_order(options, drafter, greedy, per)
        if order:
            config[key] = order
    return config


def batch_schedule(per: dict[tuple[float, int], Option]) -> list[list[int]] | None:
    """vLLM's ``num_speculative_tokens_per_batch_size`` from the best k per setting, or
    ``None`` where every batch size favours the same longest k: each measured size caps
    the sizes from it up to the next measured one at its longest k over temperatures
    (the last up to :data:`SCHEDULE_END`, and vLLM carries it on past that). A size
    between two measured ones takes the smaller one's cap because a cap above 0 still
    leaves the budget free to draft less; only a measured 0 rules drafting out."""
    caps: dict[int, int] = {}
    for (_, b), o in per.items():
        caps[b] = max(caps.get(b, 0), o.k)
    if len(set(caps.values())) < 2:
        return None
    sizes = sorted(caps)
    ends = [s - 1 for s in sizes[1:]] + [max(SCHEDULE_END, sizes[-1])]
    return [[1 if i == 0 else b, end, caps[b]] for i, (b, end) in enumerate(zip(sizes, ends))]


def recommend(options: list[Option], names: dict[str, ConfigNames]) -> Recommendation:
    """The fastest (drafter, method); ``names`` maps each drafter as the user named it
    to what a config names it by."""
    choices = []
    for drafter, named in names.items():
        for method in ("hetero", DRAFT_MODEL):
            per = best_per_setting(options, drafter, method)
            if per:
                score = geometric_mean([o.projected for o in per.values()])
                choices.append((score, drafter, method, per, config_for(options, drafter, method, named, per)))
    if not choices:
        raise AdviseError("nothing was measured")
    configs = [{"drafter": d, "method": m, "geomean_speedup": s, "config": c} for s, d, m, _, c in choices]
    score, drafter, method, per, config = max(choices, key=lambda c: c[0])
    if score <= 1.0:
        return Recommendation(None, None, score, per, None, configs)
    return Recommendation(drafter, method, score, per, config, configs)
