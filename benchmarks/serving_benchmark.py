"""Serving benchmark: `vllm serve` with and without speculation, under `vllm bench serve`.

For each configuration (plain decoding, vLLM's built-in heterogeneous-vocabulary TLI,
each of our algorithms) one real server is started from the documented command, and
vLLM's own load generator sends Spec-Bench questions (chat endpoint, greedy, fixed output
length) at several concurrency levels. Meanwhile /metrics is sampled every second for the
plugin's per-request draft state (count and bytes), to show it stays bounded and returns
to zero. Same machine, same run, configurations one after the other.

    .venv/bin/python benchmarks/serving_benchmark.py                   # defaults below
    .venv/bin/python benchmarks/serving_benchmark.py --only plain tli --concurrency 1 8
    .venv/bin/python benchmarks/serving_benchmark.py --only union dtw --append   # add rows

Writes benchmarks/results/serving.{json,md} and serving_tpot.png.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from vllm_hetero_spec.harness.evaluation import default_env
from vllm_hetero_spec.harness.models import ensure_model
from vllm_hetero_spec.harness.prompts import SPEC_BENCH
from vllm_hetero_spec.harness.server_process import ServerProcess, vllm_command

OUT = Path(__file__).parent / "results"


def configs(draft: str, k: int) -> dict[str, dict | None]:
    def ours(algorithm: str, **extra: object) -> dict:
        return {"method": "hetero", "model": draft, "num_speculative_tokens": k, "algorithm": algorithm, **extra}

    return {
        "plain": None,
        "ours tli": ours("tli"),
        "vllm draft_model + use_heterogeneous_vocab": {
            "method": "draft_model", "model": draft, "num_speculative_tokens": k, "use_heterogeneous_vocab": True,
        },
        "ours slem": ours("slem"),
        "ours fsd (tau 0.1)": ours("fsd", fsd_threshold=0.1),
        "ours union": ours("union"),
        "ours dtw (lossless)": ours("dtw"),
    }


def sharegpt_file(path: Path) -> Path:
    """Spec-Bench first turns in the ShareGPT layout `vllm bench serve` reads without pandas."""
    rows = []
    for i, line in enumerate(SPEC_BENCH.read_text().splitlines()):
        question = json.loads(line)["turns"][0]
        rows.append({"id": str(i), "conversations": [
            {"from": "human", "value": question}, {"from": "gpt", "value": "placeholder answer " * 8},
        ]})
    path.write_text(json.dumps(rows))
    return path


class StateSampler(threading.Thread):
    """Samples the plugin's draft-state gauges once a second while a load runs."""

    def __init__(self, server: ServerProcess):
        super().__init__(daemon=True)
        self.server = server
        self.samples: list[tuple[float, float, float]] = []
        self.stop_flag = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self.stop_flag.is_set():
            try:
                states = self.server.metric_sum("hetero:request_states")
                size = self.server.metric_sum("hetero:draft_state_bytes")
                self.samples.append((time.monotonic() - start, states, size))
            except OSError:
                pass
            self.stop_flag.wait(1.0)


