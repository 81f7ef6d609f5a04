"""A result computed once per run and shared across processes (``hetero_harness/run_once.py``):
what lets the e2e modules comparing with the target alone run in either xdist lane."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetero_harness import cores
from hetero_harness.run_once import SharedRunError, run_once

# A child process asking for the same result: it computes only if nobody has.
_CHILD = """
import json, sys, time
from pathlib import Path
from hetero_harness.run_once import run_once
def compute():
    Path(sys.argv[2]).open("a").write("computed\\n")
    time.sleep(1.0)
    return {"pid": __import__("os").getpid()}
print(json.dumps(run_once(Path(sys.argv[1]), compute)))
"""


def test_the_first_asker_computes_and_the_others_read_it(tmp_path: Path) -> None:
    store, log = tmp_path / "result.json", tmp_path / "computations"
    children = [subprocess.Popen([sys.executable, "-c", _CHILD, str(store), str(log)], stdout=subprocess.PIPE, text=True)
                for _ in range(3)]
    answers = [json.loads(child.communicate(timeout=60)[0]) for child in children]
    assert log.read_text() == "computed\n"
    assert len({json.dumps(result) for result, _ in answers}) == 1
    assert sorted(computed for _, computed in answers) == [False, False, True]


def test_a_failure_is_stored_and_raised_for_every_asker(tmp_path: Path) -> None:
    store = tmp_path / "result.json"

    def fail() -> dict:
        raise ValueError("engine died")

    for compute in (fail, lambda: {"late": True}):  # the second asker does not retry
        with pytest.raises(SharedRunError, match="ValueError: engine died"):
            run_once(store, compute)


def test_asking_while_holding_a_core_lease_is_refused(tmp_path: Path, monkeypatch) -> None:
    """Whoever computes may wait for a core while holding the result's lock: a lease
    holder waiting on that lock would wait on it forever."""
    monkeypatch.setattr(cores, "LEASE_DIR", tmp_path)
    with cores.lease(1):
        with pytest.raises(RuntimeError, match="before taking a core lease"):
            run_once(tmp_path / "result.json", lambda: {})
    assert run_once(tmp_path / "result.json", lambda: {"ok": 1}) == ({"ok": 1}, True)
