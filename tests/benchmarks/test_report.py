"""``benchmarks/report.py``, the module every benchmark script writes its results
through: the table cells a reader compares configurations by, and the files (JSON with
the machine embedded, markdown, plot) in the folder asked for. Pure Python, no engine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:  # the scripts import it as their sibling
    sys.path.insert(0, str(BENCHMARKS))

import report  # noqa: E402


def test_cells() -> None:
    assert report.ratio_cell(1.634, 1.531, 1.729) == "1.63x (1.53-1.73)"
    assert report.ratio_cell(1.21, 1.21, 1.22, note="2 runs") == "1.21x (1.21-1.22; 2 runs)"
    assert report.ratio_cell(0.47, note="one run") == "0.47x (one run)"
    assert report.ratio_cell(0.9) == "0.90x" and report.ratio_cell(None, 1.0, 2.0) == "-"
    assert report.range_cell(0.78, 1.1) == "0.78-1.10" and report.range_cell(None, 1.0) == "-"
    assert report.runs_cell([7.0, 9.5, 9.9]) == "7.00 / 9.50 / 9.90"
    assert report.fmt(None, ".1%") == "-" and report.fmt(0.5, ".1%") == "50.0%"


def test_median_and_spread_skip_missing_runs() -> None:
    assert report.median([3.0, None, 1.0, 2.0]) == 2.0 and report.median([None]) is None
    assert report.spread([2.0, 4.0, None], base=2.0) == (1.0, 2.0)
    assert report.spread([], base=2.0) is None and report.spread([1.0], base=None) is None
    assert report.ratio([7.0, 9.5, 9.9], 9.0) == pytest.approx((9.5 / 9.0, 7.0 / 9.0, 9.9 / 9.0))
    assert report.ratio([1.0], None) == (None, None, None)


def test_table_from_lists_and_dicts() -> None:
    assert report.table(["a", "b", "c"], [[1, "", None]]) == ["| a | b | c |", "|---|---|---|", "| 1 | | - |"]
    assert report.table(None, [{"x": "1.00x", "y": 2}]) == ["| x | y |", "|---|---|", "| 1.00x | 2 |"]
    with pytest.raises(ValueError):
        report.table(["a", "b"], [[1]])


def test_write_report_embeds_the_machine(tmp_path: Path) -> None:
    md = ["Caption.", "", *report.table(["config", "speedup"], [["auto", report.ratio_cell(1.5, 1.4, 1.6)]])]
    path = report.write_report("t", {"meta": report.meta({"n": 1}, note="x"), "rows": [{"p": Path("/m")}]}, md,
                               title="T", notes=["A note."], out=tmp_path)
    data = json.loads(path.read_text())
    assert data["rows"] == [{"p": "/m"}] and data["meta"]["args"] == {"n": 1} and data["meta"]["note"] == "x"
    env = data["environment"]
    assert {"cpu", "cpu_features", "cores", "torch", "vllm", "git_commit", "git_dirty", "written"} <= set(env)
    assert set(env["cpu_features"]) <= set(report.KERNEL_FEATURES)
    assert env["cores"] >= 1 and env["cpu"]
    assert (tmp_path / "t.md").read_text() == ("# T\n\nCaption.\n\n| config | speedup |\n|---|---|\n"
                                               "| auto | 1.50x (1.40-1.60) |\n\nA note.\n")
    assert report.read_result("t", out=tmp_path)["rows"] == [{"p": "/m"}]


def test_the_results_folder_follows_the_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(report.RESULTS_ENV, str(tmp_path / "r"))
    assert report.results_dir() == tmp_path / "r" and report.results_dir("x") == Path("x")
    report.write_report("u", {"rows": []}, "Text only.\n")
    assert (tmp_path / "r" / "u.md").read_text() == "Text only.\n"
    assert not (tmp_path / "r" / "v.md").exists()
    report.write_report("v", {"rows": []})  # JSON alone
    assert (tmp_path / "r" / "v.json").exists() and not (tmp_path / "r" / "v.md").exists()
    monkeypatch.delenv(report.RESULTS_ENV)
    assert report.results_dir() == report.RESULTS


def test_figure_saves_only_a_finished_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    with report.figure("p", 1, 2, out=tmp_path, figsize=(4, 2), squeeze=False) as (fig, axes):
        axes[0][1].plot([1, 2], [3, 4])
    assert (tmp_path / "p.png").stat().st_size > 0
    with pytest.raises(RuntimeError), report.figure("q", out=tmp_path) as (fig, ax):
        raise RuntimeError("drawing failed")
    assert not (tmp_path / "q.png").exists()


def test_every_append_stays_on_record() -> None:
    first = report.meta({"name": "x"})
    again = report.meta({"name": "x", "append": True})
    once = report.appended_meta(first, again)
    twice = report.appended_meta(once, again)
    day = again["date"]
    assert once[f"appended {day}"] == twice[f"appended {day} (2)"] == {"name": "x", "append": True}
    assert twice["args"] == {"name": "x"}
