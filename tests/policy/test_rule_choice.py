"""``algorithm: auto``'s choice of rule (policy/rule_choice.py), on a simulated engine:
each rule emits tokens at a known rate, and the chooser must find the faster one per
kind of request, follow a change, and learn only from steps that say something."""

from __future__ import annotations

import random

import pytest

from vllm_hetero_spec.policy.rule_choice import RuleChooser


class Sim:
    """An engine whose steps take ``seconds[rule]`` and emit ``tokens()`` per row."""

    def __init__(self, chooser: RuleChooser, seconds: dict[str, float], tokens=lambda step: 2,
                 debt: dict[str, float] | None = None):
        self.chooser = chooser
        self.seconds = seconds
        self.tokens = tokens
        self.debt = debt or {}  # seconds a rule's step adds to the next step (catch-up left behind)
        self.owed = 0.0
        self.now = 0.0
        self.log: list[list[str]] = []

    def step(self, req_ids: list[str], temps: list[float], sampled: list[int] | None = None,
             proposed: int = 2) -> list[str]:
        emitted = [self.tokens(len(self.log))] * len(req_ids)
        self.chooser.observe(self.now, req_ids, sampled or emitted)
        rules = self.chooser.choose(temps)
        self.chooser.record(req_ids, temps, rules, [proposed] * len(req_ids))
        self.now += max(self.seconds[r] for r in rules) + self.owed
        self.owed = max(self.debt.get(r, 0.0) for r in rules)
        self.log.append(rules)
        return rules


def test_takes_turns_then_runs_the_fastest() -> None:
    chooser = RuleChooser(("slem", "tli"), ("tli", "slrs"), window=4, min_steps=4, run_steps=100)
    sim = Sim(chooser, {"slem": 1.0, "tli": 0.6, "slrs": 1.0})
    ran = [sim.step(["a"], [0.0])[0] for _ in range(60)]
    # Turns of two steps (the first step's verdict arrives with the second), then tli.
    assert ran[:16] == ["slem", "slem", "tli", "tli"] * 4
    assert ran[17:] == ["tli"] * 43
    assert chooser.rates()["greedy"] == pytest.approx({"slem": 2.0, "tli": 2 / 0.6})
    assert chooser.chosen["tli"] > chooser.chosen["slem"]


