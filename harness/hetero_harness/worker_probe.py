"""What :func:`~hetero_harness.evaluation.run_job` reads from vLLM's worker:
the runner's per-call times and the drafter's own statistics.

With vLLM's default process layout (what users run) the engine core, and with it the
worker that holds the model runner and our drafter, lives in a process of its own; with
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` it is the caller's. ``run_job`` reaches it the same
way in both: this class is the engine's ``worker_extension_cls`` (vLLM adds it to the
worker's bases), and its methods are called by name through ``LLM.collective_rpc``,
which returns plain data (one entry per worker: rank 0 first).
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

#: per timed method of the runner, one wall time per call since the last reset (this process)
_CALLS: dict[str, list[float]] = {}


def _time_runner(names: list[str]) -> None:
    """Time every call of the model runner's methods ``names`` in this process: our
    drafter and vLLM's own draft models are timed at the same place (on CPU a method's
    wall time is its cost; on CUDA it would need a sync first)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    for name in names:
        if name in _CALLS:
            continue  # already timed in this process
        calls = _CALLS[name] = []
        original = getattr(GPUModelRunner, name)

        def timed(self: Any, *args: Any, _original: Any = original, _calls: list = calls, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _original(self, *args, **kwargs)
            finally:
                _calls.append(time.perf_counter() - t0)

        setattr(GPUModelRunner, name, timed)


class JobProbe:
    """Worker extension (``LLM(worker_extension_cls=...)``); every method is prefixed so
    that none can clash with a worker's own."""

    def hetero_probe_time(self, names: list[str]) -> None:
        _time_runner(list(names))

    def hetero_probe_reset(self) -> None:
        for calls in _CALLS.values():
            calls.clear()

    def hetero_probe_report(self) -> dict[str, Any]:
        """The runner's call times and, when our drafter runs here, its statistics."""
        out: dict[str, Any] = {"runner_calls": {name: list(calls) for name, calls in _CALLS.items()}}
        drafter = getattr(getattr(self, "model_runner", None), "drafter", None)
        runtime = getattr(drafter, "runtime_config", None)
        if runtime is not None:
            out["draft_dtype"] = str(runtime.dtype).removeprefix("torch.")
        stats = getattr(drafter, "stats", None)
        if stats is not None:
            out["fallbacks"] = stats.fallbacks
            out["drafter_stats"] = stats.as_metrics()
            out["drafter_raw"] = dataclasses.asdict(stats)
        budget = getattr(drafter, "budget", None)
        if budget is not None:
            out["draft_lengths"] = {str(k): n for k, n in sorted(budget.chosen.items())}
        rules = getattr(drafter, "rules", None)
        if rules is not None:
            out["rules_chosen"] = dict(rules.chosen)
            out["rule_rates"] = rules.rates()
        if stats is not None and stats.steps:
            out["bridge_ms_per_step"] = 1e3 * stats.bridge_s / stats.steps
            out["draft_ms_per_step"] = 1e3 * stats.draft_s / stats.steps
            out["live_request_states"] = len(drafter.states)
        # Plain JSON types only (numpy scalars and the like as floats): the reply
        # crosses processes through vLLM's msgpack encoder.
        return json.loads(json.dumps(out, default=float))
