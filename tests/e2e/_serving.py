"""Helpers for the serving tests: real `vllm serve` processes queried with the `openai`
client."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
from collections.abc import Iterator
from pathlib import Path

from hetero_harness.cores import lease
from hetero_harness.server_process import ServerProcess

#: The target's own context (Qwen2.5-Coder-0.5B's), which the servers run at by default.
MAX_MODEL_LEN = 32768
# The README's `vllm serve` flags, exactly: vLLM's defaults (torch.compile, its profile run
# and warm-up) and float32. So the test servers share the README server's compile key:
# test_readme_commands.py, which runs first, compiles the target once and every server
# here loads it (vLLM keys its compile cache by the config; the plugin keys a hetero
# engine's target as the plain engine's).
COMMON = ["--dtype", "float32"]
#: vLLM's log lines for a compiled target written to, or read from, its compile cache.
COMPILE_CACHED = ("saved AOT compiled function", "Directly load AOT compilation")
#: Whether a server on these flags has been ready in this process (the README module's,
#: which runs first in its lane): its target's compile is then in vLLM's cache.
_target_compiled = False


def note_target_compiled() -> None:
    """A server on the README server's flags is ready: its target's compile is cached."""
    global _target_compiled
    _target_compiled = True


def target_compiled() -> bool:
    """Whether :func:`note_target_compiled` was called in this process."""
    return _target_compiled


def launch(model: str, extra: list[str], log: Path, env: dict[str, str] | None = None,
           lease_cores: int | None = 0, core: int | None = None) -> ServerProcess:
    """A `vllm serve` of ``model`` with the tests' common flags (``env`` added to its
    environment), launched without waiting (call ``wait_ready()`` before use), holding
    a lease on ``lease_cores`` cores while it runs (``ServerProcess``): 0 where the
    module holds the lease (:func:`whole_machine`) and gives the server its ``core``."""
    return ServerProcess(model, COMMON + extra, log, env=env, lease_cores=lease_cores, core=core).launch()


@contextlib.contextmanager
def whole_machine() -> Iterator[list[int]]:
    """Hold every core (``hetero_harness/cores.py``) for a module whose two engines run
    side by side, so that no other module's engine runs beside them; yields the cores,
    one for each engine (``cores.pinned``). For memory: with their compiled graphs, KV
    cache, draft pool and a 152k-vocabulary profile run, each holds about 9-10 GiB, and
    with a Gemma engine of the rules module beside them the kernel's out-of-memory
    killer took the README server's worker (24 GiB machine)."""
    with lease(None) as held:
        yield held.cores


def complete(server: ServerProcess, prompt: str, max_tokens: int, stream: bool = False, **extra) -> str:
    api = server.openai_client()
    kwargs = dict(model=server.model, prompt=prompt, max_tokens=max_tokens, temperature=0.0, **extra)
    if not stream:
        return api.completions.create(**kwargs).choices[0].text
    return "".join(chunk.choices[0].text for chunk in api.completions.create(stream=True, **kwargs))


def chat(server: ServerProcess, content: str, max_tokens: int, stream: bool = False) -> str:
    api = server.openai_client()
    kwargs = dict(
        model=server.model, messages=[{"role": "user", "content": content}], max_tokens=max_tokens, temperature=0.0
    )
    if not stream:
        return api.chat.completions.create(**kwargs).choices[0].message.content
    return "".join(c.choices[0].delta.content or "" for c in api.chat.completions.create(stream=True, **kwargs))


def parallel(fn, jobs: list[tuple]) -> list:
    with cf.ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return list(pool.map(lambda job: fn(*job), jobs))
