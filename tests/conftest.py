"""Shared fixtures: real models built from PyPI wheels (cached), engine-run helpers."""

from __future__ import annotations

import ctypes
import gc
import os
import random
import zlib
from collections import defaultdict

# One thread per pytest-xdist worker, set before torch starts OpenMP: the fast lane runs a
# worker per core, and two workers each spinning two OpenMP threads on two cores ran the
# drafter tests 10x slower than one worker alone.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _model(name: str) -> str:
    from hetero_harness.models import ensure_model

    return str(ensure_model(name))


@pytest.fixture(scope="session")
def smollm2() -> str:
    return _model("smollm2-135m")


@pytest.fixture(scope="session")
def gemma() -> str:
    return _model("gemma3-270m")


@pytest.fixture(scope="session")
def qwen05() -> str:
    return _model("qwen2.5-coder-0.5b")


@pytest.fixture(autouse=True, scope="module")
def _free_module_memory():
    """Collect each module's engines and models before the next module loads its own,
    and hand the freed heap back to the system (glibc keeps it otherwise): the suite
    runs in one process, beside servers and engine subprocesses."""
    yield
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


@pytest.fixture(autouse=True)
def _seed_every_draw(request: pytest.FixtureRequest) -> None:
    """Every test starts from random state derived from its own id (torch, numpy and
    Python's global generators), so a statistical test draws the same samples whatever
    ran before it: ``-k``, test order and xdist workers change nothing. Tests that need
    several independent streams also seed generators of their own."""
    seed = zlib.crc32(request.node.nodeid.encode())
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under ``tests/e2e/`` starts real engines: mark it ``e2e``, so the fast
    lane (``-m "not e2e"``) leaves it out without each file having to say so."""
    for item in items:
        if "e2e" in item.path.parent.parts[-1:]:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="module")
def selected_params(request: pytest.FixtureRequest):
    """``selected_params(name)``: the values of parameter ``name`` among this module's
    collected tests (after ``-k``/``-m`` deselection), in order. A module fixture that
    runs every configuration at once (engines side by side) runs only the ones that
    will be asked for."""

    def values(name: str) -> list:
        seen: list = []
        for item in request.session.items:
            callspec = getattr(item, "callspec", None)
            if item.module is request.module and callspec is not None and name in callspec.params:
                if callspec.params[name] not in seen:
                    seen.append(callspec.params[name])
        return seen

    return values


# Seconds per test module (setup, call and teardown of its tests, module fixtures
# included), printed at the end of every run: CI's log then shows where the time went.
_MODULE_SECONDS: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _MODULE_SECONDS[report.nodeid.split("::", 1)[0]] += report.duration


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 -- pytest's TerminalReporter
    if not _MODULE_SECONDS:
        return
    terminalreporter.write_sep("=", "seconds per test module (with -n: summed over workers)")
    for path, seconds in sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f}  {path}")
