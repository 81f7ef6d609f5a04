"""The plugin's Prometheus metrics (``hetero:*``), from the worker to ``/metrics``.

The proposer lives in vLLM's worker process; ``/metrics`` is served by the API server
process. prometheus_client's own multi-process mode would need ``PROMETHEUS_MULTIPROC_DIR``
set by the user before start-up, and turning it on changes how vLLM's own metrics are
collected. Instead each worker owns a small memory-mapped array of float64 slots (a store
per update: nothing on the hot path but a memory write) plus a JSON sidecar with its
labels, in a directory chosen by the first process that loads the plugin and inherited by
the processes it starts. A collector registered in every process reads the directory
at scrape time, keeping only live workers that descend from its own process (so one
server never reports another engine's workers, or a finished engine's last values), or
whose spawner does: a worker of vLLM's Ray executor is a child of Ray's raylet, and
names the engine process that started it through the environment, which vLLM copies
to it (workers on other
hosts write boards the server cannot read: their ``hetero:*`` series are missing). Counters are monotonic per worker; gauges describe the worker's current
state; every sample carries the worker's ``pid`` label (tensor-parallel ranks each
report, sum or max them as needed).
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil

from vllm_hetero_spec.config import LOSSLESS_RULES

DIR_ENV = "HETERO_SPEC_METRICS_DIR"
SPAWNER_ENV = "HETERO_SPEC_METRICS_SPAWNER"
# vLLM's Ray executor copies to its Ray workers only the variables it knows of, plus
# those named in this one (vllm/ray/ray_env.py, 0.32.0). A Ray worker is not a child of
# the server; with ours copied it writes where the server reads and names the process
# that started it. (Names starting with VLLM_ would be copied too, but vLLM warns about
# every unknown VLLM_ variable in every process.)
RAY_COPY_ENV = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"
_spawner: str | None = None  # this process's starter (by SPAWNER_ENV), read on first use

#: name -> help; exported as ``hetero:<name>_total``.
COUNTERS: dict[str, str] = {
    "steps": "Proposal steps run by the drafter",
    "bridge_seconds": "Seconds spent in the vocabulary bridge (re-tokenization, alignment, mapping)",
    "draft_seconds": "Seconds spent in draft model forwards and sampling",
    "proposed_tokens": "Target tokens proposed to the verifier",
    "realign_mismatches": "Re-tokenizations whose draft-side tokens diverged from the cached ones",
    "fallbacks": "Steps where drafting failed and the batch ran without drafts",
    "rank_checks": "Steps whose drafts and sampled tokens were compared across TP ranks "
    "(VLLM_HETERO_SPEC_CHECK_RANKS=1)",
    "rank_mismatches": "Checked steps where some TP rank drafted or sampled differently from the others",
    "undrafted_requests": "Request-steps with nothing to draft from (e.g. an incomplete UTF-8 character)",
    "pool_full_requests": "Request-steps run undrafted because the draft KV pool (draft_kv_pool_mb) was full",
    "slrs_tree_nodes": "slrs: drafter evaluations spent computing psi (beyond the contexts)",
    "slrs_capped_candidates": "slrs: first-token candidates left out of C by the work cap (slrs_max_nodes)",
    "slrs_uncovered_requests": "slrs: sampling request-steps whose C was empty, drafted as slem instead",
    "pipeline_hits": "Ray executor: request-steps whose drafts were ready from the pipelined branch",
    "pipeline_misses": "Ray executor: request-steps whose pipelined branches all missed (drafted on demand)",
    "pipeline_branches": "Ray executor: speculative branches drafted while the target verified",
    "pipeline_errors": "Ray executor: pipelined drafting failures in the actor (logged; drafts made on demand)",
    "ray_wait_seconds": "Ray executor: seconds the engine waited for the drafter actor",
    "ray_timeouts": "Ray executor: steps the actor did not answer in time (run without drafts)",
    "ray_restarts": "Ray executor: drafter actors restarted after dying or hanging",
    "ray_undrafted_steps": "Ray executor: steps run without drafts because the actor was unavailable",
    "draft_length_sum": "Sum over steps of the step's draft length (the longest draft any request got); "
    "divide by hetero:budget_steps_total for the mean",
    "budget_steps": "Steps the draft budget planned (drafted or not)",
    "undrafted_steps": "Steps that sent the verifier no proposal: the budget chose k = 0 (speculation would "
    "not pay), or no row came out with a proposal (e.g. hetero:undrafted_requests_total)",
    **{f"{rule}_request_steps": f"algorithm auto: request-steps drafted with {rule}" for rule in LOSSLESS_RULES},
}
#: name -> help; exported as ``hetero:<name>``.
GAUGES: dict[str, str] = {
    "request_states": "Requests the drafter currently holds state for",
    "draft_state_bytes": "Bytes held by per-request draft state (draft KV caches and token arrays)",
    "draft_budget": "The draft length (0 = none) the budget chose for the last step",
    "draft_pool_bytes": "Bytes of the draft KV pool in use (bounded by draft_kv_pool_mb)",
}
SLOTS: tuple[str, ...] = tuple(COUNTERS) + tuple(GAUGES)
_INDEX = {name: i for i, name in enumerate(SLOTS)}


def metrics_dir() -> Path:
    """This server's metrics directory, created (and removed at exit) by the first
    process to ask; child processes inherit it through the environment."""
    _note_spawner()
    existing = os.environ.get(DIR_ENV)
    if existing:
        return Path(existing)
    path = Path(tempfile.mkdtemp(prefix="vllm_hetero_spec_metrics-"))
    os.environ[DIR_ENV] = str(path)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _note_spawner() -> None:
    """Keep the spawner this process inherited, then name itself to the processes it
    starts (once per process, before it starts any: the plugin loads first)."""
    global _spawner
    if os.environ.get(SPAWNER_ENV) != str(os.getpid()):
        _spawner = os.environ.get(SPAWNER_ENV)
        os.environ[SPAWNER_ENV] = str(os.getpid())
        listed = [name for name in os.environ.get(RAY_COPY_ENV, "").split(",") if name.strip()]
        os.environ[RAY_COPY_ENV] = ",".join(dict.fromkeys([*listed, DIR_ENV, SPAWNER_ENV]))


class MetricsBoard:
    """One worker's slots. ``add`` for counters, ``set`` for gauges."""

    def __init__(self, labels: dict[str, str], directory: Path | None = None):
        _note_spawner()
        directory = directory or metrics_dir()
        directory.mkdir(parents=True, exist_ok=True)
        stem = directory / f"worker-{os.getpid()}"
        meta = {"labels": labels, "slots": list(SLOTS), "spawner": _spawner}
        (stem.with_suffix(".json")).write_text(json.dumps(meta))
        self._values = np.memmap(stem.with_suffix(".bin"), dtype=np.float64, mode="w+", shape=(len(SLOTS),))

    def add(self, name: str, value: float) -> None:
        self._values[_INDEX[name]] += value

    def set(self, name: str, value: float) -> None:
        self._values[_INDEX[name]] = value


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: its exit is only not yet collected)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether live process ``pid`` is ``ancestor`` or one of its descendants."""
    try:
        proc: psutil.Process | None = psutil.Process(pid)
        while proc is not None:
            if proc.pid == ancestor:
                return True
            proc = proc.parent()
    except psutil.Error:
        return False
    return False


def read_boards(directory: Path, owner: int | None = None) -> list[tuple[dict[str, str], dict[str, float]]]:
    """Every worker's labels and values in ``directory`` (skips half-written files).

    With ``owner``, only live workers started by that process (or the process itself),
    directly or -- a Ray worker, whose parent is Ray's -- through a spawner that is:
    the directory is inherited by every process a plugin-loading parent starts, so
    several engines (one after another, or side by side) may write boards there, and a
    finished engine's board keeps its last values."""
    out = []
    for meta in sorted(directory.glob("worker-*.json")):
        pid = meta.stem.removeprefix("worker-")
        if owner is not None and not (pid.isdigit() and _alive(int(pid))):
            continue
        try:
            info = json.loads(meta.read_text())
            values = np.fromfile(meta.with_suffix(".bin"), dtype=np.float64)
        except (OSError, ValueError):
            continue
        spawner = str(info.get("spawner") or "")
        if owner is not None and not (_descends_from(int(pid), owner)
                                      or (spawner.isdigit() and _descends_from(int(spawner), owner))):
            continue
        slots = info["slots"]
        if len(values) != len(slots):
            continue
        labels = {**info["labels"], "pid": pid}
        out.append((labels, dict(zip(slots, values.tolist()))))
    return out


