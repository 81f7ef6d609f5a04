"""The documented server: `vllm serve TARGET --speculative-config configs/hetero.json`.

Real `vllm serve` processes on loopback (the console script, as a user runs it), queried
with the `openai` client: T = 0 outputs identical to a server without speculation for
completions and chat, streaming and not, under 32 concurrent requests; aborted streams
leave no draft state behind; bad requests get 4xx and the server keeps serving; the
metrics on /metrics are consistent; bad CLI configs stop the server at start-up.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer
from _serving import (COMMON, COMPILE_CACHED, MAX_MODEL_LEN, chat, complete, launch, parallel, target_compiled,
                      whole_machine)

from hetero_harness.evaluation import default_env
from hetero_harness.prompts import BRIDGE_STRESS
from hetero_harness.server_process import ServerProcess, stream_and_abandon, vllm_command


REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def cores() -> Iterator[list[int]]:
    """The machine to this module while it runs (``_serving.whole_machine``): a core for
    each server."""
    with whole_machine() as held:
        yield held


@pytest.fixture(scope="module")
def plain_server(cores: list[int], qwen05: str, tmp_path_factory: pytest.TempPathFactory):
    """A plain `vllm serve` of the target, the reference, on the first core. Returned
    launched, not yet ready, so that the hetero server can start beside it; call
    ``wait_ready()`` before use."""
    server = launch(qwen05, [], tmp_path_factory.mktemp("serve") / "plain.log", core=cores[0])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def servers(cores: list[int], plain_server: ServerProcess, qwen05: str, smollm2: str,
            tmp_path_factory: pytest.TempPathFactory):
    """The plain server and the documented hetero server, on the same target. The
    shipped config with one key added: a draft-length floor of 1. On this 0.5B target the
    adaptive budget may rightly stop drafting when drafts do not pay (it did on CI's
    machine, stop 29: no draft accepted in the first five requests), and identity with no
    drafts would prove nothing; the README's server runs the shipped config unchanged
    (test_readme_commands.py).

    Both load the target the README's server compiled, when it ran before them in this
    lane (``_serving.target_compiled``), and start side by side; when this module runs
    alone, the hetero server is launched once the plain server has compiled the target,
    so that it loads that compile rather than compiling beside it."""
    logs = tmp_path_factory.mktemp("serve")
    if not target_compiled():
        plain_server.wait_for_log(COMPILE_CACHED)
    spec = {**json.loads((REPO / "configs/hetero.json").read_text()), "min_speculative_tokens": 1}
    hetero = launch(qwen05, ["--speculative-config", json.dumps(spec)], logs / "hetero.log", core=cores[-1])
    try:
        plain_server.wait_ready()
        hetero.wait_ready()
    except Exception:
        hetero.stop()
        raise
    yield plain_server, hetero
    hetero.stop()


def test_the_hetero_and_plain_servers_share_the_targets_compile(servers) -> None:
    """A hetero engine's target is keyed in vLLM's compile cache as the same engine
    without speculation (``compile_cache.patch_target_compile_key``): the documented
    server loads the plain target's compile; and where the README's server (a hetero
    engine) compiled it first in this lane, the plain server loads that one."""
    plain, hetero = servers
    assert "Directly load AOT compilation" in hetero.log_path.read_text(errors="replace"), hetero.log_tail()
    if target_compiled():
        assert "Directly load AOT compilation" in plain.log_path.read_text(errors="replace"), plain.log_tail()


@pytest.mark.parametrize("stream", [False, True], ids=["plain-response", "streaming"])
def test_completions_and_chat_identical_to_plain_server(servers, stream: bool) -> None:
    plain, hetero = servers
    prompts = BRIDGE_STRESS[:4]
    question = "Write a Python function that reverses a string."
    def requests(server: ServerProcess) -> list[tuple]:
        return [(complete, server, p, 24, stream) for p in prompts] + [(chat, server, question, 24, stream)]

    # Every request to both servers at once: each server batches them as a user's load.
    out = parallel(lambda fn, *args: fn(*args), requests(hetero) + requests(plain))
    half = len(out) // 2
    assert out[:half] == out[half:]
    assert hetero.metric_sum("vllm:spec_decode_num_accepted_tokens_total") > 0


def test_32_concurrent_mixed_requests(servers) -> None:
    """Mixed prompts and lengths, completions and chat, some streaming, all at once."""
    plain, hetero = servers
    jobs = []
    for i in range(32):
        prompt = BRIDGE_STRESS[i % len(BRIDGE_STRESS)]
        jobs.append(("chat" if i % 4 == 3 else "completion", prompt, 8 + (i * 7) % 33, i % 3 == 0))

    def run(server: ServerProcess, kind: str, prompt: str, n: int, stream: bool) -> str:
        return (chat if kind == "chat" else complete)(server, prompt, n, stream)

    # Both servers at once, each on its own core: each serves its 32 as one load.
    out = parallel(run, [(server, *job) for server in (hetero, plain) for job in jobs])
    got, want = out[:len(jobs)], out[len(jobs):]
    assert all(g for g in got), "a request came back empty"
    assert got == want
    assert hetero.metric_sum("hetero:fallbacks_total") == 0


def test_aborted_streams_leave_no_draft_state(servers) -> None:
    _, hetero = servers

    def read_then_disconnect(i: int) -> int:
        return stream_and_abandon(hetero.openai_client(), 3, model=hetero.model, prompt=BRIDGE_STRESS[i % len(BRIDGE_STRESS)],
                                  max_tokens=200, temperature=0.0)

    assert parallel(read_then_disconnect, [(i,) for i in range(8)]) == [3] * 8
    settled = hetero.wait_for_metrics({"hetero:request_states": 0, "hetero:draft_state_bytes": 0}, 60)
    assert settled == {"hetero:request_states": 0, "hetero:draft_state_bytes": 0}, settled
    assert complete(hetero, "def add(a, b):", 8)


def _text(server: ServerProcess, prompt: str, **kwargs) -> str:
    kwargs = {"max_tokens": 24, "temperature": 0.0, **kwargs}
    return server.openai_client().completions.create(model=server.model, prompt=prompt, **kwargs).choices[0].text


def test_min_p_logit_bias_and_seeds_over_http(servers, qwen05: str) -> None:
    """vLLM refuses min_p and logit_bias under speculation ("not yet supported", 400);
    with method hetero both are served, exactly: a logit_bias at T = 0 gives the plain
    server's biased text (and changes it), min_p = 1 at T = 1 leaves only the argmax and
    gives the greedy text. A seeded request at T = 1 gives the same text alone and among
    concurrent requests, and another seed another text."""
    plain, hetero = servers
    prompt = BRIDGE_STRESS[0]
    sampled = {"temperature": 1.0, "top_p": 0.95, "max_tokens": 16}
    # The seeded request alone on the hetero server while the plain one answers the
    # unbiased request; then everything else on both at once: the seeded request among
    # six others on the hetero server, the biased one on the plain server.
    alone, unbiased = parallel(lambda fn: fn(), [(lambda: _text(hetero, prompt, seed=5, **sampled),),
                                                 (lambda: _text(plain, prompt),)])
    first = AutoTokenizer.from_pretrained(qwen05)(unbiased).input_ids[0]
    bias = {str(first): -100, "279": 5}  # the plain text's first token banned, " the" up
    jobs = [(hetero, p, {**sampled}) for p in BRIDGE_STRESS[1:4]] + [(hetero, prompt, {**sampled, "seed": 5})]
    jobs += [(hetero, p, {**sampled}) for p in BRIDGE_STRESS[4:7]]
    jobs += [(hetero, prompt, {"logit_bias": bias}),
             (hetero, prompt, {"temperature": 1.0, "extra_body": {"min_p": 1.0}}),
             (hetero, prompt, {**sampled, "seed": 6}), (plain, prompt, {"logit_bias": bias})]
    out = parallel(lambda server, p, extra: _text(server, p, **extra), jobs)
    among, (biased, min_p, other_seed, plain_biased) = out[:7], out[7:]
    assert biased == plain_biased != unbiased
    assert min_p == unbiased
    assert among[3] == alone
    assert other_seed != alone


# Every SamplingParams field plain decoding applies to the tokens, one request each at
# T = 0 over HTTP (docs/verification.md's table points here), sent at once with seeded T = 1
# requests, so the shipped config's steps draft greedy and sampled rows with different rules.
CODE = "def merge_sorted(a, b):"
FIELDS: dict[str, tuple[str, dict]] = {
    "repetition_penalty": (CODE, {"repetition_penalty": 1.3}),
    "presence and frequency penalties": (CODE, {"presence_penalty": 1.0, "frequency_penalty": 0.7}),
    "bad_words": (CODE, {"bad_words": [" the", "(", " if"]}),
    "allowed_token_ids": (CODE, {"allowed_token_ids": list(range(4000))}),
    "min_tokens": ("The capital of France is Paris.<|endoftext|>", {"min_tokens": 16}),
    "stop strings": (CODE, {"stop": ["\n"], "include_stop_str_in_output": True}),
    "logprobs": (CODE, {"logprobs": 3}),
    "prompt_logprobs": (CODE, {"prompt_logprobs": 2}),
    "n = 2": (BRIDGE_STRESS[1], {"n": 2, "temperature": 1.0, "min_p": 1.0}),  # n > 1 needs T > 0; min_p = 1: greedy
}


def _completion(server: ServerProcess, prompt: str, fields: dict) -> dict:
    body = {"model": server.model, "prompt": prompt, "max_tokens": 24, "temperature": 0.0, **fields}
    resp = httpx.post(f"{server.url}/v1/completions", json=body, timeout=600)
    assert resp.status_code == 200, resp.text[:500]
    return resp.json()


@pytest.fixture(scope="module")
def field_runs(servers) -> dict[str, tuple[dict, dict]]:
    """Each field's response from both servers (all requests at once), and the seeded
    T = 1 requests sent with them to the hetero server."""
    plain, hetero = servers
    seeded = [(hetero, p, {"temperature": 1.0, "seed": i}) for i, p in enumerate(BRIDGE_STRESS)]
    jobs = [(server, prompt, fields) for server in (hetero, plain) for prompt, fields in FIELDS.values()]
    out = parallel(_completion, jobs + seeded)
    assert all(o["choices"][0]["text"] for o in out[len(jobs):])
    return {field: (out[i], out[len(FIELDS) + i]) for i, field in enumerate(FIELDS)}


@pytest.mark.parametrize("field", list(FIELDS))
def test_every_sampling_field_as_plain_decoding_applies_it(field_runs, field: str) -> None:
    """The request with ``field`` set gives the plain server's text, finish and stop
    reasons, every completion (n), and the same logprobs (to float32 rounding between
    one- and multi-token forwards)."""
    got, want = field_runs[field]
    assert len(got["choices"]) == len(want["choices"])
    for g, w in zip(got["choices"], want["choices"]):
        assert (g["text"], g["finish_reason"], g["stop_reason"]) == (w["text"], w["finish_reason"], w["stop_reason"])
        if w["logprobs"] is not None:
            assert g["logprobs"]["tokens"] == w["logprobs"]["tokens"]
            assert g["logprobs"]["token_logprobs"] == pytest.approx(w["logprobs"]["token_logprobs"], abs=2e-3)
            assert [sorted(t) for t in g["logprobs"]["top_logprobs"]] == [sorted(t) for t in w["logprobs"]["top_logprobs"]]
        if w.get("prompt_logprobs") is not None:
            assert len(g["prompt_logprobs"]) == len(w["prompt_logprobs"])
            for a, b in zip(w["prompt_logprobs"], g["prompt_logprobs"]):
                assert (a is None) == (b is None)
                if a is not None:
                    assert a.keys() == b.keys()
                    assert [b[t]["logprob"] for t in a] == pytest.approx([a[t]["logprob"] for t in a], abs=2e-3)
    asked, first = FIELDS[field][1], got["choices"][0]
    if "n" in asked:
        assert len(got["choices"]) == asked["n"]
    if "logprobs" in asked:
        assert len(first["logprobs"]["tokens"]) > 0
    if "prompt_logprobs" in asked:
        assert first["prompt_logprobs"], "no prompt logprobs came back: the test would prove little"
    if "stop" in asked:
        assert first["finish_reason"] == "stop", "the stop string never came: the test would prove little"
    if "min_tokens" in asked:
        assert got["usage"]["completion_tokens"] >= asked["min_tokens"]


def test_greedy_and_sampled_rows_drafted_with_their_kinds_rules(field_runs, servers) -> None:
    """The shipped config's auto drafted greedy rows with a greedy candidate and the
    seeded T = 1 rows with a sampled one (counted per rule on /metrics)."""
    _, hetero = servers
    used = {r for r in ("slem", "tli", "slrs") if hetero.metric_sum(f"hetero:{r}_request_steps_total") > 0}
    assert {"slem", "tli"} & used and {"tli", "slrs"} & used and used != {"tli"}, used
    assert hetero.metric_sum("hetero:fallbacks_total") == 0


def _token_ids(choice: dict) -> list[int]:
    """A completion's token ids (asked with ``logprobs: 0, return_tokens_as_token_ids``)."""
    return [int(t.removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]]


