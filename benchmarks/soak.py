"""Soak: a `vllm serve` with the shipped config under load, aborts and bad requests.

Two rounds of the same 200 requests at concurrency 16 go to a server started with
``configs/hetero.json`` (``algorithm: auto``) and vLLM's default flags:

- 80% ordinary greedy completions (40 distinct prompt/length pairs, each sent 4 times);
- 10% streamed and abandoned after a few chunks (the client closes the connection, so
  vLLM aborts the request mid-generation, with its draft state live);
- 10% bad: an invalid ``vllm_xargs.fsd_threshold``, a negative ``max_tokens``, a
  negative temperature, ``top_p`` above 1, a prompt longer than the model's context.

A plain server of the same target answers the 40 distinct prompts once, as the
reference. Afterwards it checks, and exits non-zero if any fails:

- the server is healthy and every ordinary request got exactly the plain server's text;
- every bad request got HTTP 400 and every abandoned one was cut short;
- ``hetero:request_states`` and ``hetero:draft_pool_bytes`` are back to 0, and
  ``hetero:fallbacks_total`` is 0;
- the server's resident memory (all its processes) after round 2 is within
  ``--rss-tolerance`` of round 1's (no leak per request).

    .venv/bin/python benchmarks/soak.py            # Qwen2.5-Coder-0.5B target, about 15 min

    .venv/bin/python benchmarks/soak.py --min-speculative-tokens 1   # every step drafts

Not part of the test suite (its length); results go to benchmarks/results/soak.json
(``soak_min<N>.json`` with a floor), the checks also to its ``.md``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import openai
import psutil
from report import table, write_report

from hetero_harness.models import ensure_model
from hetero_harness.prompts import BRIDGE_STRESS, spec_bench_questions
from hetero_harness.server_process import ServerProcess, stream_and_abandon

ROOT = Path(__file__).resolve().parents[1]
MAX_MODEL_LEN = 1024
COMMON = ["--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--generation-config", "vllm"]
BAD = [
    ("fsd_threshold < 0", {"extra_body": {"vllm_xargs": {"fsd_threshold": -1}}}),
    ("max_tokens < 0", {"max_tokens": -5}),
    ("temperature < 0", {"temperature": -1.0}),
    ("top_p > 1", {"top_p": 2.0}),
    ("prompt > context", {"prompt": "hello " * (2 * MAX_MODEL_LEN)}),
]


def plan(n: int, seed: int) -> list[dict]:
    """``n`` requests: 80% ordinary, 10% abandoned, 10% bad, shuffled."""
    prompts = BRIDGE_STRESS + spec_bench_questions(40)[: 40 - len(BRIDGE_STRESS)]
    distinct = [(p, 16 + (7 * i) % 33) for i, p in enumerate(prompts)]
    jobs: list[dict] = []
    for i in range(n):
        if i % 10 == 0:
            name, override = BAD[(i // 10) % len(BAD)]
            jobs.append({"kind": "bad", "what": name, "prompt": distinct[i % 40][0], "max_tokens": 16, **override})
        elif i % 10 == 5:
            jobs.append({"kind": "abort", "prompt": distinct[i % 40][0], "max_tokens": 64})
        else:
            prompt, max_tokens = distinct[i % 40]
            jobs.append({"kind": "ok", "prompt": prompt, "max_tokens": max_tokens})
    random.Random(seed).shuffle(jobs)
    return jobs


def send(server: ServerProcess, job: dict) -> dict:
    """One request; what came back."""
    api = server.openai_client()
    kwargs = {"model": server.model, "prompt": job["prompt"], "max_tokens": job["max_tokens"], "temperature": 0.0}
    kwargs.update({k: job[k] for k in ("temperature", "top_p", "extra_body") if k in job})
    if job["kind"] == "abort":
        return {"chunks": stream_and_abandon(api, 3, **kwargs)}
    try:
        text = api.completions.create(**kwargs).choices[0].text
        return {"status": 200, "text": text}
    except openai.APIStatusError as err:
        return {"status": err.status_code, "error": str(err)[:200]}


def rss_mb(server: ServerProcess) -> float:
    """Resident memory of the server's processes (API server, engine core, workers)."""
    root = psutil.Process(server.proc.pid)
    procs = [root, *root.children(recursive=True)]
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--config", default=str(ROOT / "configs" / "hetero.json"))
    ap.add_argument("--min-speculative-tokens", type=int, default=None,
                    help="add this draft-length floor to the config (1: every step drafts, so the load runs "
                    "with live draft state even where the budget would stop drafting)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rss-tolerance", type=float, default=0.03, help="largest RSS growth between rounds")
    args = ap.parse_args()

    target = str(ensure_model(args.target))
    jobs = plan(args.requests, seed=0)
    logs = Path(tempfile.mkdtemp(prefix="soak-"))
    if args.min_speculative_tokens is not None:
        floored = {**json.loads(Path(args.config).read_text()), "min_speculative_tokens": args.min_speculative_tokens}
        args.config = str(logs / "config.json")
        Path(args.config).write_text(json.dumps(floored))
    ours = ServerProcess(target, COMMON + ["--speculative-config", args.config], logs / "ours.log").launch()
    plain = ServerProcess(target, COMMON, logs / "plain.log").launch()
    checks: dict[str, bool] = {}
    result: dict = {"args": vars(args), "logs": str(logs), "rounds": []}
    try:
        plain.wait_ready()
        distinct = sorted({(j["prompt"], j["max_tokens"]) for j in jobs if j["kind"] == "ok"})
        with cf.ThreadPoolExecutor(args.concurrency) as pool:
            want = dict(zip(distinct, pool.map(lambda pm: send(plain, {"kind": "ok", "prompt": pm[0],
                                                                        "max_tokens": pm[1]})["text"], distinct)))
        plain.stop()
        ours.wait_ready()
        accepted_before = 0.0
        for r in range(args.rounds):
            t0 = time.monotonic()
            with cf.ThreadPoolExecutor(args.concurrency) as pool:
                got = list(pool.map(lambda j: send(ours, j), jobs))
            wall = time.monotonic() - t0
            gauges = ours.wait_for_metrics({"hetero:request_states": 0, "hetero:draft_pool_bytes": 0})
            ok = [(j, g) for j, g in zip(jobs, got) if j["kind"] == "ok"]
            bad = [(j, g) for j, g in zip(jobs, got) if j["kind"] == "bad"]
            aborted = [g for j, g in zip(jobs, got) if j["kind"] == "abort"]
            round_ = {
                "round": r + 1, "wall_s": wall,
                "ok": len(ok), "ok_identical": sum(g.get("text") == want[(j["prompt"], j["max_tokens"])] for j, g in ok),
                "bad": len(bad), "bad_400": sum(g.get("status") == 400 for _, g in bad),
                "bad_statuses": sorted({f"{j['what']}: {g.get('status')}" for j, g in bad}),
                "aborted": len(aborted), "aborted_cut_short": sum(0 < g["chunks"] <= 3 for g in aborted),
                "healthy": ours.alive() and ours.healthy(timeout=10), "gauges_after": gauges,
                "fallbacks": ours.metric_sum("hetero:fallbacks_total"),
                "accepted_tokens": ours.metric_sum("vllm:spec_decode_num_accepted_tokens_total") - accepted_before,
                "rss_mb": rss_mb(ours),
            }
            accepted_before += round_["accepted_tokens"]
            result["rounds"].append(round_)
            print(json.dumps(round_), flush=True)
    finally:
        ours.stop()
        plain.stop()
    rounds = result["rounds"]
    checks["healthy after every round"] = all(x["healthy"] for x in rounds)
    checks["every ordinary request identical to plain"] = all(x["ok_identical"] == x["ok"] for x in rounds)
    checks["every bad request got 400"] = all(x["bad_400"] == x["bad"] for x in rounds)
    checks["every abandoned request cut short"] = all(x["aborted_cut_short"] == x["aborted"] for x in rounds)
    checks["draft state and pool back to 0"] = all(not any(x["gauges_after"].values()) for x in rounds)
    checks["no drafting fallbacks"] = all(x["fallbacks"] == 0 for x in rounds)
    checks["drafts accepted in every round"] = all(x["accepted_tokens"] > 0 for x in rounds)
    if len(rounds) > 1:
        growth = rounds[-1]["rss_mb"] / rounds[0]["rss_mb"] - 1
        result["rss_growth"] = growth
        checks[f"RSS flat across rounds (growth {growth:+.1%})"] = growth <= args.rss_tolerance
    result["checks"] = checks
    name = "soak" if args.min_speculative_tokens is None else f"soak_min{args.min_speculative_tokens}"
    write_report(name, result, to_markdown(result))
    for name, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'}  {name}")
    return 0 if all(checks.values()) else 1


def to_markdown(result: dict) -> list[str]:
    """The run's set-up in a sentence and its checks as a table."""
    a = result["args"]
    floor = a.get("min_speculative_tokens")
    caption = (f"`benchmarks/soak.py`: {a['rounds']} rounds of {a['requests']} requests at concurrency "
               f"{a['concurrency']} to `vllm serve` {a['target']} with the shipped config"
               + (f" and min_speculative_tokens {floor}" if floor is not None else "")
               + "; 80% ordinary greedy completions (each checked against a plain server's text), 10% abandoned "
               "mid-stream, 10% bad requests. Per round: "
               + "; ".join(f"{r['wall_s']:.0f} s, {r['accepted_tokens']:.0f} draft tokens accepted, RSS "
                           f"{r['rss_mb']:.0f} MB" for r in result["rounds"]) + ".")
    return [caption, "", *table(["check", "result"], ([check, "pass" if passed else "FAIL"]
                                                       for check, passed in result["checks"].items()))]


if __name__ == "__main__":
    sys.exit(main())