def test_turns_cancel_what_the_text_does() -> None:
    """The text's own predictability swings the tokens per step far more than the rules
    differ; rules taking turns see the same swings, so the faster one still wins."""
    rng = random.Random(0)
    easy = [rng.choice([1, 1, 2, 5, 5]) for _ in range(400)]  # stretches of easy and hard text
    wins = 0
    for trial in range(100):
        chooser = RuleChooser(("slem", "tli"), ("tli",), run_steps=10_000)  # the default comparison
        sim = Sim(chooser, {"slem": 1.0, "tli": 1.12}, tokens=lambda step, t=trial: easy[(step // 3 + 7 * t) % 400])
        for _ in range(100):
            sim.step(["a"], [0.0])
        assert not chooser.kinds["greedy"].comparing
        wins += chooser.kinds["greedy"].best == "slem"
    assert wins >= 80, wins  # 12% apart, under swings of 5x: a coin would win 50


def _compare(tli_speedup: float, tokens_per_step: list[int] | None) -> tuple[int, list[int]]:
    """100 default comparisons (slem the prior) on text whose tokens per step follow
    ``tokens_per_step`` in stretches of three steps (None: always 2): in how many auto
    moved to tli, and how many steps each comparison took."""
    switched, lengths = 0, []
    for trial in range(100):
        chooser = RuleChooser(("slem", "tli"), ("tli",), run_steps=10_000)
        seq = tokens_per_step
        tokens = (lambda step, t=trial: seq[(step // 3 + 7 * t) % len(seq)]) if seq else (lambda step: 2)
        sim = Sim(chooser, {"slem": 1.0, "tli": 1.0 / tli_speedup}, tokens=tokens)
        while chooser.kinds["greedy"].comparing:
            sim.step(["a"], [0.0])
        lengths.append(len(sim.log))
        switched += chooser.kinds["greedy"].best == "tli"
    return switched, sorted(lengths)


def test_a_lead_inside_the_comparisons_own_noise_keeps_the_prior() -> None:
    """tli 18% faster, beyond the 10% switch margin. Steady steps resolve that, and tli
    runs. When a step's tokens swing from 1 to 5, as at batch 1, 24 counted steps per rule
    cannot tell 18% from chance: a fixed margin alone moved to tli in 73 comparisons of
    100, and on a real engine it moved to tli where slem was the faster. The prior stays
    unless the lead clears the comparison's own standard error; a 60% lead still does."""
    rng = random.Random(0)
    swings = [rng.choice([1, 1, 2, 5, 5]) for _ in range(400)]
    assert _compare(1.18, None)[0] == 100
    assert _compare(1.18, swings)[0] <= 25
    assert _compare(1.6, swings)[0] >= 70
    assert _compare(1 / 1.12, swings)[0] <= 2


def test_a_challenger_clearly_behind_ends_the_comparison_early() -> None:
    """A comparison runs half its steps on the slower rule and pays a catch-up at every
    turn, and a batch-1 job of a few hundred steps may be mostly comparison. So once each
    rule has ``min_steps`` counted steps, a challenger trailing by more than a standard
    error is let go: with tli 12% slower on text of 1-3 tokens per step, half of the
    comparisons end by about 50 steps (measured 49) instead of the window's 97, and the prior is kept."""
    rng = random.Random(1)
    text = [rng.choice([1, 2, 2, 3]) for _ in range(400)]
    switched, lengths = _compare(1 / 1.12, text)
    assert switched == 0
    assert lengths[50] <= 60 and lengths[-1] <= 97
    assert _compare(1 / 1.12, None)[1] == [41] * 100  # steady: min_steps (10 counted each) suffice


def test_a_candidate_far_behind_ends_the_comparison_early() -> None:
    chooser = RuleChooser(("slem", "tli"), ("tli",), window=24, min_steps=4, run_steps=100)
    sim = Sim(chooser, {"slem": 0.5, "tli": 1.0})  # tli emits half as fast
    ran = [sim.step(["a"], [0.0])[0] for _ in range(40)]
    assert ran[:16] == ["slem", "slem", "tli", "tli"] * 4
    assert ran[17:] == ["slem"] * 23


def test_compares_again_and_follows_a_change() -> None:
    chooser = RuleChooser(("slem", "tli"), ("tli",), window=4, min_steps=4, run_steps=20)
    sim = Sim(chooser, {"slem": 0.5, "tli": 1.0})
    for _ in range(40):
        sim.step(["a"], [0.0])
    assert chooser.kinds["greedy"].best == "slem"
    sim.seconds = {"slem": 2.0, "tli": 1.0}  # the workload changes: tli is now faster
    # Three comparisons: the one spanning the change reads the drift as noise, and the
    # weighed memory of the old rates takes another to fade.
    for _ in range(100):
        sim.step(["a"], [0.0])
    assert chooser.kinds["greedy"].best == "tli"
    assert sum(r == ["tli"] for r in sim.log[-20:]) >= 14


def test_kinds_choose_apart_and_a_batch_mixes_rules() -> None:
    chooser = RuleChooser(("slem", "tli"), ("tli", "slrs"), window=2, min_steps=2, run_steps=100)
    sim = Sim(chooser, {"slem": 0.5, "tli": 1.0, "slrs": 0.5})
    rules = sim.step(["g", "s"], [0.0, 0.8])
    assert rules == ["slem", "tli"]  # each kind's first candidate
    for _ in range(30):
        rules = sim.step(["g", "s"], [0.0, 0.8])
    assert rules[0] in ("slem", "tli") and rules[1] in ("tli", "slrs")
    assert {r[1] for r in sim.log} == {"tli", "slrs"}
    assert {r[0] for r in sim.log} == {"slem", "tli"}


@pytest.mark.parametrize("case", ["prefill", "newcomer"])
def test_steps_that_say_nothing_about_the_rule_are_not_counted(case: str) -> None:
    chooser = RuleChooser(("slem", "tli"), ("tli",), window=2, min_steps=2)
    sim = Sim(chooser, {"slem": 1.0, "tli": 1.0})
    sim.step(["a"], [0.0])
    for _ in range(10):
        if case == "prefill":
            sim.step(["a"], [0.0], sampled=[0])
        else:
            sim.chooser.observe(sim.now, ["a", "b"], [2, 2])
            sim.chooser.record(["a"], [0.0], ["slem"], [2])
            sim.now += 1.0
    kind = chooser.kinds["greedy"]
    assert all(t.steps == 0 for t in kind.tallies.values()) and kind.comparing
    assert kind.current == "slem"


def test_a_single_candidate_is_always_chosen() -> None:
    chooser = RuleChooser(("tli",), ("tli",), window=1, min_steps=1, run_steps=1)
    sim = Sim(chooser, {"tli": 1.0})
    assert {r for _ in range(10) for r in sim.step(["a", "b"], [0.0, 1.0])} == {"tli"}


def test_a_close_challenger_does_not_replace_the_incumbent() -> None:
    """The listed order is the measured prior: a challenger 5% faster (inside what a few
    dozen steps resolve) leaves it; one 25% faster replaces it."""
    for tli_seconds, winner in ((0.95, "slem"), (0.8, "tli")):
        chooser = RuleChooser(("slem", "tli"), ("tli",), window=8, min_steps=8, switch_margin=0.1)
        sim = Sim(chooser, {"slem": 1.0, "tli": tli_seconds})
        for _ in range(40):
            sim.step(["a"], [0.0])
        assert not chooser.kinds["greedy"].comparing and chooser.kinds["greedy"].best == winner


def test_a_rule_the_budget_will_not_draft_is_measured_at_plain_speed() -> None:
    """The budget may leave a dear rule's turns undrafted (k = 0): those steps still end
    the turn, at what they emit (one token per row), so the comparison never stalls."""
    chooser = RuleChooser(("tli", "slrs"), ("tli",), window=6, min_steps=6, switch_margin=0.1)
    now = 0.0
    for _ in range(30):
        chooser.observe(now, ["a"], [1 if chooser._last and chooser._last.proposed[0] == 0 else 3])
        rule = chooser.choose([0.0])[0]
        chooser.record(["a"], [0.0], [rule], [0 if rule == "slrs" else 3])
        now += 1.0
    kind = chooser.kinds["greedy"]
    assert not kind.comparing and kind.best == "tli"
    assert kind.rates == pytest.approx({"tli": 3.0, "slrs": 1.0})


def test_a_rules_catch_up_debt_is_charged_to_it() -> None:
    """A tli step leaves the draft states a catch-up the next step pays. Counting only a
    turn's second step charges that debt to tli itself (its second step pays its
    first's), so slem, no slower per step and leaving no debt, wins."""
    chooser = RuleChooser(("tli", "slem"), ("tli",), window=8, min_steps=8, switch_margin=0.1)
    sim = Sim(chooser, {"slem": 1.0, "tli": 1.0}, debt={"tli": 0.5})
    for _ in range(40):
        sim.step(["a"], [0.0])
    kind = chooser.kinds["greedy"]
    assert not kind.comparing and kind.best == "slem"
    assert kind.rates == pytest.approx({"tli": 2 / 1.5, "slem": 2.0})


def test_a_challenger_the_budget_will_not_draft_is_declined_at_no_cost() -> None:
    """At batch 1, T = 1 the budget left slrs's turns undrafted: they ran at plain speed,
    a cost with nothing to learn (the budget drafts the incumbent only where that beats
    plain). Asked first, the budget declines those turns: slrs runs no step, the
    comparison ends after ``min_steps`` declines, and a high rate slrs kept from an
    earlier comparison cannot make it win one it sat out. At the next comparison it is
    asked again, and takes its turns once the budget would draft it."""
    chooser = RuleChooser(("slem",), ("tli", "slrs"), window=24, min_steps=10, run_steps=50)
    chooser.kinds["sampled"].rates = {"tli": 2.0, "slrs": 9.0}
    chooser.kinds["sampled"].noise = {"tli": 0.01, "slrs": 0.01}
    sim = Sim(chooser, {"tli": 1.0, "slrs": 1.0})
    will_draft = {"slrs": False}
    original = chooser.choose
    chooser.choose = lambda temps: original(temps, lambda rules: will_draft.get(rules[0], True))
    ran = [sim.step(["a"], [1.0])[0] for _ in range(21)]  # tli's turns; the 10th decline ends it
    kind = chooser.kinds["sampled"]
    assert ran == ["tli"] * 21 and not kind.comparing and kind.best == "tli"
    assert kind.rates["slrs"] == 9.0 and not kind.declined
    will_draft["slrs"] = True
    ran = [sim.step(["a"], [1.0])[0] for _ in range(60)]
    assert "slrs" in ran[50:]


def test_rows_whose_request_named_a_rule_are_counted_but_not_compared() -> None:
    """A named rule's rows draft (``chosen``) but say nothing of the chooser's own pick:
    their tokens leave every kind's tally alone, so a comparison is neither skewed by,
    nor stalled on, a rule it never chose (here the named row comes first in the batch,
    where a kind's step used to be attributed to its first row's rule)."""
    chooser = RuleChooser(("slem", "tli"), ("tli",), window=4, min_steps=4, run_steps=1)
    for step in range(12):
        chooser.observe(float(step), ["named", "a"], [1, 3])
        rules = chooser.choose([0.0, 0.0])
        chooser.record(["named", "a"], [0.0, 0.0], ["union", rules[1]], [2, 2], [True, False])
    greedy = chooser.kinds["greedy"]
    assert chooser.chosen["union"] == 12 and "union" not in greedy.tallies
    assert all(tokens == 3 for t in greedy.tallies.values() for tokens, _ in t.per_step)
