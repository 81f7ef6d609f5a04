"""Helpers for the serving tests: real `vllm serve` processes queried with the `openai`
client."""

from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path

from hetero_harness.server_process import ServerProcess

MAX_MODEL_LEN = 512
# vLLM's default flags (torch.compile, its profile run and warm-up), as the README's
# command runs: no --enforce-eager, though it would start each server about a minute sooner.
COMMON = ["--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--generation-config", "vllm"]


def launch(model: str, extra: list[str], log: Path) -> ServerProcess:
    """A `vllm serve` of ``model`` with the tests' common flags, launched without
    waiting (call ``wait_ready()`` before use)."""
    return ServerProcess(model, COMMON + extra, log).launch()


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
