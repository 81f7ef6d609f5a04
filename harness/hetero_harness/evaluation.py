"""One engine run, isolated in a subprocess, returning outputs and spec-decode metrics.

vLLM engines hold process-wide state (distributed groups, compiled kernels, memory);
running each configuration in a fresh process is the only reliable way to compare
several in one benchmark or test session. The child prints one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hetero_harness.cores import lease, machine_cores
from vllm_hetero_spec.advise.counters import spec_decode_delta

RESULT_PREFIX = "HETERO_RESULT "


def default_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def run_isolated(job: dict[str, Any], timeout: float = 1800, env: dict[str, str] | None = None,
                 core: int | None = None, charge: str | None = None, lease_cores: int | None = 0) -> dict[str, Any]:
    """Run :func:`run_job` on ``job`` in a child process (``env`` added to its
    environment) and return its result. With ``core`` (one the caller holds a lease on,
    ``cores.py``), the whole child runs on that one core: its OpenMP threads and every
    other thread it starts (see :func:`_pin`). ``lease_cores``: 0 takes no lease (a
    benchmark, alone on its machine); 1 leases a core and pins the child to it; None
    leases every core, which the job's own binding spreads over (tensor parallelism, a
    Ray drafter). With ``charge``, the test suite's cost ledger charges the child's
    engine to that budget line instead of the running test module's
    (``cost_ledger.charge_child``)."""
    if core is not None or lease_cores == 0:
        return _run_child(job, timeout, env, core, charge)
    with lease(lease_cores) as held:
        return _run_child(job, timeout, env, held.cores[0] if lease_cores == 1 else None, charge)


def _run_child(job: dict[str, Any], timeout: float, env: dict[str, str] | None, core: int | None,
               charge: str | None) -> dict[str, Any]:
    from hetero_harness import cost_ledger

    # -P: the working directory is not put first on sys.path, so an ``env`` PYTHONPATH
    # that names an earlier checkout (defaults.py --before) is the one imported, not the
    # repository the caller runs in (both packages are installed, so nothing needs it).
    argv = [sys.executable, "-P", "-m", "hetero_harness.evaluation", json.dumps(job)]
    if core is not None:
        argv.append(str(core))
        # vLLM binds the worker's threads to the core, unless the caller binds several
        # workers itself (tensor parallelism on one core: "N|N").
        env = {"VLLM_CPU_OMP_THREADS_BIND": str(core), **(env or {})}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**default_env(), **(env or {})})
    if charge:
        cost_ledger.charge_child(proc.pid, charge)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    finally:
        cost_ledger.release_child(proc.pid)
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    raise RuntimeError(f"engine run failed (exit {proc.returncode}):\n{stderr[-6000:]}")


def run_isolated_many(jobs: list[dict[str, Any]], parallel: int | None = None,
                      timeout: float = 1800, env: dict[str, str] | None = None,
                      charges: list[str | None] | None = None) -> list[dict[str, Any] | Exception]:
    """Run each of ``jobs`` with :func:`run_isolated` (``env`` added to each child's
    environment), ``parallel`` at a time (default: one per CPU core), each child pinned
    to a core it holds a lease on (``cores.py``: a core another test's engine holds is
    not shared), and return
    their results in order; a job that failed gives its exception in its place (one
    failed configuration must not hide the others' results).

    Why: a short engine run is mostly start-up (imports, model loading, ~20-30 s), much
    of it single-threaded, so two children side by side shorten a test module (greedy
    e2e: 6:36 -> 5:20); pinning each to its own core keeps their compute phases from
    fighting over both cores. Results do not depend on it: a child's outputs are compared only
    with other children's, all run the same way (one thread each when parallel)."""
    parallel = max(1, min(parallel or len(machine_cores()), len(jobs)))

    def one(job: dict[str, Any], charge: str | None) -> dict[str, Any] | Exception:
        try:
            return run_isolated(job, timeout, env=env, charge=charge, lease_cores=1)
        except Exception as exc:  # noqa: BLE001 -- handed back in the job's place
            return exc

    with ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(one, jobs, charges or [None] * len(jobs)))


