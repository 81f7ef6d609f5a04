"""Per-request draft state is created, dropped on finish and on abort, never leaked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_hetero_spec.evaluation import RESULT_PREFIX, default_env

pytestmark = pytest.mark.e2e


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
