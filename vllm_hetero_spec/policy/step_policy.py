"""Each step's drafting plan: how many tokens every row drafts, and with which rule.

The proposer asks once before drafting (:meth:`StepPolicy.plan`) and reports once after
(:meth:`StepPolicy.record`); between the two it only drafts. The limits come from three
places, applied in this order: vLLM's batch-size schedule caps the whole step
(:meth:`StepPolicy.cap_step`), ``sampled_speculative_tokens`` caps sampled rows, and the
budget chooses up to those caps (a row capped at 0 is not offered to it at all, so it
neither drafts nor counts in the budget's warm-up). With ``algorithm: auto`` the rule
chooser picks each row's rule first, asking the budget whether a candidate set of rules
would draft at all; a rule a request names (``extra_args["algorithm"]``) overrides it.
While the chooser compares its rules, every rule is measured drafting
(:meth:`StepPolicy._compared_drafting`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vllm_hetero_spec.drafter.sampling import GREEDY_EPS
from vllm_hetero_spec.policy.budget import AdaptiveBudget, FixedBudget, make_budget, sampled_label
from vllm_hetero_spec.policy.rule_choice import RuleChooser
from vllm_hetero_spec.policy.step_log import StepLog


@dataclass
class StepPlan:
    """One step's plan, per row of vLLM's batch (``rows`` of them).

    Attributes:
        lengths: [rows] tokens to draft (0: the row drafts nothing this step).
        rules: [rows] the rule each row drafts with, or ``None`` when the engine has one.
        asked: [rows] whether the row's request named its rule (``auto`` engines only).
        capped: every row was capped at 0 before the budget was asked.
    """

    lengths: list[int]
    rules: list[str] | None = None
    asked: list[bool] | None = None
    capped: bool = False


def _own(asked: Sequence[str | None], chosen: Sequence[str]) -> list[str]:
    """Each row's rule: the one its request names, else the one ``auto`` chose."""
    return [a or c for a, c in zip(asked, chosen)]


def _budget_labels(rules: Sequence[str] | None, temperatures: Sequence[float]) -> list[str] | None:
    """What the budget learns each row's acceptance and costs under: its rule, marked
    when the row samples (:func:`~vllm_hetero_spec.policy.budget.sampled_label`);
    ``None`` for an engine of one rule whose rows are all greedy."""
    if rules is None and all(t < GREEDY_EPS for t in temperatures):
        return None
    rules = rules or [""] * len(temperatures)
    return [sampled_label(r) if t >= GREEDY_EPS else r for r, t in zip(rules, temperatures)]