def test_a_min_tokens_boundary_inside_a_step_stops_where_plain_decoding_stops(servers) -> None:
    """For each output index j of a greedy completion (24 tokens) whose token first occurs
    there, a request with ``min_tokens = j`` and that token as its stop token: plain
    decoding stops exactly at j (the stop is masked before j, where it is not the argmax
    anyway, and allowed at j). The hetero server drafts every step (its floor), so these
    boundaries fall on drafted rows and on bonus rows, where the stop must be allowed when
    committed outputs plus the accepted drafts reach ``min_tokens``."""
    plain, hetero = servers
    as_ids = {"logprobs": 0, "return_tokens_as_token_ids": True}
    base = _token_ids(_completion(plain, CODE, as_ids)["choices"][0])
    cases = [(j, t) for j, t in enumerate(base) if j > 0 and t not in base[:j]]
    assert len(cases) >= 8, base
    jobs = [(server, CODE, {**as_ids, "min_tokens": j, "stop_token_ids": [t]}) for server in (plain, hetero)
            for j, t in cases]
    out = parallel(_completion, jobs)
    want, got = out[:len(cases)], out[len(cases):]
    for (j, t), w, g in zip(cases, want, got):
        assert _token_ids(w["choices"][0]) == base[: j + 1] and w["choices"][0]["stop_reason"] == t, (j, w)
        assert _token_ids(g["choices"][0]) == base[: j + 1], f"min_tokens = {j}: {_token_ids(g['choices'][0])}"
        assert g["choices"][0]["finish_reason"] == "stop" and g["choices"][0]["stop_reason"] == t


