"""Serving benchmark: `vllm serve` with and without speculation, under `vllm bench serve`.

Three servers, each started as a user starts it (vLLM's default flags, no
``--enforce-eager``): plain decoding, ours with the shipped ``configs/hetero.json``
(``algorithm: auto``, adaptive draft length), and vLLM's built-in
heterogeneous-vocabulary TLI (``draft_model`` with ``use_heterogeneous_vocab``). vLLM's own
load generator sends held-out Spec-Bench questions (chat endpoint, fixed output length,
EOS ignored) at each concurrency and temperature. Around each cell the server's
/metrics are read, so each cell reports its own acceptance, the draft lengths the budget
chose (ours: mean over steps, and the share of steps it left undrafted) and the rules
``auto`` drafted with. Same machine, same run, servers one after the other (two 1.5B
servers do not fit beside each other in 24 GB with their drafters).

    .venv/bin/python benchmarks/serving_benchmark.py                   # ~115 min on 2 cores
    .venv/bin/python benchmarks/serving_benchmark.py --only plain ours --cells 0:1 1:4 1:16 --repeats 2 \
        --name serving_ab                                              # interleaved A/B, ~65 min
    .venv/bin/python benchmarks/serving_benchmark.py --concurrency 1 4 --temperatures 0 --min-requests 4 \
        --warmups 1                                                    # ~27 min

Writes benchmarks/results/<name>.{json,md,png} (``--name``, default ``serving``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from report import figure, fmt, median, meta as run_meta, range_cell, ratio_cell, results_dir, runs_cell, table
from report import write_markdown as save_markdown
from report import write_report

from hetero_harness.evaluation import default_env
from hetero_harness.models import ensure_model
from hetero_harness.prompts import held_out_questions
from hetero_harness.server_process import ServerProcess, vllm_command

ROOT = Path(__file__).resolve().parents[1]
OUT = results_dir()
PLAIN, OURS, BUILTIN = "plain", "ours (configs/hetero.json)", "vLLM built-in TLI"
# Counters read before and after each cell; the cell reports their differences.
COUNTERS = (
    "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total", "hetero:budget_steps_total", "hetero:draft_length_sum_total",
    "hetero:undrafted_steps_total", "hetero:slem_request_steps_total", "hetero:tli_request_steps_total",
    "hetero:slrs_request_steps_total", "hetero:draft_seconds_total", "hetero:bridge_seconds_total",
    "hetero:undrafted_requests_total",
)
BENCH_KEYS = ("duration", "num_prompts", "completed", "failed", "output_throughput", "request_throughput", "median_ttft_ms",
              "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "mean_tpot_ms")


def servers(draft: str, k: int) -> dict[str, str | None]:
    """Configuration name -> the ``--speculative-config`` argument (None: plain)."""
    builtin = {"method": "draft_model", "model": draft, "num_speculative_tokens": k, "use_heterogeneous_vocab": True}
    return {PLAIN: None, OURS: str(ROOT / "configs" / "hetero.json"), BUILTIN: json.dumps(builtin)}


def sharegpt_file(path: Path, questions: list[str]) -> Path:
    """The questions in the ShareGPT layout `vllm bench serve` reads (the answer is a
    placeholder: ``--sharegpt-output-len`` fixes the length)."""
    rows = [{"id": str(i), "conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": "answer"}]}
            for i, q in enumerate(questions)]
    path.write_text(json.dumps(rows))
    return path


def bench(server: ServerProcess, dataset: Path, n: int, concurrency: int, temperature: float, out_len: int,
          warmups: int, result: Path) -> dict:
    cmd = [
        *vllm_command(), "bench", "serve", "--backend", "openai-chat", "--base-url", server.url,
        "--endpoint", "/v1/chat/completions", "--model", server.model, "--tokenizer", server.model,
        "--dataset-name", "sharegpt", "--dataset-path", str(dataset), "--num-prompts", str(n),
        "--max-concurrency", str(concurrency), "--sharegpt-output-len", str(out_len), "--ignore-eos",
        "--temperature", str(temperature), "--seed", "0", "--num-warmups", str(warmups), "--disable-tqdm",
        "--save-result", "--result-dir", str(result.parent), "--result-filename", result.name,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=default_env(), timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(result.read_text())


def counters(server: ServerProcess) -> dict[str, float]:
    """:data:`COUNTERS` summed over their labels, from one read of ``/metrics``."""
    return server.metric_sums(COUNTERS)


def speculation(before: dict[str, float], after: dict[str, float]) -> dict:
    """What the cell's speculation did, from the counters' differences."""
    d = {name: after[name] - before[name] for name in COUNTERS}
    drafted = d["vllm:spec_decode_num_draft_tokens_total"]
    out: dict = {"acceptance": d["vllm:spec_decode_num_accepted_tokens_total"] / drafted if drafted else None}
    if d["hetero:budget_steps_total"]:
        steps = d["hetero:budget_steps_total"]
        out["mean_draft_length"] = d["hetero:draft_length_sum_total"] / steps
        out["undrafted_share"] = d["hetero:undrafted_steps_total"] / steps
        # The drafter's own time in the cell (its forwards and sampling, plus the bridge):
        # what speculation spent, drafted steps' catch-up on prompts included.
        out["drafter_s"] = d["hetero:draft_seconds_total"] + d["hetero:bridge_seconds_total"]
        # Undrafted steps are the budget's k = 0 plus steps where no row came out with a
        # proposal; request-steps with nothing to draft from are one cause of the latter.
        out["nothing_to_draft_request_steps"] = d["hetero:undrafted_requests_total"]
        out["rules"] = {rule: d[f"hetero:{rule}_request_steps_total"] for rule in ("slem", "tli", "slrs")
                        if d[f"hetero:{rule}_request_steps_total"]}
    elif d["vllm:spec_decode_num_drafts_total"]:
        out["mean_draft_length"] = drafted / d["vllm:spec_decode_num_drafts_total"]
    return out


def requests_at(concurrency: int, minimum: int) -> int:
    """Enough requests for two waves, and at least ``minimum``."""
    return max(minimum, 2 * concurrency)


def cell_list(args: argparse.Namespace) -> list[tuple[float, int]]:
    """(temperature, concurrency) cells in run order: ``--cells T:C`` if given, else the
    product of ``--temperatures`` and ``--concurrency``."""
    if args.cells:
        return [(float(t), int(c)) for t, c in (cell.split(":") for cell in args.cells)]
    return [(t, c) for t in args.temperatures for c in args.concurrency]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="serving")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="smollm2-135m", help="vLLM's built-in drafter (ours: the shipped config's)")
    ap.add_argument("-k", type=int, default=4, help="vLLM's built-in draft length (the shipped config's is 4)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--cells", nargs="+", metavar="T:C", help="run only these temperature:concurrency cells")
    ap.add_argument("--repeats", type=int, default=1,
                    help="rounds; each round starts every server again, in turn, so runs interleave")
    ap.add_argument("--server-env", nargs="*", default=[], metavar="KEY=VALUE",
                    help="extra environment for every server (e.g. VLLM_CPU_NUM_OF_RESERVED_CPU=0)")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--min-requests", type=int, default=8, help="requests per cell: two waves, at least this many")
    ap.add_argument("--warmups", type=int, default=2, help="warm-up requests before each cell (untimed)")
    ap.add_argument("--skip", type=int, default=40, help="held-out prompts: Spec-Bench questions past the first SKIP")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--only", nargs="*", help="substrings of server names to run")
    args = ap.parse_args()

    target = str(ensure_model(args.target))
    draft = str(ensure_model(args.draft))
    work = Path(tempfile.mkdtemp(prefix="serving_bench-"))
    cells = cell_list(args)
    most = requests_at(max(c for _, c in cells), args.min_requests)
    dataset = sharegpt_file(work / "held_out.json", held_out_questions(most + 2, args.skip))
    server_env = dict(kv.split("=", 1) for kv in args.server_env)
    meta = run_meta(args, date_format="%Y-%m-%d %H:%M", target=target, draft=draft, logs=str(work))
    rows: list[dict] = []
    for rnd in range(args.repeats):
        for name, spec in servers(draft, args.k).items():
            if args.only and not any(s in name for s in args.only):
                continue
            extra = ["--dtype", "float32", "--max-model-len", str(args.max_model_len), "--generation-config", "vllm"]
            if spec is not None:
                extra += ["--speculative-config", spec]
            slug = f"{name.split(' ')[0]}-r{rnd}"
            began = time.monotonic()
            with ServerProcess(target, extra, work / f"{slug}.log", env=server_env) as server:
                startup_s = time.monotonic() - began
                for t, c in cells:
                    before = counters(server)
                    n = requests_at(c, args.min_requests)
                    res = bench(server, dataset, n, c, t, args.output_len, args.warmups, work / f"{slug}-{t}-{c}.json")
                    rows.append({"configuration": name, "round": rnd, "temperature": t, "concurrency": c,
                                 "startup_s": startup_s, **{key: res.get(key) for key in BENCH_KEYS},
                                 **speculation(before, counters(server))})
                    print(json.dumps(rows[-1]), flush=True)
                    # After every cell, so that an interrupted run keeps what it measured.
                    write_report(args.name, {"meta": meta, "rows": rows}, out=OUT, indent=1)
                    summary = summarize(rows)
                    write_markdown(args.name, summary, meta)
                    if any(r["configuration"] == PLAIN for r in summary):  # the plot is drawn against plain
                        plot(args.name, summary)


def summarize(rows: list[dict]) -> list[dict]:
    """One row per (configuration, T, concurrency): per-run figures' medians over the
    rounds, the runs' throughputs, and counters pooled over the rounds."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["configuration"], r["temperature"], r["concurrency"]), []).append(r)
    out = []
    for (conf, t, c), runs in groups.items():
        agg = {"configuration": conf, "temperature": t, "concurrency": c,
               "runs": [r["output_throughput"] for r in runs], "failed": sum(r["failed"] or 0 for r in runs)}
        for key in ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
                    "acceptance", "mean_draft_length", "undrafted_share", "drafter_s", "duration"):
            agg[key] = median([r.get(key) for r in runs])
        rules: dict[str, float] = {}
        for r in runs:
            for rule, steps in (r.get("rules") or {}).items():
                rules[rule] = rules.get(rule, 0) + steps
        agg["rules"] = rules
        out.append(agg)
    return out


