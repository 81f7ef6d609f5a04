"""The adaptive draft budget against plain decoding and every fixed k, in one run.

On the headline pair, per (temperature, batch size): plain decoding, vLLM's built-in
heterogeneous TLI, ours with the adaptive budget (k chosen per step and request in
0..k_max), and ours at fixed k. Batch 1 sweeps the fixed k over ``--fixed-k``; larger
batches run k = 4 only (the configuration that loses there). Plain and adaptive at the
first cell are repeated (``--repeats``) to show the run-to-run spread.

    .venv/bin/python benchmarks/adaptive_budget.py

Writes benchmarks/results/adaptive_budget.{json,md,png}.
"""

from __future__ import annotations

import argparse
import time

from report import appended_meta, figure, fmt, median, meta as run_meta, read_result, runs_cell, table, write_report

from hetero_harness.evaluation import run_isolated
from hetero_harness.models import ensure_model
from hetero_harness.prompts import chat_prompts, spec_bench_questions

NAME = "adaptive_budget"


def cases(draft: str, algorithm: str, k_max: int, fixed: list[int], builtin: bool) -> list[tuple[str, dict | None]]:
    ours = {"method": "hetero", "model": draft, "algorithm": algorithm}
    out: list[tuple[str, dict | None]] = [
        ("plain", None),
        (f"ours {algorithm} adaptive (k <= {k_max})", {**ours, "num_speculative_tokens": k_max}),
    ]
    out += [(f"ours {algorithm} fixed k={k}", {**ours, "num_speculative_tokens": k, "draft_budget": "fixed"})
            for k in fixed]
    if builtin:
        out.append(("vllm built-in TLI k=4", {"method": "draft_model", "model": draft, "num_speculative_tokens": 4,
                                              "use_heterogeneous_vocab": True}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="smollm2-135m")
    ap.add_argument("--algorithm", default="tli")
    ap.add_argument("--k-max", type=int, default=8)
    ap.add_argument("--fixed-k", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--tokens-at", nargs="*", default=["32=32"], metavar="BATCH=TOKENS",
                    help="tokens per request at these batch sizes instead of --max-tokens (run time)")
    ap.add_argument("--fixed-from", type=int, default=32,
                    help="batch sizes from this one up run plain and adaptive only (fixed k=4 is known to lose there)")
    ap.add_argument("--full-warmup-from", type=int, default=8,
                    help="batch sizes from this one up run the whole job once untimed first (first passes at new "
                         "shapes are slow; at batch 1 the first of several prompts absorbs them)")
    ap.add_argument("--batch1-prompts", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs of plain and adaptive in the first cell and at batch sizes from --repeat-from up")
    ap.add_argument("--repeat-from", type=int, default=8,
                    help="batch sizes from this one up repeat plain and adaptive too (runs there are noisy)")
    ap.add_argument("--name", default=NAME, help="results file stem in benchmarks/results/")
    ap.add_argument("--no-builtin", action="store_true", help="skip vLLM's built-in TLI")
    ap.add_argument("--unseeded", action="store_true",
                    help="requests without seeds: vLLM 0.32's CPU build fails a seeded request whose prefill is "
                         "chunked ('CPU Generator does not use offset'), in plain decoding too, as at batch 32, T = 1")
    ap.add_argument("--append", action="store_true", help="add to the rows already in the results file")
    args = ap.parse_args()

    target, draft = str(ensure_model(args.target)), str(ensure_model(args.draft))
    prompts = chat_prompts(target, spec_bench_questions(max(args.batch_sizes + [args.batch1_prompts])))
    meta = run_meta(args)
    rows: list[dict] = []
    if args.append:
        previous = read_result(args.name)
        rows, meta = previous["rows"], appended_meta(previous["meta"], meta)
    first = True
    for bs in args.batch_sizes:
        for temp in args.temperatures:
            n = bs if bs > 1 else args.batch1_prompts
            sweep = args.fixed_k if (bs == 1 and temp == args.temperatures[0]) else [4] if 4 in args.fixed_k else []
            sweep = sweep if bs < args.fixed_from else []
            tokens = dict(t.split("=") for t in args.tokens_at)
            max_tokens = int(tokens.get(str(bs), args.max_tokens))
            plain_tps = None
            builtin = temp == 0.0 and not args.no_builtin and bs < args.fixed_from
            repeated = first or bs >= args.repeat_from
            for name, spec in cases(draft, args.algorithm, args.k_max, sweep, builtin=builtin):
                reps = args.repeats if repeated and (spec is None or "adaptive" in name) else 1
                runs = []
                for rep in range(reps):
                    job = {"target": target, "prompts": prompts[:n], "max_tokens": max_tokens,
                           "temperature": temp, "batch_size": bs, "speculative_config": spec,
                           "request_seeds": None if args.unseeded else list(range(n)), "ignore_eos": True,
                           "max_num_seqs": max(bs, 16),
                           "warmup": "full" if bs >= args.full_warmup_from else True}
                    t0 = time.time()
                    runs.append(run_isolated(job))
                    print(f"T={temp} bs={bs} {name} rep={rep}: {runs[-1]['tok_per_s']:.2f} tok/s "
                          f"{runs[-1].get('draft_lengths')} ({time.time() - t0:.0f}s wall)", flush=True)
                tps = median([r["tok_per_s"] for r in runs])
                if spec is None:
                    plain_tps = tps
                rows.append({
                    "config": name, "temperature": temp, "batch_size": bs, "max_tokens": max_tokens,
                    "runs": [r["tok_per_s"] for r in runs],
                    "tok_per_s": tps, "speedup": tps / plain_tps,
                    "acceptance_rate": median([r["acceptance_rate"] for r in runs]),
                    "mean_acceptance_length": median([r["mean_acceptance_length"] for r in runs]),
                    "draft_lengths": runs[-1].get("draft_lengths"),
                    "unseeded": args.unseeded,
                })
                write_report(args.name, {"meta": meta, "rows": rows}, to_markdown(rows, args))
            first = False
    plot(rows, args.name)
    print(to_markdown(rows, args))


def _lengths(d: dict | None) -> str:
    if not d:
        return "-"
    total = sum(d.values())
    return " ".join(f"{k}:{100 * v / total:.0f}%" for k, v in d.items())


def to_markdown(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"Target {args.target} (float32), draft {args.draft}, {args.algorithm}; tokens per request in the "
        f"table (EOS ignored), Spec-Bench prompts; batch 1 runs {args.batch1_prompts} prompts one at a time; "
        f"batches of {args.full_warmup_from} and more run the whole job once untimed first (first passes at new "
        "shapes are slow on a CPU; the adaptive budget starts the timed pass warm, as in a serving engine). "
        "Draft lengths: share of steps per chosen draft length (the longest any request got that step). "
        "Several runs: their tok/s listed, the median used. `benchmarks/adaptive_budget.py`.",
        "",
    ]
    lines += table(
        ["T", "batch", "tokens", "configuration", "tok/s (runs)", "speedup", "acceptance", "mean acc. length",
         "draft lengths"],
        ([r["temperature"], r["batch_size"], r.get("max_tokens", args.max_tokens),
          r["config"] + (" (unseeded)" if r.get("unseeded") else ""), runs_cell(r["runs"]), f"{r['speedup']:.2f}x",
          fmt(r["acceptance_rate"], ".1%"), fmt(r["mean_acceptance_length"], ".2f"), _lengths(r["draft_lengths"])]
         for r in rows))
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], name: str) -> None:
    """Speedup per configuration, one panel per (T, batch)."""
    cells = sorted({(r["temperature"], r["batch_size"]) for r in rows}, key=lambda c: (c[1], c[0]))
    with figure(name, 1, len(cells), figsize=(3.2 * len(cells), 3.6), sharey=True, squeeze=False) as (fig, axes):
        _draw(axes, cells, rows)


def _draw(axes, cells: list[tuple[float, int]], rows: list[dict]) -> None:
    for ax, (temp, bs) in zip(axes[0], cells):
        cell = [r for r in rows if r["temperature"] == temp and r["batch_size"] == bs and r["config"] != "plain"]
        labels = [r["config"].replace("ours ", "").replace(" (k <= ", "\n(k<=") for r in cell]
        colors = ["tab:green" if "adaptive" in r["config"] else "tab:gray" if "vllm" in r["config"] else "tab:blue"
                  for r in cell]
        ax.bar(range(len(cell)), [r["speedup"] for r in cell], color=colors)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(cell)), labels, rotation=70, fontsize=7)
        ax.set_title(f"T={temp}, batch {bs}", fontsize=9)
    axes[0][0].set_ylabel("speedup over plain decoding")


if __name__ == "__main__":
    main()
