"""``benchmarks/advise_check.py``'s bookkeeping: which runs the held-out check makes, and
how each projected option finds its measured speedup. Pure Python, no engine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:  # the scripts import their siblings
    sys.path.insert(0, str(BENCHMARKS))

import advise_check  # noqa: E402


def _pin(rule: str, t: float, b: int, k: int, tokens: int = 64) -> dict:
    return {"rule": rule, "T": t, "b": b, "k": k, "max_tokens": tokens}


def test_options_projected_at_k0_share_one_run_and_drafting_ones_keep_theirs() -> None:
    pins = [_pin("slem", 0.0, 1, 2), _pin("tli", 0.0, 1, 2), _pin("slem", 0.0, 8, 0), _pin("tli", 0.0, 8, 0),
            _pin("slrs", 1.0, 1, 0), _pin("tli", 1.0, 1, 3), _pin("tli", 0.0, 8, 0, 256)]
    assert advise_check.distinct_runs(pins) == [pins[0], pins[1], pins[2], pins[4], pins[5], pins[6]]


def _run(rule: str | None, t: float, b: int, k: int | None, tokens_per_s: float, round_: int,
         tokens: int = 64) -> dict:
    return {"rule": rule, "T": t, "b": b, "k": k, "lengths": [tokens_per_s * 10], "wall": 10.0, "round": round_,
            "max_tokens": tokens}


def test_each_option_is_measured_against_its_own_rounds_plain_run() -> None:
    measured = {
        "plain 1": {"runs": [_run(None, 0.0, 8, None, 4.0, 0)]},
        "plain 2": {"runs": [_run(None, 0.0, 8, None, 5.0, 1)]},
        "d (pinned)": {"runs": [_run("slem", 0.0, 8, 0, 4.4, 0), _run("slem", 0.0, 8, 0, 4.5, 1),
                                _run("tli", 0.0, 8, 2, 6.0, 0), _run("tli", 0.0, 8, 2, 7.5, 1),
                                _run("tli", 0.0, 8, 2, 8.0, 0, 256)]},
    }
    assert advise_check.speedups(measured, "d (pinned)", "tli", 0.0, 8, 64, 2) == [1.5, 1.5]
    # tli projected at k = 0 reads the engine's one run drafting nothing, pinned to slem.
    assert [round(x, 3) for x in advise_check.speedups(measured, "d (pinned)", "tli", 0.0, 8, 64, 0)] == [1.1, 0.9]
    assert advise_check.speedups(measured, "d (pinned)", "slrs", 1.0, 8, 64, 0) == []  # never measured
    # a length is compared with plain's run at that length only: none was measured at 256
    assert advise_check.speedups(measured, "d (pinned)", "tli", 0.0, 8, 256, 2) == []


def test_an_engine_is_read_from_the_newest_run_that_has_it_against_that_runs_plain() -> None:
    """A rerun of one engine: the other options keep the earlier run's measurement,
    each over its own run's plain decoding; an engine in no run is listed as missing."""
    def option(drafter: str, rule: str, k: int, projected: float) -> dict:
        return {"drafter": drafter, "rule": rule, "temperature": 0.0, "batch": 8, "k": k, "projected": projected,
                "by_length": {"64": projected, "256": projected + 1}}

    advised = {"options": [option("d", "tli", 2, 1.5), option("q", "draft_model", 4, 0.8), option("g", "tli", 0, 1.0)]}
    earlier = {"plain 1": {"runs": [_run(None, 0.0, 8, None, 4.0, 0)]},
               "d (pinned)": {"runs": [_run("tli", 0.0, 8, 2, 6.0, 0)]},
               "q (vLLM draft_model)": {"runs": [_run(None, 0.0, 8, None, 1.0, 0)]},
               "recommended": {"runs": [_run(None, 0.0, 8, None, 1.0, 0)]}}
    newest = {"plain 1": {"runs": [_run(None, 0.0, 8, None, 2.0, 0)]},
              "q (vLLM draft_model)": {"runs": [_run(None, 0.0, 8, None, 1.6, 0)]},
              "recommended": {"runs": [_run(None, 0.0, 8, None, 3.0, 0)]}}
    rows, recommended, missing = advise_check.verdicts(advised, [newest, earlier], [64])
    assert [(r["drafter"], r["measured"], r["projected"]) for r in rows] == [("d", 1.5, 1.5), ("q", 0.8, 0.8)]
    assert recommended[0]["measured"] == 1.5 and recommended[0]["best_option"] == 1.5
    assert missing == [{"drafter": "g", "rule": "tli", "temperature": 0.0, "batch": 8, "k": 0, "tokens": 64}]
    # at 256 tokens nothing ran: every option is missing there, each projected at 256 its own
    rows, recommended, missing = advise_check.verdicts(advised, [newest, earlier], [256])
    assert rows == [] and recommended == [] and len(missing) == 3


def test_earlier_runs_keep_only_the_engines_not_rerun_and_their_plain() -> None:
    newest = {"meta": {"date": "b", "target_dtype": "float32"}, "order": ["plain 1", "a (pinned)", "recommended"],
              "measured": {"plain 1": {}, "a (pinned)": {}, "recommended": {}, "plain 2": {}},
              "earlier_runs": [{"meta": {"date": "a", "target_dtype": "float32"},
                                "measured": {"plain 1": {}, "a (pinned)": {}, "b (pinned)": {}}}]}
    runs = advise_check.earlier_runs(newest, {"a (pinned)", "b (pinned)"}, "float32")
    assert [(r["meta"]["date"], sorted(r["measured"])) for r in runs] == [
        ("b", ["a (pinned)", "plain 1", "plain 2"]), ("a", ["b (pinned)", "plain 1"])]