BAD_REQUESTS = {
    "algorithm unknown": {"prompt": "hi", "max_tokens": 4, "vllm_xargs": {"algorithm": "nope"}},
    "algorithm the engine lacks": {"prompt": "hi", "max_tokens": 4, "vllm_xargs": {"algorithm": "union"}},
    "fsd_threshold negative": {"prompt": "hi", "max_tokens": 4, "vllm_xargs": {"fsd_threshold": -1}},
    "fsd_threshold not a number": {"prompt": "hi", "max_tokens": 4, "vllm_xargs": {"fsd_threshold": "abc"}},
    "fsd_threshold misspelt": {"prompt": "hi", "max_tokens": 4, "vllm_xargs": {"fsd_treshold": 0.1}},
    "fsd_threshold while streaming": {
        "prompt": "hi", "max_tokens": 4, "stream": True, "vllm_xargs": {"fsd_threshold": -1},
    },
    "prompt longer than the context": {"prompt": "word " * (2 * MAX_MODEL_LEN), "max_tokens": 4},
    "empty prompt": {"prompt": "", "max_tokens": 4},
    "lone surrogate": {"prompt": "\ud800 hi", "max_tokens": 4},
    "wrongly typed field": {"prompt": "hi", "max_tokens": "many"},
    "negative max_tokens": {"prompt": "hi", "max_tokens": -3},
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_requests_get_4xx_and_the_server_keeps_serving(servers, case: str) -> None:
    _, hetero = servers
    body = {"model": hetero.model, **BAD_REQUESTS[case]}
    # json.dumps escapes a lone surrogate as \ud800, as any JSON client would send it.
    resp = httpx.post(f"{hetero.url}/v1/completions", content=json.dumps(body),
                      headers={"content-type": "application/json"}, timeout=120)
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text[:500])
    assert "error" in resp.json()
    assert hetero.alive()
    assert complete(hetero, "def add(a, b):", 4)