def _base(summary: list[dict], r: dict) -> dict | None:
    return next((p for p in summary if p["configuration"] == PLAIN and p["temperature"] == r["temperature"]
                 and p["concurrency"] == r["concurrency"]), None)


def write_markdown(name: str, summary: list[dict], meta: dict) -> None:
    a = meta["args"]
    rounds = a.get("repeats", 1)
    env = ", ".join(f"`{kv}`" for kv in a.get("server_env") or [])
    lines = [
        f"Target {Path(meta['target']).name} (float32), `vllm serve` with vLLM's default flags"
        f"{f' and {env} in its environment' if env else ''}, "
        f"`vllm bench serve` (chat endpoint) sending held-out Spec-Bench questions (past the first {a['skip']}, "
        f"<= 1,200 characters), {a['output_len']} output tokens each (EOS ignored), two waves of requests per cell "
        f"(twice the concurrency, at least {a['min_requests']}) after {a['warmups']} warm-up request(s). "
        "Ours: `configs/hetero.json` (SmolLM2-135M, `auto`, adaptive draft length <= 4); "
        f"vLLM built-in: `draft_model` + `use_heterogeneous_vocab`, {Path(meta['draft']).name}, k = {a['k']}. "
        f"{rounds} round(s), {meta['date']}, {meta['machine']}; servers one after the other, every server started "
        "again in each round, so the configurations' runs interleave. Figures are medians over the rounds; "
        "vs plain = median over plain's median, spread = the runs' min-max over plain's median. "
        "Draft length: the mean over steps (ours: the budget's choice, 0 on undrafted steps). Drafter s: "
        "seconds the server's drafter spent in the cell (forwards, sampling, the bridge), against the cell's "
        "wall time.",
        "",
    ]
    body = []
    for r in sorted(summary, key=lambda r: (r["temperature"], r["concurrency"])):
        base = _base(summary, r)
        plain = base["output_throughput"] if base else None
        rules = ", ".join(f"{k} {v:.0f}" for k, v in r["rules"].items()) or "-"
        spent = f"{r['drafter_s']:.1f} / {r['duration']:.0f}" if r.get("drafter_s") is not None and r.get("duration") else "-"
        body.append([
            f"{r['temperature']:g}", r["concurrency"], r["configuration"], runs_cell(r["runs"]),
            ratio_cell(r["output_throughput"] / plain if plain else None),
            range_cell(min(r["runs"]) / plain, max(r["runs"]) / plain) if plain else "-",
            f"{fmt(r['median_ttft_ms'], '.0f')} / {fmt(r['p99_ttft_ms'], '.0f')}",
            f"{fmt(r['median_tpot_ms'], '.0f')} / {fmt(r['p99_tpot_ms'], '.0f')}",
            fmt(r.get("acceptance"), ".0%"), fmt(r.get("mean_draft_length"), ".2f"),
            fmt(r.get("undrafted_share"), ".0%"), spent, rules,
        ])
    lines += table(["T", "concurrency", "configuration", "output tok/s (runs)", "vs plain", "spread",
                    "TTFT median / p99 ms", "TPOT median / p99 ms", "acceptance", "draft length", "undrafted steps",
                    "drafter s / cell s", "rules (request-steps)"], body)
    failed = sum(r["failed"] for r in summary)
    lines += ["", f"Failed requests over all cells: {failed}."]
    save_markdown(name, lines, out=OUT)


