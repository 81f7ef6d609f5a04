"""`vllm serve --data-parallel-size 2` with a draft KV pool far smaller than the load
needs, under 32 concurrent requests.

For a dense model vLLM runs the data-parallel ranks as independent engine processes,
with one API server process per rank; each engine loads the plugin, builds its
proposer and reports its own ``hetero:*`` board. Each engine's draft pool holds about
ten 32-token blocks of SmolLM2's float32 KV, a few requests' worth: requests that find
it full run undrafted (counted). Greedy outputs must be the target alone's, the server
must have drafted (vLLM's own ``spec_decode`` counters, from both engines), no pool may
ever hold more than its configured bytes (sampled while the load runs), and
``/metrics`` must carry the plugin's series from both engines' workers (with several API
servers vLLM serves ``/metrics`` from prometheus' multiprocess collector, which the
plugin extends: ``multiprocess_metrics.patch_multiprocess_metrics``).

The server is started as a vLLM user types it, models named by their Hugging Face ids
(``vllm serve google/gemma-3-270m --speculative-config '{"method": "hetero", "model":
"HuggingFaceTB/SmolLM2-135M-Instruct", ...}'``), resolved offline from a Hub cache
holding set-up's models under those ids (``hub_home``).

The Gemma pair, eager, held to the session's target alone (``conftest.gemma_alone``).
What this gives up, and why the claims stand:
- vLLM's default flags (two compiles, one per rank: about a third of this module's time
  before). Compiling changes a step's cost, not the pool, the metrics or the ranks'
  plugin; two processes compiling into the plugin's shared inductor cache at once is
  what the README's offline run and its server do side by side
  (``test_readme_commands.py``).
- A chat request through the id-named server (Gemma-3-270M, a base model, has no chat
  template). The chat template is the target's own, read by vLLM from the folder it
  resolved; chat through the hetero server is checked against the plain server in
  ``test_serving.py`` and ``test_readme_commands.py``.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
from pathlib import Path

import httpx
from _gemma_pair import LONG_GREEDY, group_prompts, prompts
from _serving import launch

from hetero_harness.evaluation import unwrap
from hetero_harness.hf_cache import UPSTREAM_IDS, offline_env

POOL_MB = 16
#: (prompt index, tokens) of each request: every stress prompt, 16 to 32 tokens.
JOBS = [(i % 10, 16 + (i * 5) % 17) for i in range(32)]


def _token_ids(server, prompt: list[int], max_tokens: int) -> list[int]:
    body = {"model": server.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True}
    resp = httpx.post(f"{server.url}/v1/completions", json=body, timeout=600)
    assert resp.status_code == 200, resp.text[:500]
    return [int(t.removeprefix("token_id:")) for t in resp.json()["choices"][0]["logprobs"]["tokens"]]


def test_dp2_bounded_pool_server_identical_to_target_alone_and_drafts(gemma: str, gemma_alone, hub_home: Path,
                                                                      tmp_path: Path) -> None:
    # A draft-length floor of 1: every step drafts where the pool has room, so identity
    # is tested on drafted steps wherever the budget would judge drafting not worth it.
    spec = {"method": "hetero", "model": UPSTREAM_IDS["smollm2-135m"], "num_speculative_tokens": 4,
            "algorithm": "tli", "min_speculative_tokens": 1, "draft_kv_pool_mb": POOL_MB}
    want = unwrap(gemma_alone.results()[LONG_GREEDY.name])["token_ids"]  # before the server takes the cores
    dp = launch(UPSTREAM_IDS["gemma3-270m"], ["--data-parallel-size", "2", "--enforce-eager", "--max-model-len", "4096",
                                              "--speculative-config", json.dumps(spec)],
                tmp_path / "dp2.log", env=offline_env(hub_home), lease_cores=None)
    try:
        ids = group_prompts(LONG_GREEDY, prompts(gemma))
        dp.wait_ready()
        peak = 0.0
        with cf.ThreadPoolExecutor(max_workers=len(JOBS)) as pool:
            futures = [pool.submit(_token_ids, dp, ids[i], n) for i, n in JOBS]
            while not all(f.done() for f in futures):
                peak = max(peak, *dp.metric_by_label("hetero:draft_pool_bytes", "pid").values(), 0.0)
                time.sleep(0.2)
            got = [f.result() for f in futures]
        for (i, n), tokens in zip(JOBS, got):
            assert tokens == want[i][:n], f"prompt {i}, {n} tokens: {tokens} != {want[i][:n]}"
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
