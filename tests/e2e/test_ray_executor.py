"""The Ray executor end to end: a real engine, a real Ray cluster and actor, real models.

One child process (``ray_job.py``) runs the Gemma pair with union drafting in a Ray
actor: four greedy batches through one engine, clean, with the actor SIGKILLed after
the third step, with the actor SIGSTOPped (hung) after the third step, and after its
replacement is up; then a sampled batch; then it shuts the engine down. Every greedy
batch must give exactly the target's own output, the faults must be noticed and the
actor replaced, drafting must resume, and no process the engine started may survive
its shutdown.

The sampled batch carries what the rules' module checked for union in a Ray actor in an
engine of its own (pipelined drafts come from forked random streams, and union's forced
rejections travel back from the actor): at T = 1 with vLLM's filters, the tokens at the
drafted positions follow the target alone's law (the two-sample test of
``test_e2e_rules.py``, same rows and reference), and seeded requests come out the same
in the batch and alone. What it gives up: the seeded requests are no longer compared
with the in-process engines' (``test_e2e_rules.py`` compares those among themselves);
and the union rows now share their engine with the faults (after the actor's
replacements), which is a harder setting, not an easier one.

The reference is the session's target alone (``conftest.gemma_alone``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _gemma_pair import SAMPLED, SEEDED
from hetero_harness.cores import lease, pinned
from hetero_harness.evaluation import RESULT_PREFIX, default_env, unwrap

from _stats import two_sample_pvalue


JOB = Path(__file__).with_name("ray_job.py")


@pytest.fixture(scope="module")
def runs(gemma: str, smollm2: str, gemma_alone, count_rows, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The Ray job, and the target alone's rows."""
    logs = tmp_path_factory.mktemp("ray_job")
    count_rows(SAMPLED.count)
    # One core for the engine, the actor and Ray's own processes: the engine waits for
    # the actor's drafts and the actor for the engine's steps, so a second core sat
    # mostly idle (docs/testing.md, "Where the time goes"); another module's engine
    # runs on it instead.
    with lease(1) as held, open(logs / "out", "w+") as out, open(logs / "err", "w+") as err:
        proc = subprocess.Popen([sys.executable, str(JOB), gemma, smollm2, "union"], stdout=out, stderr=err,
                                env=default_env(), preexec_fn=pinned(held.cores))
        try:
            proc.wait(timeout=1500)
        finally:
            proc.kill()
        out.seek(0)
        err.seek(0)
        lines = [ln for ln in out.read().splitlines() if ln.startswith(RESULT_PREFIX)]
        assert lines, f"ray job failed (exit {proc.returncode}):\n{err.read()[-6000:]}"
    alone = gemma_alone.results()
    return {"plain": unwrap(alone["greedy"])["token_ids"], "plain_sampled": unwrap(alone["sampled"])["token_ids"],
            **json.loads(lines[-1][len(RESULT_PREFIX):])}


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


def test_sampled_rows_follow_the_target_alone_law(runs: dict) -> None:
    """Union drafting in the actor at T = 1 with top-k and top-p: the tokens at the drafted
    positions (1 and 2) against the target alone's (p > 1e-3, as in test_e2e_rules.py)."""
    sampled = runs["sampled"]
    assert sampled["proposed"] > 0 and sampled["stats"]["ray_timeouts"] == runs["after"]["stats"]["ray_timeouts"], sampled
    got, want = sampled["token_ids"], runs["plain_sampled"]
    assert len(got) == SAMPLED.count and all(len(t) == SAMPLED.max_tokens for t in got)
    for pos in (1, 2):
        p = two_sample_pvalue([o[pos] for o in want], [o[pos] for o in got])
        assert p > 1e-3, f"position {pos} distribution differs from the target's (p={p:.1e})"


def test_seeded_requests_repeat_alone(runs: dict) -> None:
    """Seeded requests drafted through the actor: the same tokens among a hundred other
    rows and alone, and different seeds give different tokens."""
    sampled = runs["sampled"]
    assert all(len(t) == SEEDED.max_tokens for t in sampled["seeded"])
    assert sampled["seeded"] == sampled["seeded_alone"]
    assert len({tuple(t) for t in sampled["seeded"]}) == SEEDED.count