def test_unknown_top_level_fields_are_ignored_as_vllm_documents(servers) -> None:
    """vLLM's OpenAI server ignores unknown top-level fields (and logs them) so that
    newer clients keep working; the plugin keeps that contract."""
    plain, hetero = servers
    extra = {"extra_body": {"not_a_vllm_field": 1}}
    assert complete(hetero, "def add(a, b):", 8, **extra) == complete(plain, "def add(a, b):", 8)


def test_spec_decode_metrics_are_consistent(servers) -> None:
    """vLLM's counters see our drafts (and accepted <= drafted, per position too); the
    plugin's own series are on /metrics with the configured algorithm."""
    _, hetero = servers
    complete(hetero, BRIDGE_STRESS[0], 16)
    m = hetero.metrics()
    drafts = hetero.metric_sum("vllm:spec_decode_num_drafts_total")
    draft_tokens = hetero.metric_sum("vllm:spec_decode_num_draft_tokens_total")
    accepted = hetero.metric_sum("vllm:spec_decode_num_accepted_tokens_total")
    per_pos = [v for k, v in m.items() if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total")]
    assert drafts > 0 and 0 < accepted <= draft_tokens <= 4 * drafts
    assert len(per_pos) == 4 and sum(per_pos) == accepted
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:])), "acceptance per position must not increase"
    assert hetero.metric_sum("hetero:steps_total") > 0
    assert hetero.metric_sum("hetero:proposed_tokens_total") >= draft_tokens
    assert 0 < hetero.metric_sum("hetero:bridge_seconds_total") < hetero.metric_sum("hetero:draft_seconds_total")
    assert any(k.startswith("hetero:steps_total{") and 'algorithm="auto"' in k for k in m)
    # auto: every drafted request-step is counted under the rule it drafted with.
    by_rule = sum(hetero.metric_sum(f"hetero:{rule}_request_steps_total") for rule in ("slem", "tli", "slrs"))
    assert by_rule > 0 and hetero.metric_sum("hetero:slem_request_steps_total") > 0


