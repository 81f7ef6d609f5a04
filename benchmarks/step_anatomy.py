"""The anatomy of one speculative step, and the physical limit of a fixed k.

For each batch size, one plain run and one run per k (our ``tli``, SmolLM2-135M drafting
for Qwen2.5-Coder-1.5B by default), each in a fresh process with the engine in process.
Timers wrap the model runner's own methods (wall time; this benchmark runs on CPU, where
a method's wall time is its cost -- on CUDA the timers would need a sync): the target
forward (``_model_forward``), the sampler (``_sample``: the rejection sampler with
speculation), our proposer (``propose_draft_token_ids``; the drafter's counters split it
into draft forwards, bridge, and host work), and the rest of the step. Per-call medians,
so the few prefill steps do not count. vLLM's per-position acceptance counters give the
acceptance at each draft position.

In units of a plain step (its median wall time):

- ``v``: a speculative step without its drafting (the target at k + 1 positions per
  request, the rejection sampler, bookkeeping);
- ``c``: one draft forward for the batch;
- ``E(k) = 1 + r_1 + ... + r_k``, with ``r_i`` the share of drafts whose position i was
  accepted (vLLM's counters are cumulative: position i counts only if 1..i-1 did);
- the physical limit of fixed k: ``E(k) / (v + k c)``; the efficiency: the measured
  speedup over that limit (what the bridge and the proposer's host work cost).

    .venv/bin/python benchmarks/step_anatomy.py           # -> results/step_anatomy.{json,md,png}
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from report import figure, fmt, meta as run_meta, results_dir, table, write_report

#: Timed beside ``run_job``'s own (``RUNNER_TIMED``: execute_model, sample_tokens, propose_draft_token_ids).
EXTRA_TIMED = ("_model_forward", "_sample")
PREFIX = "ANATOMY "


def child(job: dict) -> None:
    """Run ``job`` with the runner's methods timed; print the result and the per-call times."""
    from hetero_harness.evaluation import run_job

    result = run_job({**job, "time_calls": list(EXTRA_TIMED)})
    calls = result.pop("runner_calls")
    result.pop("texts", None)
    result.pop("token_ids", None)
    print(PREFIX + json.dumps({"result": result, "calls": calls}), flush=True)


def run(job: dict) -> dict:
    """``child(job)`` in a fresh process (default environment of the test harness)."""
    from hetero_harness.evaluation import default_env

    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)], capture_output=True, text=True,
                          env=default_env(), timeout=3600)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(PREFIX):
            return json.loads(line[len(PREFIX):])
    raise RuntimeError(f"run failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def anatomy(plain: dict, spec: dict, k: int) -> dict:
    """One row: the step's parts in ms and in plain steps, E(k), the limit, efficiency."""
    pc, sc = plain["calls"], spec["calls"]
    plain_step = _median(pc["execute_model"]) + _median(pc["sample_tokens"])
    step = _median(sc["execute_model"]) + _median(sc["sample_tokens"])
    propose = _median(sc["propose_draft_token_ids"])
    raw = spec["result"].get("drafter_raw") or {}
    steps = max(raw.get("steps", 0), 1)
    forwards_per_step = raw.get("draft_forwards", 0) / steps
    draft_ms = 1e3 * raw.get("draft_s", 0.0) / steps
    bridge_ms = 1e3 * raw.get("bridge_s", 0.0) / steps
    forward_ms = draft_ms / forwards_per_step if forwards_per_step else 0.0
    per_pos = spec["result"].get("acceptance_per_position") or []
    expected = 1 + sum(per_pos[:k])
    v = (step - propose) / plain_step
    c = forward_ms / 1e3 / plain_step
    limit = expected / (v + k * c)
    speedup = spec["result"]["tok_per_s"] / plain["result"]["tok_per_s"]
    return {
        "k": k,
        "plain_step_ms": 1e3 * plain_step,
        "step_ms": 1e3 * step,
        "target_forward_ms_plain": 1e3 * _median(pc["_model_forward"]),
        "target_forward_ms": 1e3 * _median(sc["_model_forward"]),
        "sampler_ms_plain": 1e3 * _median(pc["_sample"]),
        "sampler_ms": 1e3 * _median(sc["_sample"]),
        "propose_ms": 1e3 * propose,
        "draft_forwards_ms": draft_ms,
        "draft_forwards_per_step": forwards_per_step,
        "bridge_ms": bridge_ms,
        "proposer_host_ms": max(1e3 * propose - draft_ms - bridge_ms, 0.0),
        "acceptance_per_position": per_pos,
        "E": expected,
        "v": v,
        "v_forward": _median(sc["_model_forward"]) / _median(pc["_model_forward"]),
        "c": c,
        "limit": limit,
        "speedup": speedup,
        "efficiency": speedup / limit if limit else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="smollm2-135m")
    ap.add_argument("--algorithm", default="tli")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--out", type=Path, default=results_dir() / "step_anatomy",
                    help="results path without suffix: <out>.json, .md and .png")
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child))
        return

    from hetero_harness.models import ensure_model
    from hetero_harness.prompts import chat_prompts, spec_bench_questions

    target, draft = str(ensure_model(args.target)), str(ensure_model(args.draft))
    questions = spec_bench_questions(max(args.batch_sizes + [4]))
    prompts = chat_prompts(target, questions)
    rows = []
    for b in args.batch_sizes:
        n = b if b > 1 else 4
        base = {"target": target, "prompts": prompts[:n], "max_tokens": args.max_tokens, "ignore_eos": True,
                "temperature": args.temperature, "batch_size": b, "request_seeds": list(range(n)),
                "max_num_seqs": max(b, 1)}
        plain = run({**base, "speculative_config": None})
        print(f"batch {b} plain: {plain['result']['tok_per_s']:.2f} tok/s", flush=True)
        for k in args.ks:
            spec = {"method": "hetero", "model": draft, "num_speculative_tokens": k, "algorithm": args.algorithm,
                    "draft_budget": "fixed"}  # the anatomy of a step at this k, every step
            row = {"batch": b, **anatomy(plain, run({**base, "speculative_config": spec}), k)}
            rows.append(row)
            print(json.dumps({key: row[key] for key in ("batch", "k", "speedup", "limit", "efficiency", "v", "c")}),
                  flush=True)
            write(rows, args)
    write(rows, args)


