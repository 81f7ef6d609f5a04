"""Machine-wide core leases: what lets the e2e pass run two test modules at once without
ever running more engines than the machine has cores.

Why: on two cores most of an engine's life is one core's work (vLLM's CPU worker binds
its OpenMP threads to one core and leaves the other to the scheduler process), so a
module that starts one engine at a time left a core idle for most of the e2e pass. Two
modules side by side fill it, but two engines on one core, or two OpenMP teams spread
over both, ran each of them 2-6x slower. So every engine a test starts first takes a
lease on the core(s) it will run on, and holds it until the engine is gone: a lease on
a core is an exclusive ``flock`` on a file of its own, so the kernel drops it when its
holder dies, and leases work across processes (pytest-xdist workers) with no server.

Fairness: one asker at a time holds the queue lock while it waits for its cores, so a
test that needs both cores is not starved by another that keeps taking one.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO

LEASE_DIR = Path(tempfile.gettempdir()) / "vllm_hetero_spec_cores"
POLL_S = 0.2
TRACE_ENV = "HETERO_LEASE_TRACE"
#: Leases held per thread (:func:`held_by_this_thread`).
_HELD: Counter[int] = Counter()
_HELD_LOCK = threading.Lock()


def _trace(event: str, cores: Iterable[int]) -> None:
    """With ``HETERO_LEASE_TRACE=path``, one line per lease event (time, event, cores,
    the test asking): the e2e pass's timeline, to see where a lane waited."""
    path = os.environ.get(TRACE_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{time.time():.1f} {os.getpid()} {event} {','.join(map(str, cores))} "
                    f"{os.environ.get('PYTEST_CURRENT_TEST', '-').split(' ')[0]}\n")


def held_by_this_thread() -> int:
    """How many leases this thread holds: a thread that holds one must not wait on
    anything another lease holder may wait for (the suite's shared results), or the two
    wait on each other."""
    with _HELD_LOCK:
        return _HELD[threading.get_ident()]


def machine_cores() -> list[int]:
    """The cores this process may run on."""
    return sorted(os.sched_getaffinity(0))


class Lease:
    """Cores held until :meth:`release` (or the end of a ``with`` block, or the holder's death)."""

    def __init__(self, cores: list[int], files: list[IO]) -> None:
        self.cores = cores
        self._files = files
        self._thread = threading.get_ident()
        with _HELD_LOCK:
            _HELD[self._thread] += 1

    def release(self) -> None:
        if self._files:
            _trace("release", self.cores)
            with _HELD_LOCK:
                _HELD[self._thread] -= 1
        for f in self._files:
            f.close()  # closing the file drops its flock
        self._files = []

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _try(core: int) -> IO | None:
    f = open(LEASE_DIR / f"core-{core}.lock", "w")  # noqa: SIM115 -- held open: the open file is the lease
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def lease(count: int | None = 1, cores: Iterable[int] | None = None) -> Lease:
    """Block until ``count`` cores (``None``: all of this machine's) are free, and hold
    them. ``cores``: the ones to take, when the engine's place is not ours to choose
    (vLLM's own thread binding puts a lone unpinned worker on the first core)."""
    every = machine_cores()
    wanted = list(cores) if cores is not None else every
    count = len(wanted) if count is None or cores is not None else min(count, len(wanted))
    LEASE_DIR.mkdir(parents=True, exist_ok=True)
    with open(LEASE_DIR / "queue.lock", "w") as queue:
        _trace("ask", wanted[:count])
        fcntl.flock(queue, fcntl.LOCK_EX)
        held: dict[int, IO] = {}
        while True:
            for core in wanted:
                if len(held) == count:
                    break
                if core not in held and (f := _try(core)) is not None:
                    held[core] = f
            if len(held) == count:
                _trace("take", sorted(held))
                return Lease(sorted(held), list(held.values()))
            time.sleep(POLL_S)


def pinned(cores: Iterable[int]) -> Callable[[], None]:
    """A ``preexec_fn`` running a child on ``cores`` alone: the machine's shape, not a
    setting (no variable or flag changes). Unpinned, vLLM's thread binding puts every
    lone engine's worker on the first core, so two engines side by side shared one core
    and left the other to their idle scheduler processes."""
    mask = set(cores)
    return lambda: os.sched_setaffinity(0, mask)