def _serve_fails(model: str, spec: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess, float]:
    """A `vllm serve` expected to stop at start-up: its process and its seconds."""
    began = time.monotonic()
    proc = subprocess.run(
        [*vllm_command(), "serve", model, "--port", "1", *COMMON, "--speculative-config", spec],
        capture_output=True, text=True, timeout=timeout, env=default_env(),
    )
    return proc, time.monotonic() - began


BAD_CONFIGS = {
    "unknown algorithm": ('{"method": "hetero", "model": "smollm2-135m", "num_speculative_tokens": 4, '
                          '"algorithm": "nope"}', "'algorithm' = 'nope' is not supported"),
    "missing file": ("configs/does-not-exist.json", "does not exist"),
}


@pytest.fixture(scope="module")
def bad_config_runs(qwen05: str) -> dict[str, tuple[subprocess.CompletedProcess, float]]:
    """Every bad config's `vllm serve` at once (each is mostly single-threaded imports)."""
    return dict(zip(BAD_CONFIGS, parallel(lambda spec: _serve_fails(qwen05, spec),
                                         [(spec,) for spec, _ in BAD_CONFIGS.values()])))


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_cli_config_fails_fast_with_the_key(bad_config_runs: dict, case: str) -> None:
    proc, seconds = bad_config_runs[case]
    needle = BAD_CONFIGS[case][1]
    assert proc.returncode != 0
    assert needle in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert seconds < 120
