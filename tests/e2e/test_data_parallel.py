"""`vllm serve --data-parallel-size 2`: two engines behind one server, each with its own
drafter, under vLLM's default flags.

For a dense model vLLM runs the data-parallel ranks as independent engine processes,
with one API server process per rank; each engine loads the plugin, builds its
proposer and reports its own ``hetero:*`` board. Greedy outputs must equal a plain
single-engine server's, both engines must have drafted (their boards carry distinct
``pid`` labels, read through whichever API server answers), and no step may fall back.

Memory: two engine workers of the 0.5B target in float32 take about 13 GB here, so
the plain reference server runs first and is stopped before the DP server starts (beside
the shared plain server the DP server was killed for memory on a 24 GB machine).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from _serving import complete, launch, parallel

from vllm_hetero_spec.harness.prompts import BRIDGE_STRESS

JOBS = [(BRIDGE_STRESS[i % len(BRIDGE_STRESS)], 24) for i in range(12)]


def _per_pid(metrics: dict[str, float], name: str) -> dict[str, float]:
    """``name``'s samples keyed by their ``pid`` label."""
    out = {}
    for key, value in metrics.items():
        if key.split("{", 1)[0] == name:
            pid = re.search(r'pid="(\d+)"', key)
            out[pid.group(1) if pid else ""] = value
    return out


def test_dp2_server_identical_and_both_engines_draft(qwen05: str, smollm2: str, tmp_path: Path) -> None:
    plain = launch(qwen05, [], tmp_path / "plain.log")
    try:
        want = parallel(lambda p, n: complete(plain.wait_ready(), p, n), JOBS)
    finally:
        plain.stop()
    spec = {"method": "hetero", "model": smollm2, "num_speculative_tokens": 4, "algorithm": "tli"}
    dp = launch(qwen05, ["--data-parallel-size", "2", "--speculative-config", json.dumps(spec)],
                tmp_path / "dp2.log")
    try:
        dp.wait_ready()
        got = parallel(lambda p, n: complete(dp, p, n), JOBS)
        assert got == want
        metrics = dp.metrics()
        steps = _per_pid(metrics, "hetero:steps_total")
        proposed = _per_pid(metrics, "hetero:proposed_tokens_total")
        assert len(steps) == 2, f"expected one hetero board per engine, got {steps}"
        assert all(v > 0 for v in proposed.values()) and len(proposed) == 2, proposed
        assert sum(v for k, v in metrics.items() if k.startswith("hetero:fallbacks_total")) == 0
    finally:
        dp.stop()
