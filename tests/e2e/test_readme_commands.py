"""The README's Quick start, as a user pastes it into a fresh shell.

Both snippets are read from README.md itself (the first ```python and ```bash blocks
under "## Quick start"), so the README cannot drift from what runs. They run with none
of the suite's variables (no VLLM_*, OMP_NUM_THREADS, TOKENIZERS_PARALLELISM, PYTEST_*
or the plugin's HETERO_SPEC_*): vLLM's default process layout and flags, and only the
environment variables the commands themselves show. HOME and PATH stay (the model
cache and the shell's tools). The one variable added is ``HETERO_SPEC_METRICS_DIR`` for
the offline run: where the plugin's worker writes its ``hetero:*`` counters, so that
the test can read them after the process has exited (it changes nothing else).

The serve block and the offline snippet run side by side (start-up with vLLM's
default flags, torch.compile included, is most of each), each on a core of its own: the
machine's shape, not a setting (process affinity: no variable or flag changes), where
vLLM's thread binding had put both workers on the first core. Started one after the other
they took as long: the snippet's compile key is not the server's (vLLM keys its compile
by the whole engine config, and the offline and server defaults differ), so it compiled
again rather than loading the server's. Both start with the module, and the serve
block's requests run while the snippet is still starting: the server is ready first,
and it had sat idle, one core with it, until the snippet's test ended.
"""

from __future__ import annotations

import ast
import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from hetero_harness.cores import pinned
from hetero_harness.server_process import stop_group
from _serving import note_target_compiled, whole_machine
from _user_shell import user_env
from vllm_hetero_spec.metrics import read_boards

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv" / "bin" / "python"
# vLLM's default address: the README's command names no port.
URL = "http://localhost:8000"
STARTUP_S = 900
def quick_start() -> tuple[str, str]:
    """The (python, bash) code blocks of the README's Quick start section."""
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## Quick start\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, 'README.md has no "## Quick start" section'
    blocks = {}
    for lang in ("python", "bash"):
        found = re.search(rf"^```{lang}\n(.*?)^```", section.group(1), re.M | re.S)
        assert found, f'no ```{lang} block under "## Quick start" in README.md'
        blocks[lang] = found.group(1)
    return blocks["python"], blocks["bash"]


