"""A job's phases share one engine, so the proposer's counters (cumulative from the
engine's start) must be split per phase: each phase reports what changed since the last."""

from __future__ import annotations

from hetero_harness.evaluation import _since, per_phase


def test_a_phase_reports_its_own_share_of_the_counters() -> None:
    first = {"draft_lengths": {"1": 10, "2": 4}, "exploration": {"warmup": 6, "probe_loss_s": 0.5},
             "rules_chosen": {"slem": 7}}
    second = {"draft_lengths": {"1": 12, "2": 9, "4": 3}, "exploration": {"warmup": 6, "probe_loss_s": 0.75},
              "rules_chosen": {"slem": 9, "tli": 2}}
    assert _since(second, first) == {"draft_lengths": {"1": 2, "2": 5, "4": 3},
                                     "exploration": {"warmup": 0, "probe_loss_s": 0.25},
                                     "rules_chosen": {"slem": 2, "tli": 2}}


def test_every_phase_is_measured_from_the_one_before_not_from_its_share() -> None:
    # The engine's cumulative counters after each of three phases.
    engine = [{"draft_lengths": {"1": 10}, "tok_per_s": 2.0}, {"draft_lengths": {"1": 15}, "tok_per_s": 3.0},
              {"draft_lengths": {"1": 16, "4": 2}, "tok_per_s": 4.0}]
    phases = per_phase(engine)
    assert [p["draft_lengths"] for p in phases] == [{"1": 10}, {"1": 5}, {"1": 1, "4": 2}]
    assert [p["tok_per_s"] for p in phases] == [2.0, 3.0, 4.0]  # a phase's own figures are kept


def test_values_that_are_not_counts_are_kept() -> None:
    assert _since({"dtype": "float32", "on": True, "n": 3}, {"dtype": "bfloat16", "on": False, "n": 1}) == {
        "dtype": "float32", "on": True, "n": 2}