def test_a_run_in_another_dtype_is_never_read() -> None:
    """An engine measured with the target in bf16 is not set beside a float32 run's
    recommended config (nor one whose run did not record its dtype): it is not measured."""
    newest = {"meta": {"date": "c", "target_dtype": "bfloat16"}, "measured": {"plain 1": {}, "a (pinned)": {}},
              "earlier_runs": [{"meta": {"date": "b"}, "measured": {"plain 1": {}, "a (pinned)": {}}},
                               {"meta": {"date": "a", "target_dtype": "float32"},
                                "measured": {"plain 1": {}, "b (pinned)": {}}}]}
    runs = advise_check.earlier_runs(newest, {"a (pinned)", "b (pinned)"}, "float32")
    assert [(r["meta"]["date"], sorted(r["measured"])) for r in runs] == [("a", ["b (pinned)", "plain 1"])]
    assert advise_check.earlier_runs(newest, {"a (pinned)"}, "float32") == []


def test_advise_measured_in_another_dtype_is_not_reused(tmp_path) -> None:
    """``--reuse-advise`` refuses advise's result where it ran the target in another
    dtype than this machine's engines will: its projections priced another machine."""
    from argparse import Namespace

    args = Namespace(num_prompts=13, max_tokens=48, batch_sizes="1,8", temperatures="0,1", k=4)
    settings = advise_check.advise_settings("qwen2.5-coder-1.5b", args)
    (tmp_path / "advise.json").write_text(json.dumps({"args": {**settings, "dtype": "float32"},
                                                      "target_dtype": "bfloat16"}))
    with pytest.raises(SystemExit, match="measured the target in bfloat16, and this machine runs it in float32"):
        advise_check.reused_advise("qwen2.5-coder-1.5b", args, tmp_path)


def test_batch1_prompts_shortens_the_runs_at_batch_1_only() -> None:
    """``--batch1-prompts``: every engine's batch-1 runs (plain's included, so a speedup
    still compares the same prompts) take the first N held-out prompts; the others all."""
    from argparse import Namespace

    def option(t: float, b: int, k: int) -> dict:
        return {"drafter": "smollm2-135m", "rule": "tli", "temperature": t, "batch": b, "k": k}

    advised = {"args": {"dtype": "auto", "max_model_len": 2048, "seed": 0}, "drafters": ["smollm2-135m"],
               "options": [option(0.0, 1, 2), option(0.0, 8, 0), option(1.0, 1, 3)],
               "recommendation": {"per_drafter": [], "config": {"method": "hetero", "model": "smollm2-135m"}}}
    for few in (4, None):
        args = Namespace(rounds=2, check_lengths=[64, 256], k=4, batch1_prompts=few)
        jobs = advise_check.check_jobs("smollm2-135m", advised, [[{"role": "user", "content": "q"}]] * 8, args)
        assert [label for label, _ in jobs] == ["plain 1", "smollm2-135m (pinned)", "recommended", "plain 2"]
        pins = [p for _, job in jobs for p in job["pins"]]
        assert {p["b"] for p in pins} == {1, 8}
        assert all(p.get("prompts") == (few if p["b"] == 1 else None) for p in pins)


def test_options_that_draft_nothing_count_once_at_the_median_of_their_rounds() -> None:
    """Two engines pinned to k = 0 are one configuration: the best option is not the
    faster of the two (their noise) but the median over both engines' rounds; an
    engine's k = 0 options share its rounds, which count once."""
    def row(drafter: str, rule: str, k: int, rounds: list[float]) -> dict:
        return {"drafter": drafter, "rule": rule, "k": k, "measured": sorted(rounds)[len(rounds) // 2],
                "per_round": rounds}

    idle = [row("a", "slem", 0, [0.96, 1.00]), row("a", "tli", 0, [0.96, 1.00]), row("b", "tli", 0, [1.02, 1.10])]
    assert advise_check.best_option(idle) == (1.01, "drafting nothing (2 engines)")
    assert advise_check.best_option([*idle, row("q", "draft_model", 4, [0.6, 0.7])])[0] == 1.01
    assert advise_check.best_option([*idle, row("a", "tli", 2, [1.2, 1.3])]) == (1.3, "a tli k=2")


def test_every_engine_serves_the_served_prompts_before_its_runs() -> None:
    from argparse import Namespace

    advised = {"args": {"dtype": "auto", "max_model_len": 2048, "seed": 0}, "drafters": ["smollm2-135m"],
               "options": [{"drafter": "smollm2-135m", "rule": "tli", "temperature": 0.0, "batch": 1, "k": 2}],
               "recommendation": {"per_drafter": [], "config": {"method": "hetero", "model": "smollm2-135m"}}}
    args = Namespace(rounds=2, check_lengths=[64], k=4, batch1_prompts=None)
    served = [[{"role": "user", "content": "other"}]]
    jobs = advise_check.check_jobs("smollm2-135m", advised, [[{"role": "user", "content": "q"}]] * 8, args, served)
    assert len(jobs) == 4 and all(job["served"] == served for _, job in jobs)
