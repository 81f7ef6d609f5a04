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

import compat  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
compat.stand_in_platform()


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


#: The e2e pass runs in two lanes (``scripts/test.sh``: pytest-xdist, a worker per core),
#: each a group of modules run in this order, their engines sharing the cores through
#: leases (``hetero_harness/cores.py``). A module's engines hold one core (the rules'
#: engines, advise, the batch schedule, lifecycle, Ray's engine with its actor, the
#: tensor-parallel engine) or, for memory, every core (the README's commands, the serving
#: module's servers, the data-parallel server). The pass is bound by its
#: core-seconds, and a core sits idle whenever one lane waits for every core while the
#: other still runs a one-core module; so each lane runs its one-core modules first, sized
#: to end at about the same time in both (the lease trace's hold times, docs/testing.md,
#: "Where the time goes"), then the whole-machine modules run one after another. The
#: data-parallel server (two engines, two API servers: about 14 GiB) ran on one core
#: twice and twice ran the 24 GiB machine out of memory beside another module's engine,
#: so it holds every core; Ray's engine and actor and the TP engine's two workers (8-9
#: GiB) run beside a one-engine module. The serving module's servers load the compile of
#: the README's server, so they share a lane; the Gemma pair's modules share the target
#: alone through a file (``e2e/conftest.py``), so they may sit in either.
E2E_GROUPS: dict[str, tuple[str, ...]] = {
    "lane-1": ("test_e2e_rules.py", "test_lifecycle.py", "test_tensor_parallel.py", "test_readme_commands.py",
               "test_serving.py"),
    "lane-2": ("test_ray_executor.py", "test_advise.py", "test_batch_schedule.py", "test_serving_scale.py"),
}
_GROUP_OF = {name: group for group, names in E2E_GROUPS.items() for name in names}
_E2E_ORDER = {name: (g, i) for g, names in enumerate(E2E_GROUPS.values()) for i, name in enumerate(names)}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under ``tests/e2e/`` starts real engines: mark it ``e2e``, so the fast
    lane (``-m "not e2e"``) leaves it out without each file having to say so; and put
    the e2e modules in :data:`E2E_GROUPS`' order (xdist hands the groups out in
    collection order with ``--no-loadscope-reorder``)."""
    for item in items:
        if "e2e" in item.path.parent.parts[-1:]:
            item.add_marker(pytest.mark.e2e)
    compat.mark_not_applicable(items)
    items.sort(key=lambda item: _E2E_ORDER.get(item.path.name, (len(E2E_GROUPS), 0))
               if item.get_closest_marker("e2e") else (-1, 0))


def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN001, ANN201 -- xdist's types
    """``--dist loadgroup`` with :data:`E2E_GROUPS` as the groups: each group's tests go to
    one worker, a module in no group is a group of its own. (xdist's own groups come from
    ``xdist_group`` marks, which it reads before a conftest can add them.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class E2EGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return _GROUP_OF.get(path.rpartition("/")[2], path)

    return E2EGroups(config, log)


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


# -- the suite's cost, counted per module against tests/cost_budget.py ------------------

def _ledger_run() -> int:
    """The pid of the pytest process that summarises the run (xdist's controller for a
    worker)."""
    return os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()


def _module_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return path[len("tests/"):] if path.startswith("tests/") else path


_CHARGED: list[str] = []  # the module this process charges now


def pytest_runtest_setup(item: pytest.Item) -> None:
    """What this test (its fixtures included) starts is charged to its module (the
    ledger's entry is rewritten when the module changes, or when a test closed it)."""
    from hetero_harness import cost_ledger

    module = _module_of(item.nodeid)
    if _CHARGED != [module] or not cost_ledger.is_open():
        cost_ledger.open_module(_ledger_run(), module)
        _CHARGED[:] = [module]


@pytest.fixture(scope="module")
def count_rows(request: pytest.FixtureRequest):
    """``count_rows(n)``: declare ``n`` rows sampled by this module's statistical tests."""
    from hetero_harness import cost_ledger

    def count(n: int) -> None:
        cost_ledger.record_rows(_ledger_run(), _module_of(request.node.nodeid), n)

    return count


@pytest.fixture(scope="session")
def count_rows_for():
    """``count_rows_for(line, n)``: declare ``n`` rows sampled for a session fixture's
    own budget line (one shared by several modules)."""
    from hetero_harness import cost_ledger

    def count(line: str, n: int) -> None:
        cost_ledger.record_rows(_ledger_run(), line, n)

    return count


_COST: dict = {}
_OVER: list[str] = []


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Read the ledger and hold every module to its budget: one over it (or starting an
    engine with no budget line) fails the run, naming the module and the count."""
    from hetero_harness import cost_ledger

    cost_ledger.close_process()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from cost_budget import BUDGET

    _COST.update(cost_ledger.read(os.getpid()))
    for module, cost in sorted(_COST.items()):
        budget = BUDGET.get(module)
        if budget is None:
            if cost.engines or cost.rows:
                _OVER.append(f"{module}: started {cost.engines} engines and sampled {cost.rows} rows "
                             f"with no budget in tests/cost_budget.py")
            continue
        spent = {"compiled": cost.compiled + cost.cached, "eager": cost.eager, "serve": cost.serve, "rows": cost.rows}
        for key, value in spent.items():
            if value > getattr(budget, key):
                _OVER.append(f"{module}: {key} {value} > its budget {getattr(budget, key)} (tests/cost_budget.py)")
    if _OVER and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# Seconds per test module (setup, call and teardown of its tests, module fixtures
# included), printed at the end of every run: CI's log then shows where the time went.
_MODULE_SECONDS: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _MODULE_SECONDS[report.nodeid.split("::", 1)[0]] += report.duration


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 -- pytest's TerminalReporter
    if _COST:
        from cost_budget import BUDGET, Budget

        terminalreporter.write_sep("=", "cost per test module (tests/cost_budget.py: its budget in brackets)")
        terminalreporter.write_line(f"{'module':40s} {'compiled':>9s} {'cached':>7s} {'eager':>9s} {'serve':>9s} "
                                    f"{'rows':>11s}")
        total = {"compiled": 0, "cached": 0, "eager": 0, "serve": 0, "rows": 0}
        for module, cost in sorted(_COST.items()):
            b = BUDGET.get(module, Budget())
            terminalreporter.write_line(
                f"{module:40s} {cost.compiled:>4d} [{b.compiled:>2d}] {cost.cached:>7d} {cost.eager:>4d} [{b.eager:>2d}] "
                f"{cost.serve:>4d} [{b.serve:>2d}] {cost.rows:>5d} [{b.rows:>4d}]")
            for key in total:
                total[key] += getattr(cost, key)
        terminalreporter.write_line(
            f"{'total':40s} {total['compiled']:>9d} {total['cached']:>7d} {total['eager']:>9d} {total['serve']:>9d} "
            f"{total['rows']:>11d}")
        for line in _OVER:
            terminalreporter.write_line(f"OVER BUDGET: {line}", red=True)
    if not _MODULE_SECONDS:
        return
    terminalreporter.write_sep("=", "seconds per test module (with -n: summed over workers)")
    for path, seconds in sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f}  {path}")


@pytest.fixture(scope="session")
def hub_home(smollm2: str, gemma: str, qwen05: str, tmp_path_factory: pytest.TempPathFactory):
    """An ``HF_HOME`` whose cache holds set-up's models under their upstream ids (links,
    no copies; ``hetero_harness/hf_cache.py``), for naming models as vLLM users do. Never
    the user's own cache: these weights are converted, not the Hub's bytes."""
    from pathlib import Path

    from hetero_harness.hf_cache import build_cache

    home = tmp_path_factory.mktemp("hf_home")
    build_cache(home, {"smollm2-135m": Path(smollm2), "gemma3-270m": Path(gemma), "qwen2.5-coder-0.5b": Path(qwen05)})
    return home


@pytest.fixture
def offline_hub(hub_home, monkeypatch: pytest.MonkeyPatch):
    """This process reads the Hub cache at ``hub_home`` only, as ``HF_HUB_OFFLINE=1``
    makes it (``huggingface_hub`` reads its variables once, at import: its constants are
    set here too). Yields the ``HF_HOME`` folder."""
    import huggingface_hub

    from hetero_harness.hf_cache import offline_env
    from vllm_hetero_spec.model_names import locate

    for key, value in offline_env(hub_home).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_home / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HOME", str(hub_home))
    locate.cache_clear()
    yield hub_home
    locate.cache_clear()
