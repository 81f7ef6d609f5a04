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


def _draft_runtime(drafter: Any) -> Any:
    """The draft model runtime of our in-process drafter (``None``: none here, or it
    drafts in a Ray actor)."""
    engine = getattr(getattr(drafter, "host", None), "drafter", None)
    return getattr(engine, "runtime", None)


def _drafter_runtime_facts(drafter: Any) -> dict[str, Any]:
    """How the drafter was built on this worker: its attention backends, block size,
    CUDA graph buckets, how many graphs were captured and the memory they were
    measured to take."""
    runtime = _draft_runtime(drafter)
    if runtime is None:
        return {}
    return {
        "attention_backends": sorted({group.backend.get_name() for group in runtime.groups}),
        "block_size": runtime.pool.block_size,
        "graph_sizes": list(runtime.graphs.sizes),
        "graphs_captured": drafter.graphs_captured,
        "graph_mib": drafter.graph_bytes / (1 << 20),
        "max_num_seqs": runtime.vllm_config.scheduler_config.max_num_seqs,
    }


def draft_forward_ms(runtime: Any, batch_sizes: list[int], context: int, reps: int) -> dict[str, float]:
    """Per batch size, the wall time of one draft position's forward (``forward_next``,
    the graphed path where graphs are on) over ``context``-token sequences, device
    synchronized around the timed loop; the sequences are rolled back after each."""
    import torch

    sync = torch.accelerator.synchronize if runtime.device.type != "cpu" else (lambda: None)
    out = {}
    for b in batch_sizes:
        caches = [runtime.new_cache() for _ in range(b)]
        try:
            runtime.forward(caches, [[1] * context] * b)
            ids = torch.ones(b, dtype=torch.int64, device=runtime.device)

            def one() -> None:
                runtime.forward_next(caches, ids, 1)
                for cache in caches:
                    cache.truncate(context)

            for _ in range(3):
                one()
            sync()
            t0 = time.perf_counter()
            for _ in range(reps):
                one()
            sync()
            out[str(b)] = 1e3 * (time.perf_counter() - t0) / reps
        finally:
            for cache in caches:
                cache.release()
    return out


class JobProbe:
    """Worker extension (``LLM(worker_extension_cls=...)``); every method is prefixed so
    that none can clash with a worker's own."""

    def hetero_probe_time(self, names: list[str]) -> None:
        _time_runner(list(names))

    def hetero_probe_reset(self) -> None:
        for calls in _CALLS.values():
            calls.clear()

    def hetero_probe_draft_ms(self, batch_sizes: list[int], context: int = 128, reps: int = 20) -> dict[str, float]:
        """:func:`draft_forward_ms` of this worker's drafter (empty when none runs here)."""
        runtime = _draft_runtime(getattr(getattr(self, "model_runner", None), "drafter", None))
        return {} if runtime is None else draft_forward_ms(runtime, list(batch_sizes), context, reps)

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
        policy = getattr(drafter, "policy", None)  # StepPolicy: the budget and auto's rule choice
        budget = getattr(policy, "budget", None)
        if budget is not None:
            out["draft_lengths"] = {str(k): n for k, n in sorted(budget.chosen.items())}
            if hasattr(budget, "exploration"):  # the adaptive budget's
                out["exploration"] = dataclasses.asdict(budget.exploration)
                # Its target curve as it stands: per step size, the price (ms) and whether
                # steps of its own, recent ones, set it.
                # The sampled rows' curve apart (their drafting steps verify by rejection sampling;
                # a checkout before 90ac65b, as `defaults.py --before` runs, has none).
                curves = {"target_curve": budget.target,
                          "sampled_target_curve": getattr(budget, "sampled_target", None)}
                for name, cost in curves.items():
                    if cost is not None:
                        out[name] = {str(t): [round(1e3 * cost.predict(t), 1), cost.priced(t)]
                                     for t in sorted({*cost.by_size, *cost.first})}
        rules = getattr(policy, "rules", None)
        if rules is not None:
            out["rules_chosen"] = dict(rules.chosen)
            out["rule_rates"] = rules.rates()
        runtime_facts = _drafter_runtime_facts(drafter)
        if runtime_facts:
            out["drafter_runtime"] = runtime_facts
        if stats is not None and stats.steps:
            out["bridge_ms_per_step"] = 1e3 * stats.bridge_s / stats.steps
            out["draft_ms_per_step"] = 1e3 * stats.draft_s / stats.steps
            out["live_request_states"] = len(drafter.states)
        # Plain JSON types only (numpy scalars and the like as floats): the reply
        # crosses processes through vLLM's msgpack encoder.
        return json.loads(json.dumps(out, default=float))
