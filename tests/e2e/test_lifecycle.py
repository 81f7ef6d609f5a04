"""Per-request draft state is created, dropped on finish, abort and preemption, never
leaked; preempted requests still give the target's own output.

One hetero engine (``lifecycle_job.py``, in process, a target KV cache of 4 blocks of 128
tokens) runs both halves: aborts and finished requests, then four requests that each grow
past one block, so vLLM preempts running requests. Beside it, the target alone with the
same KV cache gives the reference. What merging the halves gave up: the lifecycle half
ran 6 concurrent requests on a roomier cache (3 run at once now, so the peak it checks is
3 states, not 4); an abort or a finish that leaks state is caught all the same.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hetero_harness.evaluation import RESULT_PREFIX, default_env, run_isolated
from hetero_harness.prompts import BRIDGE_STRESS

#: The preemption half: 4 requests of 140 tokens (2 blocks each) in 4 blocks of 128 tokens.
PREEMPT = {"prompts": BRIDGE_STRESS[:4], "max_tokens": 140, "num_kv_blocks": 4, "max_model_len": 256}


def _lifecycle(qwen05: str, smollm2: str) -> dict:
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("lifecycle_job.py")), qwen05, smollm2,
                           json.dumps(PREEMPT)],
                          capture_output=True, text=True, timeout=1200, env=default_env())
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    assert line, proc.stderr[-4000:]
    return json.loads(line[-1][len(RESULT_PREFIX):])


@pytest.fixture(scope="module")
def runs(qwen05: str, smollm2: str) -> tuple[dict, dict]:
    """The lifecycle job and the target alone (same KV cache), side by side."""
    plain_job = {"target": qwen05, "temperature": 0.0, "warmup": False, "ignore_eos": True, "enforce_eager": True,
                 **PREEMPT}
    with ThreadPoolExecutor(2) as pool:
        spec = pool.submit(_lifecycle, qwen05, smollm2)
        plain = pool.submit(run_isolated, plain_job)
        return spec.result(), plain.result()


def test_aborted_and_finished_requests_leave_no_state(runs: tuple[dict, dict]) -> None:
    res, _ = runs
    assert res["peak"] >= 3, res  # state was really created for concurrent requests
    assert set(res["finished"]) == {"r2", "r3", "r4", "r5"}, res
    # Once the next request is scheduled, only its own state exists.
    assert res["during_next"] and max(res["during_next"]) == 1, res


def test_preemption_gives_the_target_alone_output(runs: tuple[dict, dict]) -> None:
    """Preempted requests (their draft state dropped and rebuilt when they resume): T = 0
    outputs stay exactly the target's own."""
    spec, plain = runs
    assert spec["num_preemptions"] > 0, "no preemption happened: the test proves nothing"
    assert spec["token_ids"] == plain["token_ids"]
    assert spec["num_accepted_tokens"] > 0 and spec["fallbacks"] == 0
