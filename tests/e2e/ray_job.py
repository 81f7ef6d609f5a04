"""Run in a child process by test_ray_executor.py: one engine of the Gemma pair with
union drafting in a Ray actor, put through a clean batch, an actor killed mid-batch, an
actor frozen mid-batch, a batch after the replacements, a sampled batch (the
distribution rows and the seeded requests, then the seeded ones alone), and shut down.
Prints one JSON line with what it observed."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time

import psutil

# An extra configuration, in process: this job steps the engine and reads the drafter's own
# objects between steps (_find_drafter), so the engine core runs in this process, not in
# vLLM's default process of its own (what every run_job engine and server uses).
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

from _gemma_pair import GREEDY, SAMPLED, SEEDED, engine_rows, group_prompts, prompts
from hetero_harness.evaluation import RESULT_PREFIX, _find_drafter


def _batch(llm: LLM, ids: list[list[int]], tag: str, fault: int | None = None, pace_s: float = 0.0) -> dict:
    """Generate the greedy rows; after the third step send ``fault`` to the actor.
    ``pace_s`` between steps stands in for a target slower than the drafter (the regime
    pipelining is for; here the target is quicker than the actor's one core)."""
    engine = llm.llm_engine
    drafter = _find_drafter(llm)
    params = SamplingParams(max_tokens=GREEDY.max_tokens, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(ids):
        engine.add_request(f"{tag}{i}", TokensPrompt(prompt_token_ids=prompt), params)
    outputs: dict[str, list[int]] = {}
    steps, victim, proposed_at_fault = 0, None, None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
        steps += 1
        time.sleep(pace_s)
        if fault is not None and steps == 3:
            victim = drafter.host.actor_pid
            os.kill(victim, fault)
            proposed_at_fault = drafter.stats.proposed
    stats = drafter.stats
    result = {
        "token_ids": [outputs[f"{tag}{i}"] for i in range(len(ids))],
        "stats": stats.as_metrics(),
        "proposed": stats.proposed,
        "proposed_at_fault": proposed_at_fault,
        "victim": victim,
        "actor_pid": drafter.host.actor_pid,
    }
    if fault is not None:
        # The replacement may still be loading when the batch ends; wait for it.
        deadline = time.monotonic() + 180
        while not drafter.host.poll() and time.monotonic() < deadline:
            time.sleep(0.5)
        result["recovered"] = {
            "restarts": drafter.stats.ray_restarts,
            "victim_alive": _alive_pid(victim),
            "actor_pid": drafter.host.actor_pid,
        }
    return result


def _sampled(llm: LLM, ids: dict[str, list]) -> dict:
    """The distribution rows and the seeded requests in one batch, then the seeded ones
    alone. The actor's deadline is raised first: on a loaded 2-core machine its first
    step of this batch (a hundred rows' catch-up) outlasted the faults' 3 s, and steps
    that time out run undrafted, leaving nothing to compare (CI, stop 29)."""
    drafter = _find_drafter(llm)
    drafter.host.settings = dataclasses.replace(drafter.host.settings, ray_timeout_s=300.0)
    proposed = drafter.stats.proposed
    rows, params = engine_rows((SAMPLED, SEEDED), ids)
    out = llm.generate([TokensPrompt(prompt_token_ids=p) for p in rows], params, use_tqdm=False)
    alone = [llm.generate([TokensPrompt(prompt_token_ids=p)], [sp], use_tqdm=False)[0]
             for p, sp in zip(rows[SAMPLED.count:], params[SAMPLED.count:])]
    tokens = [list(o.outputs[0].token_ids) for o in out]
    return {"token_ids": tokens[:SAMPLED.count], "seeded": tokens[SAMPLED.count:],
            "seeded_alone": [list(o.outputs[0].token_ids) for o in alone],
            "proposed": drafter.stats.proposed - proposed, "stats": drafter.stats.as_metrics()}


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _alive_pid(pid: int) -> bool:
    try:
        return _alive(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False


def _describe(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline()[:2])[:120]
    except psutil.Error:
        return str(proc.pid)


def main(target: str, draft: str, algorithm: str) -> None:
    ids = prompts(target)
    llm = LLM(
        model=target,
        dtype="float32",
        max_model_len=256,
        max_num_seqs=128,
        enforce_eager=True,
        speculative_config={
            "method": "hetero", "model": draft, "num_speculative_tokens": 4, "algorithm": algorithm,
            "executor": "ray", "ray_timeout_s": 3.0, "max_branches": 3,
            # Faults are injected at a step that must be drafting: the adaptive budget may
            # choose k = 0 on this CPU (the 0.5B target is quick), and a fault then goes
            # unnoticed until the next drafting step, after the batch has ended.
            "draft_budget": "fixed",
        },
    )
    greedy = group_prompts(GREEDY, ids)
    result = {"clean": _batch(llm, greedy, "c", pace_s=1.0), "killed": _batch(llm, greedy, "k", signal.SIGKILL)}
    result["frozen"] = _batch(llm, greedy, "f", signal.SIGSTOP)
    result["after"] = _batch(llm, greedy, "a")
    result["sampled"] = _sampled(llm, ids)
    ours = [p for p in psutil.Process().children(recursive=True) if _alive(p)]
    result["processes_before_shutdown"] = [_describe(p) for p in ours]
    llm.llm_engine.engine_core.shutdown()
    time.sleep(1.0)
    result["left_after_shutdown"] = [_describe(p) for p in ours if _alive(p)]
    print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
