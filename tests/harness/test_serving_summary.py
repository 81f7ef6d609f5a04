"""The serving benchmark's bookkeeping: the cells it runs, its medians over interleaved
rounds (the figures the 0.95x-of-plain bar is judged by), and the environment its
servers get. A wrong median or a dropped run here would misstate every serving result."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from hetero_harness.server_process import ServerProcess

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "serving_benchmark.py"


@pytest.fixture(scope="module")
def bench():
    if str(SCRIPT.parent) not in sys.path:  # the script imports its sibling report.py, as when run
        sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("serving_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(bench, conf: str, rnd: int, tps: float, tpot: float, **extra) -> dict:
    return {"configuration": conf, "round": rnd, "temperature": 1.0, "concurrency": 16, "output_throughput": tps,
            "median_ttft_ms": 100.0 * (rnd + 1), "p99_ttft_ms": None, "median_tpot_ms": tpot, "p99_tpot_ms": None,
            "failed": 0, "duration": 200.0, **extra}


def test_cells_come_from_the_list_or_the_product(bench) -> None:
    args = argparse.Namespace(cells=["0:1", "1:16"], temperatures=[0.0], concurrency=[4])
    assert bench.cell_list(args) == [(0.0, 1), (1.0, 16)]
    args.cells = None
    args.temperatures, args.concurrency = [0.0, 1.0], [1, 4]
    assert bench.cell_list(args) == [(0.0, 1), (0.0, 4), (1.0, 1), (1.0, 4)]


def test_rounds_are_summarized_by_their_medians(bench, tmp_path: Path, monkeypatch) -> None:
    rows = [
        _row(bench, bench.PLAIN, 0, 8.0, 1200.0),
        _row(bench, bench.OURS, 0, 7.0, 1300.0, rules={"tli": 3}, drafter_s=1.0),
        _row(bench, bench.PLAIN, 1, 10.0, 1100.0),
        _row(bench, bench.OURS, 1, 9.5, 1150.0, rules={"tli": 2, "slrs": 1}, drafter_s=3.0),
        _row(bench, bench.PLAIN, 2, 9.0, 1000.0),
        _row(bench, bench.OURS, 2, 9.9, 1250.0, rules={}, drafter_s=2.0),
    ]
    summary = {r["configuration"]: r for r in bench.summarize(rows)}
    plain, ours = summary[bench.PLAIN], summary[bench.OURS]
    assert plain["runs"] == [8.0, 10.0, 9.0] and plain["output_throughput"] == 9.0
    assert ours["output_throughput"] == 9.5 and ours["median_tpot_ms"] == 1250.0 and ours["drafter_s"] == 2.0
    assert ours["rules"] == {"tli": 5, "slrs": 1}
    assert ours["p99_tpot_ms"] is None and plain["median_ttft_ms"] == 200.0

    monkeypatch.setattr(bench, "OUT", tmp_path)
    meta = {"args": {"skip": 40, "output_len": 64, "min_requests": 8, "warmups": 2, "k": 4, "repeats": 3,
                     "server_env": ["OMP_NUM_THREADS=2"]},
            "target": "/m/qwen", "draft": "/m/smol", "date": "today", "machine": "x86_64"}
    bench.write_markdown("t", list(summary.values()), meta)
    table = (tmp_path / "t.md").read_text()
    line = next(x for x in table.splitlines() if "| ours" in x)
    # 9.5 / 9.0 over plain's median; spread: 7.0 / 9.0 to 9.9 / 9.0.
    assert "| 7.00 / 9.50 / 9.90 | 1.06x | 0.78-1.10 |" in line
    assert "`OMP_NUM_THREADS=2` in its environment" in table and "3 round(s)" in table


def test_server_environment_is_added_to_the_default_one(tmp_path: Path, monkeypatch) -> None:
    seen = {}

    def fake_popen(cmd, **kwargs):
        seen.update(kwargs["env"])
        raise RuntimeError("not started")

    monkeypatch.setattr(subprocess, "Popen", fake_popen)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    server = ServerProcess("m", [], tmp_path / "log", env={"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"})
    with pytest.raises(RuntimeError, match="not started"):
        server.launch()
    assert seen["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in seen  # the server keeps vLLM's own process layout
