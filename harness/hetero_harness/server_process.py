"""Run a real ``vllm serve`` on loopback for tests and benchmarks, and stop it cleanly.

vLLM's server is three processes on the CPU build (API server, engine core, worker), and
the engine core does not watch its parent; so the server starts in its own session and
is stopped by signalling the whole process group (SIGTERM, then SIGKILL after a grace
period), which leaves nothing behind even when a test fails half-way.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hetero_harness.cores import Lease, lease, pinned
from hetero_harness.evaluation import default_env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def vllm_command() -> list[str]:
    """The documented ``vllm`` console script of this environment."""
    return [str(Path(sys.executable).with_name("vllm"))]


class ServerProcess:
    """``vllm serve MODEL ARGS...`` on 127.0.0.1; use as a context manager."""

    def __init__(self, model: str, args: list[str], log_path: Path, startup_timeout: float = 600,
                 env: dict[str, str] | None = None, lease_cores: int | None = 0, core: int | None = None):
        """``lease_cores``: 0 takes no core lease (``cores.py``; a benchmark, alone on its
        machine); 1 leases a core and runs the whole server there (its process
        affinity: vLLM's own thread binding then puts its worker on that core, and the
        compile key stays the unpinned server's); None leases every core, held until
        :meth:`stop`, for a server whose engines spread over them. ``core``: run the
        whole server on this core, leased by the caller (``lease_cores`` 0)."""
        if core is not None and lease_cores != 0:
            raise ValueError("core= is for a core the caller holds: pass lease_cores=0")
        self.lease_cores = lease_cores
        self.core = core
        self._lease: Lease | None = None
        self.model = model
        self.args = args
        self.env = env or {}
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self._deadline = 0.0  # set by launch()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ServerProcess":
        """Launch the server and wait until it is healthy."""
        return self.launch().wait_ready()

    def launch(self) -> "ServerProcess":
        """Start the server process without waiting, so that several servers can start
        side by side (start-up is mostly single-threaded imports and loading)."""
        cmd = [*vllm_command(), "serve", self.model, "--host", "127.0.0.1", "--port", str(self.port), *self.args]
        env = default_env()
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server's normal process layout
        env.update(self.env)
        pin = None if self.core is None else [self.core]
        if self.lease_cores != 0:
            self._lease = lease(self.lease_cores)
            if self.lease_cores == 1:
                pin = self._lease.cores
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                     preexec_fn=None if pin is None else pinned(pin))
        self._deadline = time.monotonic() + self.startup_timeout
        return self

    def wait_ready(self) -> "ServerProcess":
        """Wait until the launched server answers /health (at once if it already has);
        stop it and raise if it exits or is not healthy within ``startup_timeout``."""
        if self.proc is None:
            raise RuntimeError("wait_ready() before launch()")
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.healthy():
                return self
            if time.monotonic() > self._deadline:
                break
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"vllm serve not healthy after {self.startup_timeout} s:\n{self.log_tail()}")

    def wait_for_log(self, patterns: tuple[str, ...], timeout: float | None = None) -> str:
        """Wait until the launched server's log holds one of ``patterns``; return it. Raises
        like :meth:`wait_ready` if the server exits first or ``timeout`` (default: what
        is left of the start-up timeout) passes."""
        if self.proc is None:
            raise RuntimeError("wait_for_log() before launch()")
        deadline = self._deadline if timeout is None else time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            found = next((p for p in patterns if p in text), None)
            if found:
                return found
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            time.sleep(0.5)
        raise TimeoutError(f"none of {patterns} in the vllm serve log:\n{self.log_tail()}")

    def healthy(self, timeout: float = 5) -> bool:
        """Whether the server answers /health with 200 now."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout) as resp:
                return resp.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = 30) -> None:
        if self.proc is None:
            return
        stop_group(self.proc, ((signal.SIGTERM, grace),))
        self._log.close()
        self.proc = None
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as {sample name with labels: value}, for the plugin's and vLLM's series."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as resp:
            text = resp.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def metric_sum(self, prefix: str) -> float:
        """Sum of every sample whose name (labels excluded) is ``prefix``."""
        return self.metric_sums([prefix])[prefix]

    def metric_sums(self, names: Iterable[str]) -> dict[str, float]:
        """Per name, the sum of its samples over their labels, from one read of ``/metrics``."""
        totals = dict.fromkeys(names, 0.0)
        for key, value in self.metrics().items():
            name = key.split("{", 1)[0]
            if name in totals:
                totals[name] += value
        return totals

    def metric_by_label(self, name: str, label: str) -> dict[str, float]:
        """``name``'s samples summed per value of their ``label`` ("" where it is absent),
        e.g. vLLM's per-engine counters of a data-parallel server."""
        out: dict[str, float] = {}
        for key, value in self.metrics().items():
            if key.split("{", 1)[0] == name:
                found = re.search(rf'{label}="([^"]*)"', key) if label else None
                tag = found.group(1) if found else ""
                out[tag] = out.get(tag, 0.0) + value
        return out

    def wait_for_metrics(self, want: dict[str, float], timeout: float = 60) -> dict[str, float]:
        """The metrics ``want`` names once each reads its value there (or their last
        readings after ``timeout`` s): gauges that settle after a load, such as the
        draft state of aborted requests."""
        deadline = time.monotonic() + timeout
        while True:
            current = self.metric_sums(want)
            if current == want or time.monotonic() > deadline:
                return current
            time.sleep(0.5)

    def openai_client(self) -> Any:
        """An OpenAI client for this server (no retries: a failure must show)."""
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0, timeout=600)

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def spec_arg(spec: dict[str, Any]) -> list[str]:
    return ["--speculative-config", json.dumps(spec)]


def stream_and_abandon(api: Any, chunks: int, **kwargs: Any) -> int:
    """Stream a completion from the OpenAI client ``api`` and close the connection after
    ``chunks`` chunks, as a client that goes away does (vLLM aborts the request); returns
    how many chunks came."""
    stream = api.completions.create(stream=True, **kwargs)
    seen = 0
    for _ in stream:
        seen += 1
        if seen == chunks:
            break
    stream.close()
    return seen


def stop_group(proc: subprocess.Popen, signals: tuple[tuple[int, float], ...]) -> None:
    """Send ``proc``'s process group each signal in turn until ``proc`` exits within that
    signal's grace (seconds), then SIGKILL whatever the group still holds: vLLM's engine
    core does not watch its parent."""
    for sig, grace in signals:
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            break
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
