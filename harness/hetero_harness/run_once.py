"""A result computed once per test run and shared by every process of it (pytest-xdist
workers): the first to ask computes it under a file lock, the others wait and read it.

Why: several e2e modules compare with one reference engine (the target alone). Kept in
one worker's memory, it tied all of them to that worker's lane, so one lane waited on
the other's whole-machine modules while the other idled at the end. On disk, any lane
may run any of them.

Deadlock: whoever computes may wait for a core lease (``cores.py``) while holding the
file lock, so nobody may wait on the file lock while holding a lease. :func:`run_once`
refuses to, naming the rule, rather than hang the suite.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetero_harness.cores import held_by_this_thread


class SharedRunError(RuntimeError):
    """The computation failed in whichever process ran it (its message kept)."""


def run_once(path: Path, compute: Callable[[], Any]) -> tuple[Any, bool]:
    """``compute()``'s JSON-able result, stored at ``path``; with whether this call
    computed it (so a cost is counted once). A failed computation is stored too: every
    asker gets :class:`SharedRunError` with its message, and none retries it."""
    if held_by_this_thread():
        raise RuntimeError(f"{path.name}: ask for a run-wide result before taking a core lease, not while holding "
                           "one (its computer may be waiting for that core)")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        computed = not path.exists()
        if computed:
            try:
                stored = {"result": compute()}
            except Exception as exc:  # noqa: BLE001 -- stored for every asker, raised below
                stored = {"error": f"{type(exc).__name__}: {exc}"}
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(stored))
            tmp.replace(path)
        stored = json.loads(path.read_text())
    if "error" in stored:
        raise SharedRunError(stored["error"])
    return stored["result"], computed
