"""The hetero:* metrics path: worker slots in a memory-mapped file, read at scrape time."""

from __future__ import annotations

import os
import time

from prometheus_client import CollectorRegistry, generate_latest

from vllm_hetero_spec.metrics import (
    COUNTERS,
    DIR_ENV,
    GAUGES,
    SPAWNER_ENV,
    BoardCollector,
    MetricsBoard,
    metrics_dir,
    read_boards,
)


def test_board_values_reach_the_exposition(tmp_path) -> None:
    board = MetricsBoard({"algorithm": "tli", "k": "4"}, tmp_path)
    board.add("steps", 3)
    board.add("steps", 2)
    board.set("request_states", 7)
    board.set("bridge_seconds", 0.25)
    (labels, values), = read_boards(tmp_path)
    assert labels["algorithm"] == "tli" and labels["pid"].isdigit()
    assert values["steps"] == 5 and values["request_states"] == 7 and values["fallbacks"] == 0
    registry = CollectorRegistry()
    registry.register(BoardCollector(tmp_path))
    text = generate_latest(registry).decode()
    assert 'hetero:steps_total{algorithm="tli",k="4",pid="' in text
    assert all(f"hetero:{name}_total" in text for name in COUNTERS)
    assert all(f"# TYPE hetero:{name} gauge" in text for name in GAUGES)
    board.set("request_states", 0)
    (_, values), = read_boards(tmp_path)
    assert values["request_states"] == 0


def test_half_written_boards_are_skipped(tmp_path) -> None:
    (tmp_path / "worker-1.json").write_text("{not json")
    (tmp_path / "worker-2.json").write_text('{"labels": {}, "slots": ["steps", "fallbacks"]}')
    (tmp_path / "worker-2.bin").write_bytes(b"\0" * 8)
    assert read_boards(tmp_path) == []


def test_the_collector_reports_only_its_own_live_workers(tmp_path) -> None:
    """A board left by another engine (here: pid 1, not a descendant of this process)
    or by a finished one must not be summed into this server's metrics."""
    MetricsBoard({"algorithm": "tli"}, tmp_path).set("request_states", 2)
    foreign = MetricsBoard({"algorithm": "tli"}, tmp_path / "other")
    foreign.set("request_states", 69)
    for suffix in (".json", ".bin"):
        (tmp_path / "other" / f"worker-{os.getpid()}{suffix}").rename(tmp_path / f"worker-1{suffix}")
    assert sorted(v["request_states"] for _, v in read_boards(tmp_path)) == [2, 69]
    own = read_boards(tmp_path, owner=os.getpid())
    assert [v["request_states"] for _, v in own] == [2]
    registry = CollectorRegistry()
    registry.register(BoardCollector(tmp_path))
    assert registry.get_sample_value(
        "hetero:request_states", {"algorithm": "tli", "pid": str(os.getpid())}
    ) == 2
    assert registry.get_sample_value("hetero:request_states", {"algorithm": "tli", "pid": "1"}) is None


_ORPHAN = """
import os, subprocess, sys
if sys.argv[1] == "parent":  # start the writer in a new session and exit: init adopts it
    p = subprocess.Popen([sys.executable, "-c", sys.argv[2], "writer", sys.argv[3]], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    print(p.stdout.readline().decode().strip(), flush=True)
else:
    from pathlib import Path
    from vllm_hetero_spec.metrics import MetricsBoard
    MetricsBoard({"algorithm": "tli"}, Path(sys.argv[2])).set("request_states", 5)
    print(os.getpid(), flush=True)
    sys.stdout.close()
    import time; time.sleep(120)
"""


def _orphan_board(directory, spawner: str) -> int:
    """A board written by a process that is not this one's descendant (as a Ray worker
    is not the server's), started with ``spawner`` as its inherited spawner."""
    import subprocess
    import sys

    env = {**os.environ, SPAWNER_ENV: spawner}
    out = subprocess.run([sys.executable, "-c", _ORPHAN, "parent", _ORPHAN, str(directory)], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    return int(out.stdout.strip())


def test_a_worker_outside_the_process_tree_counts_through_its_spawner(tmp_path) -> None:
    """vLLM's Ray executor starts workers as Ray actors, children of Ray's raylet, not
    of the server: a board counts when its writer's spawner descends from the server,
    and not when it names a stranger."""
    import psutil

    ours = _orphan_board(tmp_path, str(os.getpid()))
    stranger = _orphan_board(tmp_path / "x", "1")
    for suffix in (".json", ".bin"):
        (tmp_path / "x" / f"worker-{stranger}{suffix}").rename(tmp_path / f"worker-{stranger}{suffix}")
    try:
        assert not any(p.pid in (ours, stranger) for p in psutil.Process().children(recursive=True))
        read = {labels["pid"] for labels, _ in read_boards(tmp_path, owner=os.getpid())}
        assert read == {str(ours)}
    finally:
        for pid in (ours, stranger):
            psutil.Process(pid).kill()
    deadline = time.monotonic() + 30  # a kill lands a moment later
    while read_boards(tmp_path, owner=os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert read_boards(tmp_path, owner=os.getpid()) == []  # a dead worker's board is left out


def _report_server_pid(queue) -> None:
    from vllm_hetero_spec.metrics import server_pid

    queue.put((server_pid(), os.getppid(), os.getpid()))


def test_an_api_server_of_several_reports_its_launchers_engines() -> None:
    """With several API server processes (data parallel), the engines are the
    launcher's children, not the API server's: the collector reads on the launcher's
    behalf."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    for name, want_parent in (("ApiServer_1", True), ("EngineCore_DP0", False)):
        proc = ctx.Process(target=_report_server_pid, args=(queue,), name=name)
        proc.start()
        pid, parent, own = queue.get(timeout=120)
        proc.join()
        assert pid == (parent if want_parent else own)


def test_vllms_ray_executor_copies_the_metrics_variables(monkeypatch) -> None:
    """vLLM's Ray executor hands its Ray workers only the variables it copies
    (``get_env_vars_to_copy``): the metrics directory and the spawner must be among them,
    whatever the user listed there already."""
    from vllm.ray.ray_env import get_env_vars_to_copy

    import vllm_hetero_spec.metrics as metrics

    monkeypatch.setenv("VLLM_RAY_EXTRA_ENV_VARS_TO_COPY", "MY_VAR")
    monkeypatch.delenv(SPAWNER_ENV, raising=False)
    monkeypatch.setattr(metrics, "_spawner", None)
    metrics_dir()
    assert {DIR_ENV, SPAWNER_ENV, "MY_VAR"} <= get_env_vars_to_copy()


def test_a_server_of_several_api_processes_serves_our_series(tmp_path, monkeypatch) -> None:
    """With several API servers vLLM sets PROMETHEUS_MULTIPROC_DIR, and ``/metrics`` is
    answered from a per-request registry holding only a MultiProcessCollector (the
    instrumentator's handler, mounted by vLLM's own ``attach_router``): our series must
    be there too. Before the patch they were missing from data-parallel servers."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from vllm.entrypoints.serve.instrumentator.metrics import attach_router

    from vllm_hetero_spec import vllm_integration

    vllm_integration.apply()
    (tmp_path / "prom").mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "prom"))
    MetricsBoard({"algorithm": "tli"}).add("steps", 11)  # this process's own board, in the server's directory
    app = FastAPI()
    attach_router(app)
    text = TestClient(app).get("/metrics").text
    assert f'hetero:steps_total{{algorithm="tli",pid="{os.getpid()}"}} 11.0' in text, text[:2000]