def _get(path: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(URL + path, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _post(path: str, body: dict, timeout: float = 600) -> tuple[int, dict]:
    req = urllib.request.Request(URL + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def _port_taken(port: int = 8000) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


class Served:
    """The README's serve block, run as pasted (``bash -c``) in a process group of its own."""

    def __init__(self, block: str, log: Path, core: int):
        self.log_path = log
        self._log = open(log, "w")
        self.proc = subprocess.Popen(["bash", "-c", block], cwd=ROOT, env=user_env(), stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=pinned([core]))
        self.began = time.monotonic()
        self.ready_s: float | None = None

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait_ready(self) -> None:
        while self.ready_s is None:
            if self.proc.poll() is not None:
                pytest.fail(f"the README's serve block exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if _get("/health")[0] == 200:
                    self.ready_s = time.monotonic() - self.began
                    note_target_compiled()
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() - self.began > STARTUP_S:
                pytest.fail(f"{URL}/health not ready after {STARTUP_S} s:\n{self.log_tail()}")
            time.sleep(1)

    def stop(self) -> None:
        """SIGINT (Ctrl-C, as a user stops it), then SIGTERM, then SIGKILL, to the group."""
        stop_group(self.proc, ((signal.SIGINT, 30), (signal.SIGTERM, 15)))
        self._log.close()


@pytest.fixture(scope="module", autouse=True)
def cores() -> Iterator[list[int]]:
    """The machine to this module while it runs (``_serving.whole_machine``): the offline
    run on the first core, the server on the last."""
    with whole_machine() as held:
        yield held


def _serve_selected(request: pytest.FixtureRequest) -> bool:
    return any(item.module is request.module and "serve" in item.name for item in request.session.items)


@pytest.fixture(scope="module")
def served(request: pytest.FixtureRequest, cores: list[int], tmp_path_factory: pytest.TempPathFactory):
    """The serve block, launched at once (not yet ready) when a serving test is selected;
    the offline snippet, when selected, starts beside it."""
    if any(item.module is request.module and "offline" in item.name for item in request.session.items):
        request.getfixturevalue("offline")
    if not _serve_selected(request):
        yield None
        return
    if _port_taken():
        pytest.fail("port 8000 is taken: the README's `vllm serve` listens on vLLM's default port; free it first")
    server = Served(quick_start()[1], tmp_path_factory.mktemp("readme") / "serve.log", cores[-1])
    try:
        yield server
    finally:
        server.stop()


class Offline:
    """The README's Python snippet, saved to a file and started with the venv's python
    from the repo root, in the background: :meth:`wait` for its exit."""

    def __init__(self, block: str, folder: Path, core: int):
        self.script = folder / "quick_start.py"
        self.script.write_text(block)
        self.boards = folder / "metrics"
        self.boards.mkdir()
        self.log_path = folder / "offline.log"
        self._log = open(self.log_path, "w+")
        self.began = time.monotonic()
        self.proc = subprocess.Popen([str(PYTHON), str(self.script)], cwd=ROOT,
                                     env=user_env(HETERO_SPEC_METRICS_DIR=str(self.boards)), stdout=self._log,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                     preexec_fn=pinned([core]))

    def wait(self) -> tuple[int, str, float]:
        """Exit status, output, and seconds from start to exit."""
        try:
            returncode = self.proc.wait(timeout=max(1.0, STARTUP_S - (time.monotonic() - self.began)))
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"the offline snippet ran past {STARTUP_S} s:\n{self.log_path.read_text()[-6000:]}")
        seconds = time.monotonic() - self.began
        self._log.seek(0)
        return returncode, self._log.read(), seconds

    def stop(self) -> None:
        stop_group(self.proc, ((signal.SIGTERM, 15),))
        self._log.close()


@pytest.fixture(scope="module")
def offline(request: pytest.FixtureRequest, cores: list[int], tmp_path_factory: pytest.TempPathFactory):
    """The offline snippet, started with the module (beside the serve block) on the first core."""
    python_block = quick_start()[0]
    assert "/path/to" not in python_block, "the snippet has a placeholder path"
    run = Offline(python_block, tmp_path_factory.mktemp("offline"), cores[0])
    try:
        yield run
    finally:
        run.stop()


SCHEMA = {
    "type": "object",
    "properties": {
        "language": {"type": "string", "enum": ["python", "c", "rust"]},
        "lines": {"type": "integer", "minimum": 1, "maximum": 99},
        "recursive": {"type": "boolean"},
    },
    "required": ["language", "lines", "recursive"],
    "additionalProperties": False,
}


def _chat(model: str, content: str, **extra) -> tuple[int, dict]:
    return _post("/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 48, "temperature": 0.0,
        **extra,
    })


def test_serve_block_runs_as_pasted(served: Served) -> None:
    """The bash block serves on vLLM's default port: a chat reply, a JSON-schema reply at
    T = 1 that follows the schema, HTTP 400 naming the parameter for a bad per-request
    setting, and the server still serving after it; our drafter's tokens were accepted."""
    import jsonschema

    served.wait_ready()
    status, models = _get("/v1/models")
    assert status == 200, models
    model = json.loads(models)["data"][0]["id"]
    assert model.endswith("qwen2.5-coder-0.5b"), model

    status, reply = _chat(model, "Write a Python function that adds two numbers.")
    assert status == 200, reply
    assert reply["choices"][0]["message"]["content"].strip(), reply

    status, reply = _chat(model, "Describe a Fibonacci function as JSON: language, lines, recursive.",
                          temperature=1.0, max_tokens=200, seed=7,
                          response_format={"type": "json_schema",
                                           "json_schema": {"name": "function", "schema": SCHEMA, "strict": True}})
    assert status == 200, reply
    jsonschema.validate(json.loads(reply["choices"][0]["message"]["content"]), SCHEMA)

    status, reply = _chat(model, "hi", max_tokens=4, vllm_xargs={"fsd_threshold": -1})
    assert status == 400, (status, reply)
    assert "vllm_xargs.fsd_threshold" in json.dumps(reply), reply
    assert served.proc.poll() is None, "the server exited after a bad request"

    status, reply = _chat(model, "Write a Python function that multiplies two numbers.")
    assert status == 200, reply
    assert reply["choices"][0]["message"]["content"].strip(), reply

    metrics = _get("/metrics", timeout=30)[1]

    def total(name: str) -> float:
        return sum(float(line.rpartition(" ")[2]) for line in metrics.splitlines()
                   if line.split("{", 1)[0].split(" ", 1)[0] == name)

    assert total("hetero:steps_total") > 0, "our proposer never ran"
    assert total("vllm:spec_decode_num_accepted_tokens_total") > 0, "no draft token was accepted"
    print(f"serve block: healthy after {served.ready_s:.0f} s", file=sys.stderr)


def test_offline_snippet_runs_as_pasted(served, offline: Offline) -> None:
    """The Python snippet exits 0 and prints a RequestOutput with text, and the hetero
    drafter ran."""
    returncode, log, seconds = offline.wait()
    assert returncode == 0, log[-6000:]
    found = re.search(r"CompletionOutput\(index=0, text=('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")", log)
    assert found, f"no RequestOutput printed:\n{log[-3000:]}"
    assert ast.literal_eval(found.group(1)).strip(), "the generated text is empty"
    # The proposer's own line, logged where vLLM built it (the worker process).
    assert re.search(r"hetero spec: algorithm=auto .* k=4 draft=\S*smollm2-135m", log), \
        "no hetero proposer in the log:\n" + log[-3000:]
    workers = [values for _, values in read_boards(offline.boards)]
    assert len(workers) == 1, workers
    # The drafter really ran: steps planned and target tokens proposed to the verifier.
    assert workers[0]["steps"] > 0 and workers[0]["proposed_tokens"] > 0, workers[0]
    assert workers[0]["fallbacks"] == 0, workers[0]
    print(f"offline snippet: {seconds:.0f} s")
