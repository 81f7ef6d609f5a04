"""A job's phases share one engine, so the proposer's counters (cumulative from the
engine's start) must be split per phase: each phase reports what changed since the last."""

from __future__ import annotations

from hetero_harness.evaluation import _since


def test_a_phase_reports_its_own_share_of_the_counters() -> None:
    first = {"draft_lengths": {"1": 10, "2": 4}, "exploration": {"warmup": 6, "probe_loss_s": 0.5},
             "rules_chosen": {"slem": 7}}
    second = {"draft_lengths": {"1": 12, "2": 9, "4": 3}, "exploration": {"warmup": 6, "probe_loss_s": 0.75},
              "rules_chosen": {"slem": 9, "tli": 2}}
    assert _since(second, first) == {"draft_lengths": {"1": 2, "2": 5, "4": 3},
                                     "exploration": {"warmup": 0, "probe_loss_s": 0.25},
                                     "rules_chosen": {"slem": 2, "tli": 2}}


def test_values_that_are_not_counts_are_kept() -> None:
    assert _since({"dtype": "float32", "on": True, "n": 3}, {"dtype": "bfloat16", "on": False, "n": 1}) == {
        "dtype": "float32", "on": True, "n": 2}
