"""A draft KV pool far smaller than the load needs, under a real `vllm serve`.

The bounded server starts while the shared plain server (``conftest.py``) answers the
32 concurrent requests; then the bounded server is loaded with the same requests, alone.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
from pathlib import Path

from _serving import complete, launch, parallel

from vllm_hetero_spec.harness.prompts import BRIDGE_STRESS


POOL_MB = 16  # about ten 32-token blocks of SmolLM2's float32 KV: a few requests' worth
JOBS = [(BRIDGE_STRESS[i % len(BRIDGE_STRESS)], 16 + (i * 5) % 17) for i in range(32)]


def test_bounded_draft_pool_under_32_concurrent_requests(plain_server, qwen05: str, smollm2: str,
                                                        tmp_path: Path) -> None:
    """Sampled while the load runs, the pool never holds more than its configured bytes;
    requests that find it full run undrafted (counted), every output is still the plain
    server's, nothing fails, and the pool is empty once the load is done."""
    spec = {"method": "hetero", "model": smollm2, "num_speculative_tokens": 4, "algorithm": "tli",
            "draft_kv_pool_mb": POOL_MB}
    bounded = launch(qwen05, ["--speculative-config", json.dumps(spec)], tmp_path / "bounded.log")
    try:
        plain = plain_server.wait_ready()
        want = parallel(lambda p, n: complete(plain, p, n), JOBS)
        bounded.wait_ready()
        peak = 0.0
        with cf.ThreadPoolExecutor(max_workers=len(JOBS)) as pool:
            futures = [pool.submit(complete, bounded, p, n) for p, n in JOBS]
            while not all(f.done() for f in futures):
                peak = max(peak, bounded.metric_sum("hetero:draft_pool_bytes"))
                time.sleep(0.2)
            got = [f.result() for f in futures]
        assert got == want
        assert 0 < peak <= POOL_MB << 20
        assert bounded.metric_sum("hetero:pool_full_requests_total") > 0, "the pool never filled: test too weak"
        assert bounded.metric_sum("vllm:spec_decode_num_accepted_tokens_total") > 0
        assert bounded.metric_sum("hetero:fallbacks_total") == 0
        assert bounded.wait_for_metrics({"hetero:draft_pool_bytes": 0}, 60) == {"hetero:draft_pool_bytes": 0}
    finally:
        bounded.stop()
