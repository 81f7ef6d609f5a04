"""The suite's cost ledger (``hetero_harness/cost_ledger.py``) and its budget
(``tests/cost_budget.py``): a start is charged to the test module of the nearest
ancestor running a test, whatever the environment, and the budget fits the pass."""

from __future__ import annotations

import os
import subprocess
import sys

from hetero_harness import cost_ledger

from cost_budget import BUDGET, TOTAL


def test_a_descendant_with_no_suite_variables_is_charged_to_the_module(tmp_path) -> None:
    """A grandchild started through ``bash -c`` in an emptied environment (as the
    README's commands run) still finds the module by the process tree."""
    run = os.getpid() + 10_000_000  # a ledger of this test's own
    cost_ledger.open_module(run, "e2e/test_example.py")
    code = ("from hetero_harness import cost_ledger; entry, server = cost_ledger.charge(); "
            "cost_ledger._append(entry['run'], {'module': entry['module'], 'kind': 'eager', 'server': server})")
    try:
        subprocess.run(["bash", "-c", f"{sys.executable} -c \"{code}\""], env={"PATH": os.environ["PATH"]},
                       check=True, timeout=60)
        cost_ledger.record_rows(run, "e2e/test_example.py", 120)
        costs = cost_ledger.read(run)
    finally:
        cost_ledger.close_process()
    assert costs == {"e2e/test_example.py": cost_ledger.ModuleCost(eager=1, rows=120)}
    assert cost_ledger.charge() is None  # this process's tests are over: nothing charged


def test_a_child_charged_to_a_shared_line_is_charged_there_not_to_the_module() -> None:
    """A session fixture's engine (``run_isolated(..., charge=line)``) is charged to its
    own budget line, and what the module starts beside it to the module."""
    run = os.getpid() + 20_000_000
    cost_ledger.open_module(run, "e2e/test_example.py")
    code = ("import subprocess, sys; from hetero_harness import cost_ledger; entry, _ = cost_ledger.charge(); "
            "cost_ledger._append(entry['run'], {'module': entry['module'], 'kind': 'eager', 'server': None})")
    try:
        shared = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(1); {code}"])
        cost_ledger.charge_child(shared.pid, "e2e/conftest.py::shared")
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
        assert shared.wait(timeout=60) == 0
        cost_ledger.release_child(shared.pid)
        costs = cost_ledger.read(run)
    finally:
        cost_ledger.close_process()
    assert costs == {"e2e/test_example.py": cost_ledger.ModuleCost(eager=1),
                     "e2e/conftest.py::shared": cost_ledger.ModuleCost(eager=1)}


def test_engines_of_one_server_count_one_serve() -> None:
    assert cost_ledger._is_server(["/x/.venv/bin/python", "/x/.venv/bin/vllm", "serve", "m", "--port", "1"])
    assert cost_ledger._is_server(["python", "-m", "vllm.entrypoints.cli.main", "serve", "m"])
    assert not cost_ledger._is_server(["python", "-m", "pytest", "tests/e2e/test_serving.py"])
    assert not cost_ledger._is_server(["python", "serve.py"])


def test_the_modules_budgets_fit_the_pass() -> None:
    for key in ("compiled", "eager", "serve", "rows"):
        assert sum(getattr(b, key) for b in BUDGET.values()) <= getattr(TOTAL, key), key
    # A module of tests/e2e/, or a session fixture of its conftest (``path::fixture``).
    assert all(line.startswith("e2e/") and line.split("::")[0].count("/") == 1 for line in BUDGET)
