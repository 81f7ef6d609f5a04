"""Core leases (``hetero_harness/cores.py``): what lets two e2e modules run side by side
without two engines on one core."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from hetero_harness import cores


@pytest.fixture(autouse=True)
def _own_lease_dir(monkeypatch, tmp_path):
    """Leases of this test only: an e2e run on the machine must neither block nor see them."""
    monkeypatch.setattr(cores, "LEASE_DIR", tmp_path)
    return tmp_path


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(cores, "machine_cores", lambda: [0, 1])


def test_leases_are_exclusive_and_released(two_cores) -> None:
    a = cores.lease(1)
    b = cores.lease(1)
    assert sorted(a.cores + b.cores) == [0, 1]
    got: list[list[int]] = []
    waiter = threading.Thread(target=lambda: got.append(cores.lease(1).cores))
    waiter.start()
    time.sleep(4 * cores.POLL_S)
    assert got == [], "a third lease on two cores did not wait"
    b.release()
    waiter.join(5)
    assert got == [b.cores]
    a.release()


def test_all_cores_waits_for_every_holder(two_cores) -> None:
    one = cores.lease(1)
    got: list[list[int]] = []
    waiter = threading.Thread(target=lambda: got.append(cores.lease(None).cores))
    waiter.start()
    time.sleep(4 * cores.POLL_S)
    assert got == []
    one.release()
    waiter.join(5)
    assert got == [[0, 1]]


def test_a_named_core_is_the_one_taken(two_cores) -> None:
    with cores.lease(cores=[0]) as first:
        assert first.cores == [0]
        with cores.lease(1) as other:
            assert other.cores == [1]


def test_a_dead_holder_releases_its_lease(two_cores, _own_lease_dir) -> None:
    """The kernel drops a flock with its holder: a killed test leaves no core taken."""
    code = ("import sys, time; from hetero_harness import cores; cores.LEASE_DIR = __import__('pathlib').Path(sys.argv[1]);"
            "cores.machine_cores = lambda: [0, 1]; held = cores.lease(None); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(_own_lease_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        got: list[list[int]] = []
        waiter = threading.Thread(target=lambda: got.append(cores.lease(1).cores))
        waiter.start()
        time.sleep(4 * cores.POLL_S)
        assert got == []
    finally:
        holder.kill()
        holder.wait()
    waiter.join(5)
    assert got and got[0][0] in (0, 1)