def write(rows: list[dict], args: argparse.Namespace) -> None:
    """JSON, a markdown table and a plot of measured and predicted speedup against k."""
    meta = run_meta({k: str(v) for k, v in vars(args).items()})
    lines = [
        f"{args.draft} drafting for {args.target} ({args.algorithm}), T = {args.temperature}, "
        f"{args.max_tokens} tokens per request; per-call medians. v: a speculative step without its drafting, "
        "c: one draft forward, both in plain steps; E: expected tokens per step; limit = E / (v + k c). "
        "`benchmarks/step_anatomy.py`.",
        "",
    ]
    body = []
    for r in rows:
        body.append([
            r["batch"], r["k"], fmt(r["plain_step_ms"], ".0f"), fmt(r["step_ms"], ".0f"),
            f"{fmt(r['target_forward_ms_plain'], '.0f')} → {fmt(r['target_forward_ms'], '.0f')}",
            f"{fmt(r['sampler_ms_plain'], '.1f')} → {fmt(r['sampler_ms'], '.1f')}",
            f"{fmt(r['draft_forwards_ms'] / max(r['draft_forwards_per_step'], 1e-9), '.0f')} × "
            f"{fmt(r['draft_forwards_per_step'], '.1f')}",
            fmt(r["bridge_ms"], ".1f"), fmt(r["proposer_host_ms"], ".1f"),
            " ".join(f"{a:.2f}" for a in r["acceptance_per_position"]), fmt(r["E"], ".2f"), fmt(r["v"], ".2f"),
            fmt(r["c"], ".3f"), f"{fmt(r['limit'], '.2f')}x", f"{fmt(r['speedup'], '.2f')}x",
            fmt(r["efficiency"], ".0%"),
        ])
    lines += table(["batch", "k", "plain step ms", "step ms", "target fwd ms (plain → spec)",
                    "sampler ms (plain → spec)", "draft fwd ms × n", "bridge ms", "proposer host ms",
                    "acceptance by position", "E", "v", "c", "limit", "speedup", "efficiency"], body)
    write_report(args.out.name, {"meta": meta, "rows": rows}, lines, title="The anatomy of a speculative step",
                 out=args.out.parent)
    with figure(args.out.name, figsize=(6, 4), dpi=120, out=args.out.parent) as (fig, ax):
        _draw(ax, rows)


def _draw(ax, rows: list[dict]) -> None:
    for b in sorted({r["batch"] for r in rows}):
        sub = [r for r in rows if r["batch"] == b]
        line = ax.plot([r["k"] for r in sub], [r["speedup"] for r in sub], "o-", label=f"batch {b} measured")[0]
        ax.plot([r["k"] for r in sub], [r["limit"] for r in sub], "x--", color=line.get_color(),
                label=f"batch {b} limit E/(v+kc)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("k (draft tokens per step)")
    ax.set_ylabel("speedup over plain decoding")
    ax.legend(fontsize=7)


if __name__ == "__main__":
    main()
