"""Engine runs side by side: each child gets a core of its own, held by a lease
(``cores.py``), and everything in the child, not only vLLM's OpenMP threads, stays on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from hetero_harness import cores as cores_module
from hetero_harness import evaluation


def test_parallel_children_get_distinct_cores(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(cores_module, "LEASE_DIR", tmp_path)
    cores = sorted(os.sched_getaffinity(0))
    running: list[int] = []
    seen: list[tuple[int | None, int | None]] = []
    lock, both = threading.Lock(), threading.Barrier(min(2, len(cores)), timeout=10)

    def fake_run_child(job: dict, timeout: float, env: dict | None, core: int | None, charge: str | None) -> dict:
        with lock:
            running.append(core)
            seen.append((job["i"], core))
        if len(cores) > 1:
            both.wait()  # two children really at once
        with lock:
            assert len(set(running)) == len(running), f"two children on one core: {running}"
            running.remove(core)
        return {"i": job["i"]}

    monkeypatch.setattr(evaluation, "_run_child", fake_run_child)
    out = evaluation.run_isolated_many([{"i": i} for i in range(4)])
    assert [r["i"] for r in out] == [0, 1, 2, 3]
    assert all(core in cores for _, core in seen), seen


def test_pin_holds_for_threads_started_later() -> None:
    """A pool a library starts after the pin runs on the pinned core too."""
    core = max(os.sched_getaffinity(0))
    code = (
        "import os, threading\n"
        "from hetero_harness.evaluation import _pin\n"
        f"_pin({core})\n"
        "seen = []\n"
        "t = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))\n"
        "t.start(); t.join()\n"
        "print(json.dumps([seen[0], sorted(os.sched_getaffinity(0))]))\n"
    )
    out = subprocess.run([sys.executable, "-c", "import json\n" + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [[core], [core]]
