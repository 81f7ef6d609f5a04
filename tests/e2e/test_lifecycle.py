"""Per-request draft state is created, dropped on finish, abort and preemption, never
leaked; preempted requests still give the target's own output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hetero_harness.evaluation import RESULT_PREFIX, default_env, run_isolated_many, unwrap
from hetero_harness.prompts import BRIDGE_STRESS


def test_aborted_and_finished_requests_leave_no_state(gemma: str, smollm2: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("lifecycle_job.py")), gemma, smollm2],
        capture_output=True, text=True, timeout=900, env=default_env(),
    )
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    assert line, proc.stderr[-4000:]
    res = json.loads(line[-1][len(RESULT_PREFIX):])
    assert res["peak"] >= 4, res  # state was really created for concurrent requests
    assert set(res["finished"]) == {"r2", "r3", "r4", "r5"}, res
    # Once the next request is scheduled, only its own state exists.
    assert res["during_next"] and max(res["during_next"]) == 1, res


def test_preemption_gives_the_target_alone_output(qwen05: str, smollm2: str) -> None:
    """A target KV cache of 3 blocks (128 tokens each) for 4 requests that each grow
    past one block, so vLLM preempts running requests (their draft state is dropped and
    rebuilt when they resume): T = 0 outputs stay exactly the target's own."""
    job = {
        "target": qwen05, "prompts": BRIDGE_STRESS[:4], "max_tokens": 140, "temperature": 0.0,
        "max_model_len": 256, "warmup": False, "ignore_eos": True, "num_kv_blocks": 3,
        "enforce_eager": True,  # start sooner; default flags: test_e2e_greedy, test_serving
    }
    plain, spec = map(unwrap, run_isolated_many([job, {**job, "speculative_config": {
        "method": "hetero", "model": smollm2, "num_speculative_tokens": 4, "algorithm": "tli",
        "draft_budget": "fixed"}}]))  # every step drafts: preempted requests have draft state to rebuild
    assert spec["num_preemptions"] > 0, "no preemption happened: the test proves nothing"
    assert spec["token_ids"] == plain["token_ids"]
    assert spec["num_accepted_tokens"] > 0 and spec["fallbacks"] == 0