class StepPolicy:
    """The budget and, for ``algorithm: auto``, the rule chooser, behind one plan per step."""

    def __init__(self, k: int, draft_budget: str, min_tokens: int, sampled_limit: int | None,
                 auto_rules: tuple[tuple[str, ...], tuple[str, ...]] | None, forward_rules: frozenset[str]):
        """``k``: ``num_speculative_tokens``; ``sampled_limit``: ``sampled_speculative_tokens``;
        ``auto_rules``: ``auto``'s (greedy, sampled) candidates, or ``None`` for one rule;
        ``forward_rules``: the rules whose draft tokens cost one drafter forward each."""
        self.k = k
        self.sampled_limit = sampled_limit
        self.budget: AdaptiveBudget | FixedBudget = make_budget(draft_budget, k, min_tokens, forward_rules)
        self.rules: RuleChooser | None = None if auto_rules is None else RuleChooser(*auto_rules)
        self._candidates = set() if auto_rules is None else set(auto_rules[0]) | set(auto_rules[1])
        # The most tokens a request may draft this step: vLLM's batch-size schedule
        # (``num_speculative_tokens_per_batch_size``) for the step's batch; k without one.
        self.step_cap = k
        self.step_log: StepLog | None = None  # advise's timings, when it asks (advise/probe.py)

    def cap_step(self, k: int) -> None:
        """Draft at most ``k`` tokens a request in the coming step: the k vLLM's
        scheduler chose for this step's batch size from ``num_speculative_tokens_per_batch_size``
        (``num_speculative_tokens`` without one). A schedule is how a user (or ``advise``)
        says where drafting never pays: at a batch size capped to 0 the step skips the
        budget and the rule choice altogether, so it costs no warm-up step, probe or
        draft state's catch-up, none of which a budget free to choose can avoid; under
        a cap above 0 the budget still chooses, up to it. The cap overrides
        ``min_speculative_tokens``."""
        self.step_cap = max(0, min(int(k), self.k))

    def pin(self, rule: str, k: int) -> None:
        """Draft every request with ``rule`` (one of ``auto``'s candidates) and exactly
        ``k`` tokens (0: none) from now on, and log each step's timing. For ``advise``,
        which measures each rule and draft length on one engine rather than starting one
        per setting; verification is untouched, so every pinned setting is as lossless
        as the rule is."""
        if not 0 <= k <= self.k:
            raise ValueError(f"k must be in [0, {self.k}] (num_speculative_tokens), got {k}")
        if self.rules is None:
            raise ValueError(f"rule {rule!r}: this engine does not choose rules; pinning needs algorithm auto")
        if rule not in self._candidates:
            raise ValueError(f"rule {rule!r} is not among this engine's auto candidates {sorted(self._candidates)}")
        self.rules = RuleChooser((rule,), (rule,))
        self.budget = FixedBudget(k)
        self.step_log = StepLog()

    def row_caps(self, temperatures: Sequence[float]) -> list[int]:
        """Per row, the most it may draft this step: the batch-size schedule's cap, and
        for a sampled row also ``sampled_speculative_tokens``."""
        sampled = self.step_cap if self.sampled_limit is None else min(self.step_cap, self.sampled_limit)
        return [self.step_cap if t < GREEDY_EPS else sampled for t in temperatures]

    def plan(self, now: float, req_ids: list[str], sampled: list[int], temperatures: list[float],
             row_lengths: list[int], asked: list[str | None], left: list[int | None] | None = None) -> StepPlan:
        """This step's plan. ``sampled``: [rows] tokens each row sampled in the step just
        verified (0: still prefilling, so it drafts nothing); ``row_lengths``: [rows]
        committed tokens; ``asked``: [rows] the rule each request names, or None;
        ``left``: [rows] the most tokens each request may still emit (None: unbounded)."""
        self.budget.observe(now, req_ids, sampled)
        if self.rules is not None:
            self.rules.observe(now, req_ids, sampled)
        caps = self.row_caps(temperatures)
        if not any(caps):
            return StepPlan([0] * len(req_ids), capped=True)
        drafting = [n > 0 and cap > 0 for n, cap in zip(sampled, caps)]
        rules = None
        if self.rules is not None:
            chosen = self.rules.choose(temperatures, lambda rs: self.budget.would_draft(
                req_ids, drafting, row_lengths, _budget_labels(_own(asked, rs), temperatures), left))
            rules = _own(asked, chosen)
        lengths = self.budget.plan(req_ids, drafting, row_lengths, _budget_labels(rules, temperatures), left)
        if rules is not None:
            lengths = self._compared_drafting(lengths, req_ids, drafting, row_lengths, rules, temperatures, asked, left)
        return StepPlan([min(n, cap) for n, cap in zip(lengths, caps)], rules,
                        None if rules is None else [a is not None for a in asked])

    def _compared_drafting(self, lengths: list[int], req_ids: list[str], drafting: list[bool], row_lengths: list[int],
                           rules: list[str], temperatures: list[float], asked: list[str | None],
                           left: list[int | None] | None) -> list[int]:
        """``lengths`` with one token for each row of a kind comparing its rules that the
        budget left undrafted, where it would draft with another of the kind's candidates.

        The comparison then measures each rule drafting. Measured as the budget ran it, a
        rule whose acceptance or cost the budget had from a step or two could lose for
        good: with ``auto`` at T = 1 on the 1.5B target, tli's one timed warm-up step (its
        first sampled draft, 557 ms) priced its k = 1 near slrs's k = 4, the budget left
        its turns undrafted, they ran at plain speed, slrs won, and an undrafted rule
        shows the budget nothing new, so the price stayed
        (docs/benchmarks.md#batch-1-t--1-a-rule-the-budget-left-undrafted-lost-its-comparison).
        Where the budget would draft with no candidate, nothing is added: comparing rules
        there costs drafting that does not pay. The added steps count as the budget's
        exploration (``compared``)."""
        out = list(lengths)
        if not (isinstance(self.budget, AdaptiveBudget) and self.budget.ready):
            return out  # the warm-up's k = 0 steps price the plain step: they stay
        for name, kind in self.rules.kinds.items():
            rows = {i for i, (t, a) in enumerate(zip(temperatures, asked))
                    if a is None and drafting[i] and out[i] == 0 and self.rules.kind_of(t) == name}
            if not rows or not kind.comparing or len(kind.candidates) < 2:
                continue
            mine = [i in rows for i in range(len(req_ids))]
            current = rules[min(rows)]
            if any(self.budget.would_draft(req_ids, mine, row_lengths,
                                           _budget_labels([c if i in rows else r for i, r in enumerate(rules)],
                                                          temperatures), left)
                   for c in kind.candidates if c != current):
                for i in rows:
                    out[i] = 1
                self.budget.exploration.compared += 1
        return out

    def record(self, plan: StepPlan, req_ids: list[str], sampled: list[int], temperatures: list[float],
               row_lengths: list[int], proposed: list[int], start: float, end: float) -> None:
        """What the step drafted (``proposed``: [rows] proposals) and how long it took."""
        self.budget.record(req_ids, proposed, end - start, end, row_lengths, _budget_labels(plan.rules, temperatures))
        if plan.rules is not None:
            self.rules.record(req_ids, temperatures, plan.rules, proposed, plan.asked)
        if self.step_log is not None:
            self.step_log.add(start, end, req_ids, sampled, proposed)

    def forget(self, req_id: str) -> None:
        """Drop a finished, aborted or preempted request's estimates."""
        self.budget.forget(req_id)

    def why(self, plan: StepPlan) -> tuple[str, list[float], float]:
        """The budget's reason for the last plan, its tokens/s per k and catch-up lump (debug logs)."""
        return ("every row capped at k = 0", [], 0.0) if plan.capped else self.budget.last_plan

    def counters(self) -> dict[str, int]:
        """The budget's counters, as ``DrafterStats`` names them."""
        chosen = self.budget.chosen
        return {"budget_sum": sum(k * n for k, n in chosen.items()), "budget_steps": sum(chosen.values()),
                "undrafted_steps": chosen[0]}

    def gauges(self) -> dict[str, int]:
        """Gauges for the metrics board: the last chosen k, and steps per rule under ``auto``."""
        out = {"draft_budget": self.budget.last_k}
        if self.rules is not None:
            out.update({f"{rule}_request_steps": n for rule, n in self.rules.chosen.items()})
        return out
