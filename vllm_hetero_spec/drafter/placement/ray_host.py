"""The drafter in a Ray actor on CPU cores (``"executor": "ray"``), DuoDecoding-style.

vLLM asks for drafts synchronously after each verification; it offers no hook while the
target computes. So the client asks the actor for step n's drafts (usually ready: the
actor drafted them while the target verified step n - 1, see ``drafter/placement/pipeline.py``),
returns them, and immediately tells the actor to start on step n + 1 without waiting.

Faults never cost a request: every call waits at most ``ray_timeout_s``; a step the
actor does not answer in time, or any step while the actor is dead, hung or still
starting, runs without drafts (plain decoding is always correct). A dead actor, or one
silent for ``HANG_TIMEOUTS`` x ``ray_timeout_s``, is killed and replaced with back-off;
the new actor rebuilds each request's draft state from its committed tokens. The
actor's process is owned by Ray; the cluster is shut down with the engine when this
process started it, and left alone when it joined an existing one (``ray_address`` or
``RAY_ADDRESS``; ``ray_resources`` places the actor on the nodes that offer them).
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch

from vllm_hetero_spec.config import HeteroSettings
from vllm_hetero_spec.drafter.batch_drafter import BatchDrafter
from vllm_hetero_spec.drafter.messages import DrafterStats, StepBatch, StepDrafts
from vllm_hetero_spec.drafter.placement.pipeline import PipelinedDrafter
from vllm_hetero_spec.drafter.runtime.config import RuntimeConfig
from vllm_hetero_spec.log import plugin_logger

logger = plugin_logger(__name__)

NAMESPACE = "vllm_hetero_spec"
HANG_TIMEOUTS = 4  # an actor silent for this many step timeouts is restarted
START_TIMEOUT_S = 600.0  # loading the draft model at start-up
MAX_BACKOFF_S = 30.0


@dataclass
class ActorReply:
    """One step's answer: the drafts, the actor's counters, and the errors of pipelined
    drafting since the previous step."""

    drafts: StepDrafts
    stats: DrafterStats
    errors: list[str]


class DraftActor:
    """The actor's body (wrapped with ``ray.remote`` by the client, so this module
    imports without Ray): a :class:`BatchDrafter` behind a :class:`PipelinedDrafter`."""

    def __init__(self, settings: dict[str, Any], runtime: RuntimeConfig, target_tokenizer: str, target_vocab: int,
                 seed: int):
        parsed = HeteroSettings.from_dict(settings)
        torch.set_num_threads(parsed.ray_threads)
        self.drafter = BatchDrafter(parsed, target_tokenizer, target_vocab, seed, runtime)
        self.pipe = PipelinedDrafter(self.drafter, parsed.max_branches)
        self.pipelined = parsed.pipeline
        # Two calls may be in the actor at once (max_concurrency=2): a step arriving
        # while speculation runs flags itself, speculation stops at its next drafter
        # forward, and the step takes the lock. The engine is only used under the lock.
        self._lock = threading.Lock()
        self._step_waiting = threading.Event()
        self._free_since: float | None = None
        self._errors: list[str] = []

    def ready(self) -> dict[str, Any]:
        """Start-up barrier and identity (the pid lets tests signal the process)."""
        return {"pid": os.getpid(), "draft_vocab": self.drafter.runtime.vocab_size}

    def step(self, batch: StepBatch, live: set[str], drops: list[str]) -> ActorReply:
        self._step_waiting.set()
        with self._lock:
            self._step_waiting.clear()
            return self._step(batch, live, drops)

    def _idle_until(self, t: float) -> None:
        if self._free_since is not None:
            self.drafter.stats.actor_idle_s += max(0.0, t - self._free_since)

    def _step(self, batch: StepBatch, live: set[str], drops: list[str]) -> ActorReply:
        self._idle_until(time.perf_counter())
        self.pipe.keep_only(live - set(drops))
        drafts = self.pipe.step(batch)
        reply = ActorReply(drafts, self.drafter.snapshot_stats(), self._errors)
        self._errors = []
        self._free_since = time.perf_counter()
        return reply

    def speculate(self) -> None:
        """Draft the next step assuming this one's drafts are all accepted."""
        if not self.pipelined:
            return
        with self._lock:
            self._speculate()

    def _speculate(self) -> None:
        self._idle_until(time.perf_counter())
        try:
            self.pipe.speculate(self._step_waiting.is_set)
        except Exception:
            # Speculation only saves time: a failure costs its branches, nothing else.
            # Nobody waits on this call, so the error travels with the next reply.
            self.pipe.discard()
            self.drafter.stats.pipeline_errors += 1
            self._errors.append(traceback.format_exc())
        self._free_since = time.perf_counter()

    def reset(self) -> None:
        with self._lock:
            self.pipe.discard()
            self.drafter.reset()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as err:  # config.py checks this at start-up; this is the backstop
        raise RuntimeError("'executor': 'ray' needs Ray: pip install 'vllm_hetero_spec[ray]'") from err
    return ray


