"""`vllm serve --data-parallel-size 2`: two engines behind one server, each with its own
drafter, under vLLM's default flags.

For a dense model vLLM runs the data-parallel ranks as independent engine processes,
with one API server process per rank; each engine loads the plugin, builds its
proposer and reports its own ``hetero:*`` board. Greedy outputs must equal a plain
single-engine server's, the server must have drafted (vLLM's own ``spec_decode``
counters), and ``/metrics`` must carry the plugin's series from both engines' workers
(with several API servers vLLM serves ``/metrics`` from prometheus' multiprocess
collector, which the plugin extends: ``vllm_patches._patch_multiprocess_metrics``).

Memory: two engine workers of the 0.5B target in float32 take about 13 GB here, so
the plain reference server runs first and is stopped before the DP server starts (beside
the shared plain server the DP server was killed for memory on a 24 GB machine).
"""

from __future__ import annotations

import json
from pathlib import Path

from _serving import complete, launch, parallel

from vllm_hetero_spec.harness.prompts import BRIDGE_STRESS

JOBS = [(BRIDGE_STRESS[i % len(BRIDGE_STRESS)], 24) for i in range(12)]


def test_dp2_server_identical_to_plain_and_drafts(qwen05: str, smollm2: str, tmp_path: Path) -> None:
    plain = launch(qwen05, [], tmp_path / "plain.log")
    try:
        want = parallel(lambda p, n: complete(plain.wait_ready(), p, n), JOBS)
    finally:
        plain.stop()
    # A draft-length floor of 1: every step drafts, so identity is tested on drafted
    # steps wherever the budget would judge drafting not worth it (test_serving.py).
    spec = {"method": "hetero", "model": smollm2, "num_speculative_tokens": 4, "algorithm": "tli",
            "min_speculative_tokens": 1}
    dp = launch(qwen05, ["--data-parallel-size", "2", "--speculative-config", json.dumps(spec)],
                tmp_path / "dp2.log")
    try:
        dp.wait_ready()
        got = parallel(lambda p, n: complete(dp, p, n), JOBS)
        assert got == want
        drafted = dp.metric_by_label("vllm:spec_decode_num_draft_tokens_total", "engine")
        assert sum(drafted.values()) > 0, f"no drafts: {drafted}"
        steps = dp.metric_by_label("hetero:steps_total", "pid")
        assert len(steps) == 2 and all(v > 0 for v in steps.values()), f"hetero:* not from both workers: {steps}"
    finally:
        dp.stop()