def plot(name: str, rows: list[dict]) -> None:
    temps = sorted({r["temperature"] for r in rows})
    with figure(name, 2, len(temps), out=OUT, figsize=(5.5 * len(temps), 7), squeeze=False) as (fig, axes):
        _draw(axes, temps, rows)


def _draw(axes, temps: list[float], rows: list[dict]) -> None:
    levels = sorted({r["concurrency"] for r in rows})
    for col, t in enumerate(temps):
        for conf in dict.fromkeys(r["configuration"] for r in rows):
            pts = sorted((r["concurrency"], r) for r in rows if r["configuration"] == conf and r["temperature"] == t)
            ratio = [(c, r["output_throughput"] / b["output_throughput"]) for c, r in pts if (b := _base(rows, r))]
            axes[0][col].plot([p[0] for p in ratio], [p[1] for p in ratio], marker="o", label=conf)
            axes[1][col].plot([c for c, _ in pts], [r["median_tpot_ms"] for _, r in pts], marker="o", label=conf)
        axes[0][col].axhline(1.0, color="grey", lw=0.8)
        axes[0][col].set_title(f"T = {t:g}: output tok/s over plain")
        axes[1][col].set_title(f"T = {t:g}: median TPOT (ms)")
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xscale("log", base=2)
            ax.set_xticks(levels, [str(c) for c in levels])
            ax.set_xlabel("concurrent requests")
            ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=8)


if __name__ == "__main__":
    main()
