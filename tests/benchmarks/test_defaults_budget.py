"""``benchmarks/defaults.py``'s budget table (the draft lengths each configuration chose,
summed over its runs, and what the adaptive budget's exploration cost, as a share of
the timed seconds) and its ``--auto-variant`` parsing. Pure Python, no engine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:  # the scripts import their siblings
    sys.path.insert(0, str(BENCHMARKS))

import defaults  # noqa: E402


def _run(config: str, lengths: dict[str, int], exploration: dict | None, elapsed: float) -> dict:
    return {"target": "qwen2.5-coder-1.5b", "batch_size": 1, "temperature": 0.0, "config": config,
            "draft_lengths": lengths, "exploration": exploration, "elapsed_s": elapsed}


def test_lengths_are_summed_over_runs_and_exploration_is_a_share_of_the_timed_seconds() -> None:
    explored = {"warmup": 4, "probes": 3, "probe_loss_s": 0.5, "skipped": 7}
    runs = [_run("auto", {"2": 30, "4": 10}, explored, 25.0), _run("auto", {"2": 50, "0": 10}, explored, 25.0),
            _run("fixed k=2", {"2": 90}, None, 40.0),
            {"target": "qwen2.5-coder-1.5b", "batch_size": 1, "temperature": 0.0, "config": "auto", "error": "died"}]
    lines = defaults.budget_split(runs)
    auto = next(line for line in lines if "| auto |" in line)
    assert "| 100 | 0:10% 2:80% 4:10% | 8 / 6 / 2.0% / 14 |" in auto, auto
    fixed = next(line for line in lines if "| fixed k=2 |" in line)
    assert fixed.endswith("| 90 | 2:100% | - |"), fixed


def test_no_table_without_recorded_lengths() -> None:
    assert defaults.budget_split([_run("plain", {}, None, 10.0)]) == []


def test_an_auto_variant_label_may_hold_an_equals_sign() -> None:
    assert defaults.auto_variant('fixed k=2={"num_speculative_tokens": 2}') == ("fixed k=2",
                                                                               {"num_speculative_tokens": 2})
    for bad in ("no settings", "k=2={not json", '={"a": 1}'):
        with pytest.raises(SystemExit, match="--auto-variant"):
            defaults.auto_variant(bad)
