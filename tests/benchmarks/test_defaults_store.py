"""The defaults matrix's store (``benchmarks/matrix.py``): a run added to it replaces the
cells it measured and nothing else, each ratio stays against plain decoding of its own
run, and the table in ``benchmarks/results/`` is the store's. Pure Python, no engine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:  # the scripts import their siblings
    sys.path.insert(0, str(BENCHMARKS))

import matrix  # noqa: E402


def _run(config: str, tps: float | None, batch: int = 1, temp: float = 0.0) -> dict:
    run = {"target": "/models/qwen2.5-coder-1.5b", "batch_size": batch, "temperature": temp, "config": config}
    return {**run, "tok_per_s": tps} if tps is not None else {**run, "error": "engine died"}


def _result(runs: list[dict], date: str = "2026-01-01") -> dict:
    return {"meta": {"args": {"batch_sizes": [1]}, "date": date}, "runs": runs,
            "environment": {"cpu": "AMD EPYC", "git_commit": "0123456789abcdef"}}


def test_a_later_run_replaces_the_cells_it_measured_and_only_those() -> None:
    store = matrix.add_run(matrix.empty_store(), "old", _result(
        [_run("plain", 2.0), _run("auto", 3.0), _run("slem", 2.2), _run("plain", 2.0, 8), _run("auto", 2.0, 8)]),
        commit="aaaaaaa")
    store = matrix.add_run(store, "new", _result([_run("plain", 4.0), _run("plain", 6.0), _run("auto", 6.0),
                                                  _run("auto", 4.0), _run("tli", 9.0, 8)]))  # batch 8: no plain
    latest = matrix.store_measurements(store)
    assert latest[("qwen2.5-coder-1.5b", 1, 0.0, "auto")]["file"] == "new"
    assert latest[("qwen2.5-coder-1.5b", 1, 0.0, "auto")]["speedup"] == pytest.approx(1.0)  # over new's plain
    slem = latest[("qwen2.5-coder-1.5b", 1, 0.0, "slem")]
    assert slem["file"] == "old" and slem["speedup"] == pytest.approx(1.1)  # over old's plain, not new's
    assert latest[("qwen2.5-coder-1.5b", 8, 0.0, "auto")]["file"] == "old"
    assert ("qwen2.5-coder-1.5b", 8, 0.0, "tli") not in latest  # no plain beside it in its run
    kept = {(r["source"], r["batch_size"], r["config"]) for r in store["runs"]}
    assert ("old", 1, "auto") not in kept and ("new", 8, "tli") not in kept
    assert {("old", 1, "plain"), ("old", 1, "slem"), ("old", 8, "plain"), ("new", 1, "plain")} <= kept
    assert [(s["name"], s["commit"]) for s in store["sources"]] == [("old", "0123456"), ("new", "0123456")]


def test_a_source_whose_every_cell_was_replaced_leaves_and_a_rerun_replaces_itself() -> None:
    store = matrix.add_run(matrix.empty_store(), "a", _result([_run("plain", 2.0), _run("auto", 3.0)]))
    store = matrix.add_run(store, "b", _result([_run("plain", 2.0), _run("auto", 2.0)]))
    assert [s["name"] for s in store["sources"]] == ["b"]
    assert {r["source"] for r in store["runs"]} == {"b"}
    store = matrix.add_run(store, "b", _result([_run("plain", 2.0), _run("auto", 2.0), _run("auto", 4.0)]))
    assert matrix.store_measurements(store)[("qwen2.5-coder-1.5b", 1, 0.0, "auto")]["runs"] == 2


def test_add_and_build_writes_the_store_and_the_table(tmp_path: Path) -> None:
    (tmp_path / "run1.json").write_text(json.dumps(_result([_run("plain", 2.0), _run(matrix.BUILTIN, None)])))
    text = matrix.add_and_build(["run1"], out=tmp_path)
    assert "failed to start (1 run)" in text and "run1 (2026-01-01)" in text
    assert matrix.read_store(tmp_path)["sources"][0]["meta"]["args"] == {"batch_sizes": [1]}
    assert json.loads((tmp_path / "defaults_matrix.json").read_text())["store"] == "defaults_matrix_store.json"


def test_the_kept_table_is_the_stores() -> None:
    """``defaults_matrix.{json,md}`` are rebuilt from the store whenever it changes."""
    store = matrix.read_store()
    rows = json.loads(json.dumps(matrix.cells(matrix.store_measurements(store))))
    assert rows == matrix.read_result("defaults_matrix")["cells"]
    assert matrix.to_markdown(matrix.cells(matrix.store_measurements(store)), store["sources"]) == \
        (matrix.results_dir() / "defaults_matrix.md").read_text()
