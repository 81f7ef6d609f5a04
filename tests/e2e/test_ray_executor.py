"""The Ray executor end to end: a real engine, a real Ray cluster and actor, real models.

One child process (``ray_job.py``) runs four greedy batches through one engine: clean,
with the actor SIGKILLed after the third step, with the actor SIGSTOPped (hung) after
the third step, and after its replacement is up; then it shuts the engine down. Every
batch must give exactly the target's own output, the faults must be noticed and the
actor replaced, drafting must resume, and no process the engine started may survive
its shutdown.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetero_harness.evaluation import RESULT_PREFIX, default_env, run_isolated
from hetero_harness.prompts import BRIDGE_STRESS


JOB = Path(__file__).with_name("ray_job.py")


@pytest.fixture(scope="module")
def runs(qwen05: str, smollm2: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The Ray job, and the target alone beside its start-up (pinned to one core; the
    Ray job's start-up is mostly single-threaded: Ray's cluster, imports, loading)."""
    logs = tmp_path_factory.mktemp("ray_job")
    with open(logs / "out", "w+") as out, open(logs / "err", "w+") as err:
        proc = subprocess.Popen([sys.executable, str(JOB), qwen05, smollm2, "tli"], stdout=out, stderr=err,
                                env=default_env())
        try:
            plain = run_isolated({
                "target": qwen05, "prompts": BRIDGE_STRESS, "max_tokens": 24, "temperature": 0.0,
                "max_model_len": 1024, "speculative_config": None, "warmup": False,
                "enforce_eager": True,  # as the Ray job (ray_job.py)
            }, core=max(os.sched_getaffinity(0)))
            proc.wait(timeout=1200)
        finally:
            proc.kill()
        out.seek(0)
        err.seek(0)
        lines = [ln for ln in out.read().splitlines() if ln.startswith(RESULT_PREFIX)]
        assert lines, f"ray job failed (exit {proc.returncode}):\n{err.read()[-6000:]}"
    return {"plain": plain["token_ids"], **json.loads(lines[-1][len(RESULT_PREFIX):])}


def test_clean_batch_is_identical_and_pipelined(runs: dict) -> None:
    clean = runs["clean"]
    assert clean["token_ids"] == runs["plain"]
    stats = clean["stats"]
    assert clean["proposed"] > 0 and stats["ray_restarts"] == 0
    assert stats["pipeline_branches"] > 0 and stats["pipeline_hits"] > 0  # drafts were ready before asked for


@pytest.mark.parametrize("phase", ["killed", "frozen"])
def test_actor_fault_mid_batch_loses_nothing(runs: dict, phase: str) -> None:
    run, before = runs[phase], runs["clean" if phase == "killed" else "killed"]
    assert run["token_ids"] == runs["plain"]
    assert run["proposed_at_fault"] > before["proposed"]  # it was drafting when the fault hit
    recovered = run["recovered"]
    assert recovered["restarts"] == before["recovered"]["restarts"] + 1 if phase == "frozen" else recovered["restarts"] == 1
    assert not recovered["victim_alive"], "the faulty actor was left running"
    assert recovered["actor_pid"] != run["victim"]
    if phase == "frozen":
        assert run["stats"]["ray_timeouts"] > before["stats"]["ray_timeouts"]


def test_drafting_resumes_after_restarts(runs: dict) -> None:
    after, frozen = runs["after"], runs["frozen"]
    assert after["token_ids"] == runs["plain"]
    assert after["actor_pid"] not in (runs["killed"]["victim"], frozen["victim"])
    assert after["proposed"] > frozen["proposed"]


def test_shutdown_leaves_no_process(runs: dict) -> None:
    assert any("ray" in p or "gcs_server" in p for p in runs["processes_before_shutdown"])
    assert runs["left_after_shutdown"] == []