def bench(server: ServerProcess, dataset: Path, n: int, concurrency: int, out_len: int, result: Path) -> dict:
    cmd = [
        *vllm_command(), "bench", "serve", "--backend", "openai-chat", "--base-url", server.url,
        "--endpoint", "/v1/chat/completions", "--model", server.model, "--tokenizer", server.model,
        "--dataset-name", "sharegpt", "--dataset-path", str(dataset), "--num-prompts", str(n),
        "--max-concurrency", str(concurrency), "--sharegpt-output-len", str(out_len), "--ignore-eos",
        "--temperature", "0", "--seed", "0", "--num-warmups", "2", "--disable-tqdm", "--save-result",
        "--result-dir", str(result.parent), "--result-filename", result.name,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=default_env(), timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(result.read_text())


def requests_at(concurrency: int, args: argparse.Namespace) -> int:
    return args.num_prompts_at_max if concurrency == max(args.concurrency) else max(2 * concurrency, 8)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-0.5b", help="1.5B: about 3x longer on 2 cores")
    ap.add_argument("--draft", default="smollm2-135m")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--num-prompts-at-max", type=int, default=200, help="requests at the highest concurrency")
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--only", nargs="*", help="substrings of configuration names to run")
    ap.add_argument("--append", action="store_true",
                    help="add to the rows of an earlier serving.json (same settings) instead of starting afresh")
    args = ap.parse_args()

    target = str(ensure_model(args.target))
    draft = str(ensure_model(args.draft))
    OUT.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="serving_bench-"))
    dataset = sharegpt_file(work / "spec_bench_sharegpt.json")
    rows, memory = [], {}
    if args.append and (OUT / "serving.json").exists():
        earlier = json.loads((OUT / "serving.json").read_text())
        rows, memory = earlier["rows"], earlier["draft_state"]
    meta = {"args": vars(args), "target": target, "draft": draft, "date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.machine()} {platform.processor()}"}
    for name, spec in configs(draft, args.k).items():
        if args.only and not any(s in name for s in args.only):
            continue
        extra = ["--dtype", "float32", "--max-model-len", str(args.max_model_len), "--generation-config", "vllm"]
        if spec is not None:
            spec_file = work / f"{name.replace(' ', '_')}.json"
            spec_file.write_text(json.dumps(spec))
            extra += ["--speculative-config", str(spec_file)]
        with ServerProcess(target, extra, work / f"{name.replace(' ', '_')}.log") as server:
            for c in args.concurrency:
                sampler = StateSampler(server) if name.startswith("ours") else None
                if sampler:
                    sampler.start()
                res = bench(server, dataset, requests_at(c, args), c, args.output_len, work / f"{name}-{c}.json")
                if sampler:
                    sampler.stop_flag.set()
                    sampler.join()
                    time.sleep(1.0)
                    after = (server.metric_sum("hetero:request_states"), server.metric_sum("hetero:draft_state_bytes"))
                    memory[f"{name} @ {c}"] = {"samples": sampler.samples, "after": after}
                rows.append({
                    "configuration": name, "concurrency": c,
                    **{key: res.get(key) for key in (
                        "num_prompts", "completed", "failed", "output_throughput", "request_throughput",
                        "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "mean_tpot_ms",
                        "spec_decode_acceptance_rate", "spec_decode_acceptance_length",
                    )},
                })
                print(json.dumps(rows[-1]), flush=True)
                # After every cell, so that an interrupted run keeps what it measured.
                (OUT / "serving.json").write_text(json.dumps({"meta": meta, "rows": rows, "draft_state": memory}))
                write_markdown(rows, memory, meta)
                plot(rows)


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def write_markdown(rows: list[dict], memory: dict, meta: dict) -> None:
    plain = {r["concurrency"]: r["output_throughput"] for r in rows if r["configuration"] == "plain"}
    lines = [
        f"Target {Path(meta['target']).name}, draft {Path(meta['draft']).name}, k={meta['args']['k']}, "
        f"{meta['args']['output_len']} output tokens (ignore_eos), greedy, Spec-Bench chat prompts, "
        "`vllm bench serve` against `vllm serve` on this machine.",
        "",
        "| configuration | concurrency | requests | failed | output tok/s | vs plain | median TTFT ms | "
        "median TPOT ms | p99 TPOT ms | acceptance |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = plain.get(r["concurrency"])
        ratio = f"{r['output_throughput'] / base:.2f}x" if base else "-"
        acc = r.get("spec_decode_acceptance_rate")
        lines.append(
            f"| {r['configuration']} | {r['concurrency']} | {r['completed']}/{r['num_prompts']} | {r['failed']} | "
            f"{_fmt(r['output_throughput'], '.2f')} | {ratio} | {_fmt(r['median_ttft_ms'], '.0f')} | "
            f"{_fmt(r['median_tpot_ms'], '.0f')} | {_fmt(r['p99_tpot_ms'], '.0f')} | "
            f"{'-' if acc is None else f'{acc:.1f}%'} |"
        )
    lines += ["", "Per-request draft state during each load (sampled from /metrics once a second):", "",
              "| run | samples | peak requests held | peak bytes | bytes, first half max | bytes, second half max | "
              "after the load |", "|---|---|---|---|---|---|---|"]
    for run, m in memory.items():
        s = m["samples"]
        half = len(s) // 2
        first = max((x[2] for x in s[:half]), default=0.0)
        second = max((x[2] for x in s[half:]), default=0.0)
        lines.append(
            f"| {run} | {len(s)} | {max((x[1] for x in s), default=0):.0f} | {max((x[2] for x in s), default=0):.3g} | "
            f"{first:.3g} | {second:.3g} | {m['after'][0]:.0f} requests, {m['after'][1]:.0f} bytes |"
        )
    (OUT / "serving.md").write_text("\n".join(lines) + "\n")


def plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r["configuration"] for r in rows):
        pts = sorted((r["concurrency"], r["median_tpot_ms"]) for r in rows if r["configuration"] == name)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xscale("log", base=2)
    levels = sorted({r["concurrency"] for r in rows})
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("median TPOT (ms per output token)")
    ax.set_title("vllm serve on a 2-core CPU: time per output token")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "serving_tpot.png", dpi=120)


if __name__ == "__main__":
    main()
