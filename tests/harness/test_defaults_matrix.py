"""The defaults matrix's bookkeeping (``benchmarks/matrix.py``): which run stands for a
cell, and what its ratio is taken against. A ratio taken across two result files, or an
older run shadowing a newer one, would misstate the issue's matrix."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "matrix.py"


@pytest.fixture(scope="module")
def matrix():
    if str(SCRIPT.parent) not in sys.path:  # the script imports its siblings, as when run
        sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("matrix", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(config: str, tps: float | None, batch: int = 1, temp: float = 0.0) -> dict:
    run = {"target": "/models/qwen2.5-coder-1.5b", "batch_size": batch, "temperature": temp, "config": config}
    return {**run, "tok_per_s": tps} if tps is not None else {**run, "error": "engine died"}


def _file(tmp_path: Path, name: str, runs: list[dict]) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"meta": {}, "runs": runs}))
    return path


def test_ratio_is_to_plain_in_the_same_file_and_the_newest_file_wins(matrix, tmp_path) -> None:
    old = _file(tmp_path, "old", [_run("plain", 2.0), _run("auto", 3.0), _run("slem", 2.2)])
    new = _file(tmp_path, "new", [_run("plain", 4.0), _run("plain", 6.0), _run("auto", 6.0), _run("auto", 4.0)])
    latest = matrix.measurements([old, new])
    auto = latest[("qwen2.5-coder-1.5b", 1, 0.0, "auto")]
    assert auto["file"] == "new"
    assert auto["speedup"] == pytest.approx(1.0)  # median 5.0 over plain's median 5.0, not over old's 2.0
    assert (auto["low"], auto["high"]) == (pytest.approx(0.8), pytest.approx(1.2))
    slem = latest[("qwen2.5-coder-1.5b", 1, 0.0, "slem")]
    assert slem["file"] == "old" and slem["speedup"] == pytest.approx(1.1)


def test_a_file_without_plain_for_a_cell_is_no_measurement(matrix, tmp_path) -> None:
    only = _file(tmp_path, "variants", [_run("auto", 9.0)])
    assert matrix.measurements([only]) == {}


def test_failed_runs_are_shown_not_counted(matrix, tmp_path) -> None:
    path = _file(tmp_path, "f", [_run("plain", 2.0), _run(matrix.BUILTIN, None), _run(matrix.BUILTIN, None),
                                 _run("tli", 3.0), _run("tli", None)])
    latest = matrix.measurements([path])
    assert latest[("qwen2.5-coder-1.5b", 1, 0.0, matrix.BUILTIN)] == {"failed": 2, "file": "f"}
    assert latest[("qwen2.5-coder-1.5b", 1, 0.0, "tli")]["runs"] == 1


def test_every_cell_is_listed_and_the_best_rule_is_chosen(matrix, tmp_path) -> None:
    path = _file(tmp_path, "f", [_run("plain", 2.0, 8, 1.0), _run("tli", 1.8, 8, 1.0), _run("slrs", 2.2, 8, 1.0),
                                 _run(matrix.BUILTIN, None, 8, 1.0)])
    rows = matrix.cells(matrix.measurements([path]))
    assert len(rows) == len(matrix.TARGETS) * 3 * 2
    row = next(r for r in rows if (r["target"], r["batch_size"], r["temperature"]) == ("qwen2.5-coder-1.5b", 8, 1.0))
    assert row["best_rule"] == "slrs" and row["rules_run"] == ["slrs", "tli"] and row["auto"] is None
    text = matrix.to_markdown(rows)
    assert "| qwen2.5-coder-1.5b | 8 | 1 | not measured | `slrs` 1.10x" in text
    assert "failed to start (1 run)" in text
