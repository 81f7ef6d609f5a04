"""The test suite's cost ledger: every vLLM engine start, wherever it happens, counted
against the test module that caused it.

Why counts and not times: a machine of CI's kind runs the same suite 1.5-3x slower from
one day to the next, while the number of engines a module starts, how many of them
compile, and how many rows a statistical test samples do not move. The suite declares a
budget of these counts per module (``tests/cost_budget.py``) and fails a module that
exceeds it (``tests/conftest.py``).

How a start is seen: this module is also a vLLM general plugin of the harness
distribution (not of the plugin a user installs), so vLLM loads it in every engine and
worker process of this venv. It does nothing unless a pytest process of this machine has
opened a ledger (a file under :data:`LEDGER_DIR`), so benchmarks and the main job are
untouched. In a worker it wraps ``compile_or_warm_up_model`` (one call per engine, after
its model is loaded and compiled) and appends one line to the ledger of the nearest
ancestor that is running a test: found by the process tree, not by environment
variables, because the README's commands run in a user's environment with none of the
suite's. The line says whether the engine ran eager, compiled, or loaded its compiled
graph from vLLM's cache (vLLM's own compilation counters), and which ``vllm serve``
process, if any, it serves.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LEDGER_DIR = Path(tempfile.gettempdir()) / "vllm_hetero_spec_test_cost"
KINDS = ("compiled", "cached", "eager")


@dataclass
class ModuleCost:
    """What one test module started: engines by kind, ``vllm serve`` processes, rows sampled."""

    compiled: int = 0  # torch.compile ran (inductor or AOT compile)
    cached: int = 0  # compiled graphs loaded from vLLM's compile cache, nothing compiled
    eager: int = 0  # enforce_eager
    serve: int = 0  # distinct `vllm serve` processes whose engines started
    rows: int = 0  # rows sampled by statistical tests (declared by the tests)

    @property
    def engines(self) -> int:
        return self.compiled + self.cached + self.eager


# -- the pytest side ------------------------------------------------------------------


def _current(pid: int) -> Path:
    return LEDGER_DIR / f"current.{pid}"


def _events(run: int) -> Path:
    return LEDGER_DIR / f"events.{run}.jsonl"


def open_module(run: int, module: str) -> None:
    """Charge what this process's descendants start from now on to ``module``, in
    ``run``'s ledger (``run``: the pid of the pytest process that summarises)."""
    LEDGER_DIR.mkdir(parents=True, exist_ok=True)
    _current(os.getpid()).write_text(json.dumps({"run": run, "module": module}))


def is_open() -> bool:
    """Whether this process charges a module now."""
    return _current(os.getpid()).exists()


def charge_child(pid: int, module: str) -> None:
    """Charge what child ``pid`` starts to ``module`` rather than to this process's
    module: a session fixture's engine, shared by several modules, has a budget line of
    its own whichever module asks for it first. Nothing happens outside a test."""
    current = _current(os.getpid())
    if current.exists():
        _current(pid).write_text(json.dumps({**json.loads(current.read_text()), "module": module}))


def release_child(pid: int) -> None:
    _current(pid).unlink(missing_ok=True)


def close_process() -> None:
    """This process runs no more tests (its descendants' starts are no longer charged)."""
    _current(os.getpid()).unlink(missing_ok=True)


def record_rows(run: int, module: str, rows: int) -> None:
    """A statistical test's sampled rows, declared by the test."""
    _append(run, {"module": module, "rows": int(rows)})


def read(run: int, clear: bool = True) -> dict[str, ModuleCost]:
    """Every module's cost in ``run``'s ledger (and the ledger removed with ``clear``)."""
    path = _events(run)
    costs: dict[str, ModuleCost] = {}
    servers: dict[str, set[int]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            event = json.loads(line)
            cost = costs.setdefault(event["module"], ModuleCost())
            if "rows" in event:
                cost.rows += event["rows"]
                continue
            setattr(cost, event["kind"], getattr(cost, event["kind"]) + 1)
            if event.get("server") is not None:
                servers.setdefault(event["module"], set()).add(event["server"])
        if clear:
            path.unlink()
    for module, pids in servers.items():
        costs[module].serve = len(pids)
    return costs


def _append(run: int, event: dict[str, Any]) -> None:
    LEDGER_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(_events(run), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(event) + "\n").encode())
    finally:
        os.close(fd)


# -- the engine side ------------------------------------------------------------------


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _is_server(argv: list[str]) -> bool:
    """``vllm serve ...`` (the console script, or ``python -m vllm.entrypoints.cli.main serve``)."""
    return "serve" in argv and any("vllm" in Path(a).name or a.startswith("vllm.") for a in argv[: argv.index("serve")])


def charge() -> tuple[dict[str, Any], int | None] | None:
    """The ledger entry of the nearest ancestor running a test (``{"run", "module"}``),
    and the ``vllm serve`` ancestor between here and it, if any; None outside a test."""
    if not LEDGER_DIR.is_dir():
        return None
    pid, server = os.getpid(), None
    while pid > 1:
        current = _current(pid)
        if current.exists():
            try:
                return json.loads(current.read_text()), server
            except (OSError, ValueError):
                return None
        if server is None and _is_server(_argv(pid)):
            server = pid
        try:
            pid = _parent(pid)
        except (OSError, IndexError, ValueError):
            return None
    return None


def _kind(worker: Any, before: Counter) -> str:
    """How ``worker``'s engine got its model ready, from vLLM's compilation counters
    since ``before`` (this process's plugin load: the model compiles in the profile run,
    before the warm-up)."""
    from vllm.compilation.counter import compilation_counter

    if worker.model_config.enforce_eager:
        return "eager"
    now = Counter(vars(compilation_counter))
    grew = {k for k in now if now[k] > before.get(k, 0)}
    if grew & {"num_inductor_compiles", "num_aot_compiles", "num_backend_compilations"}:
        return "compiled"
    return "cached" if grew & {"num_aot_artifacts_loaded", "num_compiled_artifacts_loaded"} else "compiled"


def register() -> None:
    """vLLM general plugin (``vllm.general_plugins``, harness distribution): count this
    process's engine starts while a test runs; otherwise do nothing at all."""
    if charge() is None:
        return
    from vllm.compilation.counter import compilation_counter
    from vllm.v1.worker import gpu_worker

    before = Counter(vars(compilation_counter))

    classes: list[type] = [gpu_worker.Worker]
    try:
        from vllm.v1.worker import cpu_worker

        classes.append(cpu_worker.CPUWorker)
    except ImportError:
        pass
    for cls in classes:
        original = cls.__dict__.get("compile_or_warm_up_model")
        if original is None or getattr(original, "_hetero_cost", False):
            continue

        @functools.wraps(original)
        def counted(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            first = not getattr(self, "_hetero_cost_seen", False)
            self._hetero_cost_seen = True
            out = _original(self, *args, **kwargs)
            if first and getattr(self, "rank", 0) == 0:
                found = charge()
                if found is not None:
                    entry, server = found
                    _append(entry["run"], {"module": entry["module"], "kind": _kind(self, before),
                                           "server": server, "pid": os.getpid()})
            return out

        counted._hetero_cost = True  # type: ignore[attr-defined]
        setattr(cls, "compile_or_warm_up_model", counted)