def server_pid() -> int:
    """The process whose descendants are this server's engines: this one, or, in an API
    server process of several (vLLM starts ``ApiServer_<i>`` processes for data
    parallelism or ``--api-server-count``, vLLM 0.32.0 ``v1/utils.py``), the launcher
    that started them and the engines alike."""
    if multiprocessing.current_process().name.startswith("ApiServer_"):
        return os.getppid()
    return os.getpid()


class BoardCollector:
    """A prometheus_client collector over :func:`read_boards` (read at scrape time)."""

    def __init__(self, directory: Path):
        self.directory = directory

    def collect(self) -> Iterator[object]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        boards = read_boards(self.directory, owner=server_pid())
        label_names = sorted({k for labels, _ in boards for k in labels})
        families = [(CounterMetricFamily, name, doc) for name, doc in COUNTERS.items()]
        families += [(GaugeMetricFamily, name, doc) for name, doc in GAUGES.items()]
        for family_cls, name, doc in families:
            family = family_cls(f"hetero:{name}", doc, labels=label_names)
            for labels, values in boards:
                family.add_metric([labels.get(k, "") for k in label_names], values.get(name, 0.0))
            yield family


_collector: BoardCollector | None = None


def register_collector() -> BoardCollector:
    """Add the collector to prometheus_client's default registry (once per process)."""
    global _collector
    if _collector is None:
        from prometheus_client import REGISTRY

        _collector = BoardCollector(metrics_dir())
        REGISTRY.register(_collector)
    return _collector