def _add(a: DrafterStats, b: DrafterStats) -> DrafterStats:
    """Field-wise sum (counters of a replaced actor plus those of its successor)."""
    return DrafterStats(**{f.name: getattr(a, f.name) + getattr(b, f.name) for f in dataclasses.fields(a)})


def cluster_address(settings: HeteroSettings) -> str | None:
    """The cluster to join: ``ray_address``, else ``RAY_ADDRESS`` (how ``ray start`` and
    Ray's own tools name a running cluster), else none (the engine starts its own)."""
    return settings.ray_address or os.environ.get("RAY_ADDRESS") or None


class RayHost:
    """Client side: owns the actor, the timeouts and restarts."""

    def __init__(self, settings: HeteroSettings, runtime: RuntimeConfig, target_tokenizer: str, target_vocab: int,
                 seed: int = 0):
        ray = self._ray = _import_ray()
        self.settings = settings
        self._args = (settings.to_dict(), runtime, target_tokenizer, target_vocab, seed)
        self._owns_ray = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"log_to_driver": False, "namespace": NAMESPACE}
            address = cluster_address(settings)
            if address:
                kwargs["address"] = address
            else:
                # "local", not None: None would silently join a stale /tmp/ray session.
                kwargs.update(address="local", num_cpus=settings.ray_num_cpus, object_store_memory=128 << 20,
                              include_dashboard=False)
            ray.init(**kwargs)
            self._owns_ray = True
            logger.info("hetero spec: drafter actor on %s", f"Ray cluster {address}" if address else "a local Ray cluster")
        # OMP_NUM_THREADS for every thread of the actor, not only the one torch's
        # set_num_threads ran in: the actor's calls run in Ray's threads, and vLLM's CPU
        # attention checks that its scheduler metadata (built with torch's thread count)
        # and its kernel (OpenMP's count for the calling thread) agree.
        self._remote = ray.remote(
            num_cpus=settings.ray_num_cpus, resources=dict(settings.ray_resources or {}),
            max_restarts=0, max_task_retries=0, max_concurrency=2,
            runtime_env={"env_vars": {"OMP_NUM_THREADS": str(settings.ray_threads)}},
        )(DraftActor)
        self._base = DrafterStats()  # counters of replaced actors
        self._actor_stats = DrafterStats()  # the live actor's latest counters
        self._own = DrafterStats()  # kept here: waits, timeouts, restarts
        self._drops: list[str] = []
        self._pending: Any = None
        self._pending_since = 0.0
        self._prev_end: float | None = None
        self._restarts_in_a_row = 0
        self._next_spawn = 0.0
        self.actor_pid: int | None = None
        self._closed = False
        self._spawn()
        try:
            self._on_ready(ray.get(self._ready, timeout=START_TIMEOUT_S))
        except Exception:
            self.close()
            raise
        atexit.register(self.close)

    # -- actor lifetime ---------------------------------------------------------------

    def _spawn(self) -> None:
        self._actor = self._remote.remote(*self._args)
        self._ready = self._actor.ready.remote()
        self._is_ready = False
        self._spawned_at = time.monotonic()

    def _on_ready(self, info: dict[str, Any]) -> None:
        self._is_ready = True
        self.actor_pid = int(info["pid"])
        logger.info("hetero spec: drafter actor ready (pid %d)", self.actor_pid)

    def _restart(self, reason: str) -> None:
        logger.warning("hetero spec: drafter actor %s; restarting it, steps run without drafts meanwhile", reason)
        self._own.ray_restarts += 1
        self._base = _add(self._base, self._actor_stats)
        self._actor_stats = DrafterStats()
        try:
            self._ray.kill(self._actor, no_restart=True)
        except Exception:  # already gone
            pass
        self._actor, self._pending, self._is_ready = None, None, False
        self._drops = []  # the replacement starts without any request state
        self._prev_end = None
        delay = min(MAX_BACKOFF_S, 0.5 * 2**self._restarts_in_a_row)
        self._restarts_in_a_row += 1
        self._next_spawn = time.monotonic() + delay

    def _available(self) -> bool:
        """Whether the actor can take a step now (spawning or checking it if not)."""
        ray = self._ray
        if self._actor is None:
            if time.monotonic() >= self._next_spawn:
                self._spawn()
            return False
        if not self._is_ready:
            done, _ = ray.wait([self._ready], timeout=0)
            if not done:
                if time.monotonic() - self._spawned_at > START_TIMEOUT_S:
                    self._restart("did not start in time")
                return False
            try:
                self._on_ready(ray.get(self._ready))
            except Exception as err:
                self._restart(f"failed to start ({type(err).__name__}: {err})")
                return False
        if self._pending is not None:
            done, _ = ray.wait([self._pending], timeout=0)
            if not done:
                if time.monotonic() - self._pending_since > HANG_TIMEOUTS * self.settings.ray_timeout_s:
                    self._restart("is not answering")
                return False
            try:
                ray.get(self._pending)  # a late answer to a step already run undrafted
            except Exception as err:
                self._restart(f"failed ({type(err).__name__})")
                return False
            self._pending = None
        return True

    def poll(self) -> bool:
        """Whether the actor can draft now; starts a due replacement, and notices one
        that finished loading (what each step does first)."""
        return self._available()

    # -- DrafterHost ----------------------------------------------------------------

    def step(self, batch: StepBatch, live: set[str]) -> StepDrafts | None:
        now = time.perf_counter()
        if self._prev_end is not None:
            self._own.ray_target_s += now - self._prev_end
        self._prev_end = None
        if not self._available():
            self._own.ray_undrafted_steps += 1
            return None
        ray = self._ray
        ref = self._actor.step.remote(batch, live, self._drops)
        self._drops = []
        try:
            reply: ActorReply = ray.get(ref, timeout=self.settings.ray_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self._own.ray_timeouts += 1
            self._own.ray_undrafted_steps += 1
            self._own.ray_wait_s += time.perf_counter() - now
            self._pending, self._pending_since = ref, time.monotonic()
            return None
        except (ray.exceptions.RayActorError, ray.exceptions.RaySystemError) as err:
            self._own.ray_undrafted_steps += 1
            self._restart(f"died ({type(err).__name__})")
            return None
        if self.settings.pipeline:
            self._actor.speculate.remote()
        self._restarts_in_a_row = 0
        self._actor_stats = reply.stats
        for error in reply.errors:
            logger.warning("hetero spec: pipelined drafting failed in the actor (drafts are made on demand):\n%s", error)
        end = time.perf_counter()
        self._own.ray_wait_s += end - now
        self._prev_end = end
        return reply.drafts

    def drop(self, req_id: str) -> None:
        self._drops.append(req_id)

    def reset(self) -> None:
        if self._actor is not None and self._is_ready:
            self._actor.reset.remote()

    def stats(self) -> DrafterStats:
        total = _add(self._base, self._actor_stats)
        own = self._own
        return dataclasses.replace(
            total,
            ray_wait_s=own.ray_wait_s,
            ray_target_s=own.ray_target_s,
            ray_timeouts=own.ray_timeouts,
            ray_restarts=own.ray_restarts,
            ray_undrafted_steps=own.ray_undrafted_steps,
            request_states=self._actor_stats.request_states,
            state_bytes=self._actor_stats.state_bytes,
        )

    def capture_graphs(self) -> int:
        """None: the actor drafts on CPU cores, where vLLM captures no graphs."""
        return 0

    def graph_memory(self) -> int:
        """None on the engine's device: the actor drafts eagerly on CPU cores."""
        return 0

    def profile(self, num_tokens: int, num_rows: int) -> None:
        """Nothing: the actor's memory is not the engine's device's."""

    def close(self) -> None:
        """Kill the actor, and shut Ray down if this process started it."""
        if self._closed:
            return
        self._closed = True
        ray = self._ray
        if not ray.is_initialized():
            return
        if self._actor is not None:
            try:
                ray.kill(self._actor, no_restart=True)
            except Exception:
                pass
            self._actor = None
        if self._owns_ray:
            ray.shutdown(wait_for_processes=True)
