"""`vllm serve --data-parallel-size 2` with a draft KV pool far smaller than the load
needs, under vLLM's default flags and 32 concurrent requests.

For a dense model vLLM runs the data-parallel ranks as independent engine processes,
with one API server process per rank; each engine loads the plugin, builds its
proposer and reports its own ``hetero:*`` board. Each engine's draft pool holds about
ten 32-token blocks of SmolLM2's float32 KV, a few requests' worth: requests that find
it full run undrafted (counted). Greedy outputs must equal the plain single-engine
server's, the server must have drafted (vLLM's own ``spec_decode`` counters, from both
engines), no pool may ever hold more than its configured bytes (sampled while the load
runs), and ``/metrics`` must carry the plugin's series from both engines' workers (with
several API servers vLLM serves ``/metrics`` from prometheus' multiprocess collector,
which the plugin extends: ``multiprocess_metrics.patch_multiprocess_metrics``).

The server is started as a vLLM user types it, models named by their Hugging Face ids
(``vllm serve Qwen/Qwen2.5-Coder-0.5B-Instruct --speculative-config '{"method":
"hetero", "model": "HuggingFaceTB/SmolLM2-135M-Instruct", ...}'``), resolved offline
from a Hub cache holding set-up's models under those ids (``hub_home``), and it must
answer a chat request as the plain server does.

The reference is the shared plain server (``conftest.py``), stopped before this server
starts: two engine workers of the 0.5B target in float32 take about 13 GB here, and
beside the plain server the DP server was killed for memory on a 24 GB machine. This
module runs after ``test_serving.py`` (pytest takes modules in name order), the
plain server's other user.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
from pathlib import Path

from _serving import chat, complete, launch, parallel

from hetero_harness.hf_cache import UPSTREAM_IDS, offline_env
from hetero_harness.prompts import BRIDGE_STRESS

POOL_MB = 16
CHAT = "Write a Python function that reverses a string."
JOBS = [(BRIDGE_STRESS[i % len(BRIDGE_STRESS)], 16 + (i * 5) % 17) for i in range(32)]


def test_dp2_bounded_pool_server_identical_to_plain_and_drafts(plain_server, hub_home: Path,
                                                               tmp_path: Path) -> None:
    want = parallel(lambda p, n: complete(plain_server.wait_ready(), p, n), JOBS)
    want_chat = chat(plain_server, CHAT, 24)
    plain_server.stop()
    # A draft-length floor of 1: every step drafts where the pool has room, so identity
    # is tested on drafted steps wherever the budget would judge drafting not worth it.
    spec = {"method": "hetero", "model": UPSTREAM_IDS["smollm2-135m"], "num_speculative_tokens": 4,
            "algorithm": "tli", "min_speculative_tokens": 1, "draft_kv_pool_mb": POOL_MB}
    dp = launch(UPSTREAM_IDS["qwen2.5-coder-0.5b"], ["--data-parallel-size", "2", "--speculative-config",
                                                     json.dumps(spec)], tmp_path / "dp2.log", env=offline_env(hub_home))
    try:
        dp.wait_ready()
        peak = 0.0
        with cf.ThreadPoolExecutor(max_workers=len(JOBS)) as pool:
            futures = [pool.submit(complete, dp, p, n) for p, n in JOBS]
            while not all(f.done() for f in futures):
                peak = max(peak, *dp.metric_by_label("hetero:draft_pool_bytes", "pid").values(), 0.0)
                time.sleep(0.2)
            got = [f.result() for f in futures]
        assert got == want
        assert chat(dp, CHAT, 24) == want_chat
        assert 0 < peak <= POOL_MB << 20, peak
        assert dp.metric_sum("hetero:pool_full_requests_total") > 0, "the pool never filled: test too weak"
        drafted = dp.metric_by_label("vllm:spec_decode_num_draft_tokens_total", "engine")
        assert len(drafted) == 2 and all(v > 0 for v in drafted.values()), f"not drafted by both engines: {drafted}"
        assert dp.metric_sum("vllm:spec_decode_num_accepted_tokens_total") > 0
        assert dp.metric_sum("hetero:fallbacks_total") == 0
        steps = dp.metric_by_label("hetero:steps_total", "pid")
        assert len(steps) == 2 and all(v > 0 for v in steps.values()), f"hetero:* not from both workers: {steps}"
        settled = dp.wait_for_metrics({"hetero:draft_pool_bytes": 0}, 60)
        assert settled == {"hetero:draft_pool_bytes": 0}, settled
    finally:
        dp.stop()