def unwrap(result: dict[str, Any] | Exception) -> dict[str, Any]:
    """One of :func:`run_isolated_many`'s results, or the exception its job raised,
    raised here (where the caller needs that one job)."""
    if isinstance(result, Exception):
        raise result
    return result


def _find_drafter(llm: Any) -> Any:
    """The in-process drafter, when the engine runs in this process (stats only)."""
    try:
        core = llm.llm_engine.engine_core.engine_core
        return core.model_executor.driver_worker.worker.model_runner.drafter
    except AttributeError:
        return None


#: The model runner's methods every job times: the target's forward and logits
#: (``execute_model``), sampling with verification and drafting (``sample_tokens``, which
#: calls the proposer), and drafting alone.
RUNNER_TIMED = ("execute_model", "sample_tokens", "propose_draft_token_ids")

#: The worker extension through which a job reads the worker, wherever it runs.
PROBE = "hetero_harness.worker_probe.JobProbe"


def start_engine(job: dict[str, Any]) -> Any:
    """:func:`run_job`'s ``LLM`` for ``job`` (keys: target, dtype, max_model_len,
    max_num_batched_tokens (default: vLLM's), enforce_eager, speculative_config, seed,
    max_num_seqs, tensor_parallel_size, num_kv_blocks, skip_tokenizer_init,
    async_scheduling, attention_backend, time_calls), its runner timed by the probe."""
    from vllm import LLM

    llm = LLM(
        model=job["target"],
        dtype=job.get("dtype", "float32"),
        max_model_len=job.get("max_model_len", 2048),
        max_num_batched_tokens=job.get("max_num_batched_tokens"),
        enforce_eager=job.get("enforce_eager", False),
        speculative_config=job.get("speculative_config"),
        disable_log_stats=False,
        seed=job.get("seed", 0),
        max_num_seqs=job.get("max_num_seqs", 16),
        tensor_parallel_size=job.get("tensor_parallel_size", 1),
        num_gpu_blocks_override=job.get("num_kv_blocks"),
        skip_tokenizer_init=job.get("skip_tokenizer_init", False),
        async_scheduling=job.get("async_scheduling"),
        attention_backend=job.get("attention_backend"),
        worker_extension_cls=PROBE,
    )
    # The engine runs with vLLM's default process layout (the worker in the engine
    # core's process) unless VLLM_ENABLE_V1_MULTIPROCESSING=0 says otherwise; the probe
    # times the runner and reads the drafter wherever the worker is.
    llm.collective_rpc("hetero_probe_time", args=(list(RUNNER_TIMED + tuple(job.get("time_calls", ()))),))
    return llm


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Generate ``job['prompts']`` with the given engine settings; time the batch.

    Keys: target, prompts, max_tokens (or one per prompt), temperature, seed, speculative_config (or None),
    dtype, max_model_len, batch_size (requests submitted at once; default all),
    tensor_parallel_size (default 1), num_kv_blocks (the target's KV blocks; small
    values make vLLM preempt), max_num_seqs (default 16),
    warmup (default True: 4 tokens of the first prompt; "full": the whole job once,
    untimed), stop (strings that end a request's output; default none), temperatures
    (one per prompt, instead of ``temperature``), skip_tokenizer_init (prompts are then
    token-id lists and outputs have no text: an engine without vLLM's tokenizer starts
    about 18 s sooner on one core with Gemma-3's, which vLLM loads and deep-copies twice),
    async_scheduling (vLLM's default when absent: on for plain decoding, off with our
    proposer), enforce_eager (vLLM's default, False, when absent: what users run; True
    skips torch.compile and its warm-up, which only makes a test start sooner),
    json_schemas (one per prompt, or None: structured output, a JSON schema the output
    must follow), params (one dict per prompt of more ``SamplingParams`` fields, e.g.
    min_p, logit_bias), solo (prompt indices run again one at a time after the timed
    batch, their tokens returned as ``solo_token_ids`` and their drafts as ``solo_num_drafts``, per request
    ``solo_num_drafts_each``; the
    batch's metrics do not count them), time_calls (more runner methods to time, e.g. ``_model_forward``; the
    result then carries every timed method's per-call seconds as ``runner_calls``), phases (a list of dicts,
    each a job's keys over this one's, run in order on the one engine, each timed apart: the result is then
    ``{"phases": [result, ...]}``; an engine started once serves several cells, as a server does).
    """
    llm = start_engine(job)
    if "phases" not in job:
        return _run_phase(llm, job)
    return {"phases": per_phase([_run_phase(llm, {**job, **phase}) for phase in job["phases"]])}


#: The proposer's counters, from the engine's start; a phase reports its own share (the
#: first, from the start: its warm-up included).
_POLICY_COUNTERS = ("draft_lengths", "exploration", "rules_chosen")


def per_phase(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The phases' results, each phase's proposer counters made its own share: the
    engine's counters as it left them less as the phase before left them."""
    out: list[dict[str, Any]] = []
    seen: dict[str, Any] = {}  # the counters as the previous phase left them
    for result in results:
        counted = {key: result[key] for key in _POLICY_COUNTERS if key in result}
        out.append({**result, **{key: _since(value, seen[key]) for key, value in counted.items() if key in seen}})
        seen = counted
    return out


def _since(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """``after``'s counters less ``before``'s, key by key (nested dicts too)."""
    out: dict[str, Any] = {}
    for key, value in after.items():
        if isinstance(value, dict):
            out[key] = _since(value, before.get(key) or {})
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value - before.get(key, 0)
        else:
            out[key] = value
    return out


def _run_phase(llm: Any, job: dict[str, Any]) -> dict[str, Any]:
    """One timed job on a running engine (its proposer's counters from the engine's start)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import StructuredOutputsParams

    temps = job.get("temperatures") or [job.get("temperature", 0.0)] * len(job["prompts"])
    detokenize = not job.get("skip_tokenizer_init", False)
    seeds = job.get("request_seeds")
    schemas = job.get("json_schemas") or [None] * len(job["prompts"])
    prompts = [TokensPrompt(prompt_token_ids=p) if isinstance(p, list) else p for p in job["prompts"]]

    max_tokens = job.get("max_tokens", 64)
    lengths = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)

    extra = job.get("params") or [{}] * len(prompts)

    def params(i: int) -> SamplingParams:
        fields: dict[str, Any] = dict(
            max_tokens=lengths[i],
            temperature=temps[i],
            top_p=job.get("top_p", 1.0),
            top_k=job.get("top_k", 0),
            seed=None if seeds is None else seeds[i],
            ignore_eos=job.get("ignore_eos", False),
            stop=job.get("stop"),
            detokenize=detokenize,
            structured_outputs=None if schemas[i] is None else StructuredOutputsParams(json=schemas[i]),
        )
        fields.update(extra[i])
        if fields.get("logit_bias"):  # JSON keys are strings
            fields["logit_bias"] = {int(token): value for token, value in fields["logit_bias"].items()}
        return SamplingParams(**fields)

    bs = job.get("batch_size") or len(prompts)

    def generate_all() -> list[Any]:
        outputs = []
        for s in range(0, len(prompts), bs):
            chunk = list(range(s, min(s + bs, len(prompts))))
            outputs += llm.generate([prompts[i] for i in chunk], [params(i) for i in chunk], use_tqdm=False)
        return outputs

    warmup = job.get("warmup", True)
    if warmup == "full":
        # The whole job once, untimed: the first pass at each new shape is slow on a CPU
        # (measured: a batch of 8 ran 15.2 tok/s the first time, 17.8-18.5 after).
        generate_all()
    elif warmup:
        llm.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0.0, detokenize=detokenize), use_tqdm=False)
    before = {m.name: m for m in llm.get_metrics()}
    llm.collective_rpc("hetero_probe_reset")
    t0 = time.perf_counter()
    outputs = generate_all()
    elapsed = time.perf_counter() - t0
    after = llm.get_metrics()
    # Rank 0's worker (under tensor parallelism the one that drafts).
    probe = llm.collective_rpc("hetero_probe_report")[0]
    if job.get("draft_ms_batches"):
        probe["draft_forward_ms"] = llm.collective_rpc("hetero_probe_draft_ms", args=(job["draft_ms_batches"],))[0]
    runner_calls = probe.pop("runner_calls")
    # Requests run again one at a time, after the batch (another batch, another history).
    solo, solo_each, solo_accepted, seen = [], [], [], {m.name: m for m in after}
    for i in job.get("solo", []):
        solo.append(llm.generate([prompts[i]], [params(i)], use_tqdm=False)[0])
        now = llm.get_metrics()
        delta = spec_decode_delta(seen, now)
        solo_each.append(delta["num_drafts"])
        solo_accepted.append(delta["num_accepted_tokens"])
        seen = {m.name: m for m in now}
    solo_drafts = sum(solo_each)

    spec = spec_decode_delta(before, after)
    n_out = sum(len(o.outputs[0].token_ids) for o in outputs)
    result: dict[str, Any] = {
        "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
        "texts": [o.outputs[0].text for o in outputs],
        "elapsed_s": elapsed,
        "output_tokens": n_out,
        "tok_per_s": n_out / elapsed if elapsed > 0 else 0.0,
        **spec,
        "solo_token_ids": [list(o.outputs[0].token_ids) for o in solo],
        "solo_num_drafts": solo_drafts,
        "solo_num_drafts_each": solo_each,
        "solo_num_accepted_each": solo_accepted,
        # What a request's params asked for beyond its first completion's tokens.
        "extras": [_extras(o) for o in outputs],
    }
    # Where the timed part went, as vLLM's runner sees it; drafting timed at the same
    # place for any drafter (ours: bridge included).
    propose = runner_calls["propose_draft_token_ids"]
    result["propose_s"] = sum(propose)
    result["propose_calls"] = len(propose)
    result["runner_s"] = {name: sum(runner_calls[name]) for name in RUNNER_TIMED}
    if job.get("time_calls"):
        result["runner_calls"] = runner_calls
    draft_tokens = spec["num_draft_tokens"]
    result["propose_ms_per_draft_token"] = 1e3 * sum(propose) / draft_tokens if draft_tokens else None
    # Every worker's hetero:* slots (with TP each rank's proposer has its own board).
    from vllm_hetero_spec.metrics import metrics_dir, read_boards

    result["worker_metrics"] = [values for _, values in read_boards(metrics_dir(), os.getpid())]
    result.update(probe)
    return result


def _extras(output: Any) -> dict[str, Any]:
    """Every completion's tokens (``n`` > 1), the sampled tokens' logprobs and the
    prompt's (when asked for), and the finish reason and stop text of the first."""
    first = output.outputs[0]
    extras: dict[str, Any] = {"finish_reason": first.finish_reason, "stop_reason": first.stop_reason}
    if len(output.outputs) > 1:
        extras["completions"] = [list(c.token_ids) for c in output.outputs]
    if first.logprobs is not None:
        extras["logprobs"] = [step[t].logprob for t, step in zip(first.token_ids, first.logprobs)]
        extras["top_logprobs"] = [sorted(step) for step in first.logprobs]
    if output.prompt_logprobs is not None:
        extras["prompt_logprobs"] = [None if step is None else {str(t): lp.logprob for t, lp in step.items()}
                                     for step in output.prompt_logprobs]
    return extras


def _pin(core: int) -> None:
    """Run this process, and every thread it starts from now on, on ``core`` alone.

    Why: vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` binds only its OpenMP threads; the
    process's other pools (started by the libraries the engine and the drafter import)
    still spread over every core, so two engines side by side fought over both and each
    ran 2-6x slower than alone (the sampling e2e module: a pair of engines 130 s bound
    that way, 73 s pinned). Called before vLLM, torch or any other library is imported,
    while the process has one thread, so every later thread inherits the mask."""
    os.sched_setaffinity(0, {core})


if __name__ == "__main__":
    if len(sys.argv) > 2:
        _pin(int(sys.argv[2]))
    res = run_job(json.loads(sys.argv[1]))
    print(RESULT_PREFIX + json.dumps(res), flush=True)
