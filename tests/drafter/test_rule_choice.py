"""``algorithm: auto``'s choice of rule (drafter/rule_choice.py), on a simulated engine:
each rule emits tokens at a known rate, and the chooser must find the faster one per
kind of request, follow a change, and learn only from steps that say something."""

from __future__ import annotations

import pytest

from vllm_hetero_spec.drafter.rule_choice import RuleChooser


class Sim:
    """An engine whose steps take ``seconds[rule]`` and emit 2 tokens per row."""

    def __init__(self, chooser: RuleChooser, seconds: dict[str, float]):
        self.chooser = chooser
        self.seconds = seconds
        self.now = 0.0
        self.log: list[list[str]] = []

    def step(self, req_ids: list[str], temps: list[float], sampled: list[int] | None = None,
             proposed: int = 2) -> list[str]:
        self.chooser.observe(self.now, req_ids, sampled or [2] * len(req_ids))
        rules = self.chooser.choose(temps)
        self.chooser.record(req_ids, temps, rules, [proposed] * len(req_ids))
        self.now += max(self.seconds[r] for r in rules)
        self.log.append(rules)
        return rules


def test_tries_each_candidate_then_keeps_the_fastest() -> None:
    chooser = RuleChooser(("slem", "tli"), ("tli", "slrs"), block=4, trials=2, recheck_every=100, decisive=1.5)
    sim = Sim(chooser, {"slem": 1.0, "tli": 0.5, "slrs": 1.0})
    ran = [sim.step(["a"], [0.0])[0] for _ in range(60)]
    # The listed order first, alternating blocks, then the faster rule for good.
    assert ran[:16] == ["slem"] * 4 + ["tli"] * 4 + ["slem"] * 4 + ["tli"] * 4
    assert ran[16:] == ["tli"] * 44
    assert chooser.rates()["greedy"]["tli"] == pytest.approx(4.0)
    assert chooser.rates()["greedy"]["slem"] == pytest.approx(2.0)
    assert chooser.chosen["tli"] > chooser.chosen["slem"]


def test_rechecks_the_other_rule_and_follows_a_change() -> None:
    chooser = RuleChooser(("slem", "tli"), ("tli",), block=4, trials=1, recheck_every=4)
    sim = Sim(chooser, {"slem": 0.5, "tli": 1.0})
    for _ in range(40):
        sim.step(["a"], [0.0])
    assert sum(r == ["tli"] for r in sim.log[-20:]) >= 4  # rechecked, though slower
    assert sim.log[-1] == ["slem"] or sim.log[-5] == ["slem"]
    sim.seconds = {"slem": 2.0, "tli": 1.0}  # the workload changes: tli is now faster
    for _ in range(80):
        sim.step(["a"], [0.0])
    assert sum(r == ["tli"] for r in sim.log[-20:]) >= 15


def test_kinds_choose_apart_and_a_batch_mixes_rules() -> None:
    chooser = RuleChooser(("slem", "tli"), ("tli", "slrs"), block=2, trials=1, recheck_every=100)
    sim = Sim(chooser, {"slem": 0.5, "tli": 1.0, "slrs": 0.5})
    rules = sim.step(["g", "s"], [0.0, 0.8])
    assert rules == ["slem", "tli"]  # each kind's first candidate
    for _ in range(30):
        rules = sim.step(["g", "s"], [0.0, 0.8])
    assert rules[0] in ("slem", "tli") and rules[1] in ("tli", "slrs")
    assert {r[1] for r in sim.log} == {"tli", "slrs"}
    assert {r[0] for r in sim.log} == {"slem", "tli"}


@pytest.mark.parametrize("case", ["prefill", "newcomer", "undrafted"])
def test_steps_that_say_nothing_about_the_rule_are_not_counted(case: str) -> None:
    chooser = RuleChooser(("slem", "tli"), ("tli",), block=2, trials=1)
    sim = Sim(chooser, {"slem": 1.0, "tli": 1.0})
    sim.step(["a"], [0.0], proposed=0 if case == "undrafted" else 2)
    for _ in range(10):
        if case == "prefill":
            sim.step(["a"], [0.0], sampled=[0])
        elif case == "newcomer":
            sim.chooser.observe(sim.now, ["a", "b"], [2, 2])
            sim.chooser.record(["a"], [0.0], ["slem"], [2])
            sim.now += 1.0
        else:
            sim.step(["a"], [0.0], proposed=0)
    assert chooser.kinds["greedy"].steps == 0 and chooser.kinds["greedy"].blocks == 0
    assert chooser.kinds["greedy"].current == "slem"


def test_a_single_candidate_is_always_chosen() -> None:
    chooser = RuleChooser(("tli",), ("tli",), block=1, trials=1, recheck_every=1)
    sim = Sim(chooser, {"tli": 1.0})
    assert {r for _ in range(10) for r in sim.step(["a", "b"], [0.0, 1.0])} == {"tli"}


def test_a_candidate_far_behind_is_not_tried_twice() -> None:
    chooser = RuleChooser(("slem", "tli"), ("tli",), block=4, trials=2, recheck_every=100, decisive=0.25)
    sim = Sim(chooser, {"slem": 0.5, "tli": 1.0})  # tli emits half as fast
    ran = [sim.step(["a"], [0.0])[0] for _ in range(40)]
    assert ran[:8] == ["slem"] * 4 + ["tli"] * 4
    assert ran[8:] == ["slem"] * 32
