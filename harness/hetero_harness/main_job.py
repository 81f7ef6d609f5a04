"""The main job: a real heterogeneous speculative-decoding batch run, with no arguments.

``python -m hetero_harness`` runs the same Spec-Bench prompts through vLLM's offline
``LLM.generate`` with the target alone (plain) and with a draft model of another
vocabulary (hetero), over several rounds (``--rounds``), and prints the median speedup
with its spread, tokens/s, acceptance rate, mean acceptance length, the rules ``auto``
chose and whether the outputs are identical (T = 0).

The passes alternate, each round starting with the other engine (plain, hetero | hetero,
plain | ...), so that a slow patch of the machine does not land on one side. One engine
lives at a time: a float32 1.5B engine's worker peaks near 12 GiB, so two alive at once
need about 24 GiB (tried on a 24 GiB machine: one was killed for memory). Each engine
runs in a process of its own, which runs its consecutive passes: with the default 2
rounds, plain [1] | hetero [1, 2] | plain [2], three start-ups (3 rounds: four). Each
engine warms up on the first prompt (untimed, 16 tokens) before its passes; only the
generate calls are timed, so loading and torch.compile stay out of the tok/s. While a
pass is timed the job measures the CPU time other processes take, and warns when they
took a noticeable share or the rounds disagree widely: a busy machine makes the
speedup unreliable.

Our own lines start with ``[hetero]``; vLLM's logging is left as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

PREFIX = "[hetero]"
#: Rounds whose speedups differ by more than this factor (max / min) make the result suspect.
SPREAD_WARN = 1.3
#: Other processes keeping more than this many cores busy on average during a timed pass.
OTHERS_WARN = 0.25
HEARTBEAT_S = 30.0
WARMUP_TOKENS = 16
ENGINES = ("plain", "hetero")


def say(msg: str) -> None:
    print(f"{PREFIX} {msg}", flush=True)


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


@contextmanager
def heartbeat(what: str, every: float = HEARTBEAT_S) -> Iterator[None]:
    """Say that ``what`` is still going every ``every`` seconds (torch.compile can be
    silent for minutes)."""
    t0 = time.perf_counter()
    done = threading.Event()

    def tick() -> None:
        while not done.wait(every):
            say(f"... {what}: {time.perf_counter() - t0:.0f} s so far")

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def schedule(rounds: int) -> list[tuple[str, list[int]]]:
    """The engine processes in order, each with the rounds (0-based) whose pass it runs.

    Round r runs plain then hetero when r is even, hetero then plain when odd; passes of
    one engine that follow each other share a process."""
    passes = [(name, r) for r in range(rounds) for name in (ENGINES if r % 2 == 0 else ENGINES[::-1])]
    blocks: list[tuple[str, list[int]]] = []
    for name, r in passes:
        if blocks and blocks[-1][0] == name:
            blocks[-1][1].append(r)
        else:
            blocks.append((name, [r]))
    return blocks


# --- CPU use by other processes (Linux) --------------------------------------------

def _stat_fields(pid: int | str) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def _own_tree() -> list[int]:
    """This process and its descendants (the engine core and worker processes)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                children.setdefault(int(_stat_fields(entry)[1]), []).append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [os.getpid()]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


class CpuWatch:
    """CPU time the whole machine used, less this process tree's, between :meth:`start`
    and :meth:`stop`: what other work took while a pass was timed."""

    def __init__(self) -> None:
        self.ok = os.path.exists("/proc/stat")
        self.hz = os.sysconf("SC_CLK_TCK") if self.ok else 100
        self._t0: tuple[float, int, int] | None = None

    def _snapshot(self) -> tuple[float, int, int]:
        with open("/proc/stat") as f:
            cpu = [int(x) for x in f.readline().split()[1:]]
        busy = sum(cpu[:8]) - cpu[3] - cpu[4]  # user..steal, less idle and iowait
        own = 0
        for pid in _own_tree():
            try:
                fields = _stat_fields(pid)
                own += int(fields[11]) + int(fields[12])  # utime + stime
            except (OSError, ValueError, IndexError):
                pass  # gone meanwhile
        return time.perf_counter(), busy, own

    def start(self) -> None:
        self._t0 = self._snapshot() if self.ok else None

    def stop(self) -> float | None:
        """Cores other processes kept busy on average since :meth:`start`."""
        if self._t0 is None:
            return None
        t1 = self._snapshot()
        wall = t1[0] - self._t0[0]
        if wall <= 0:
            return None
        return max(0.0, ((t1[1] - self._t0[1]) - (t1[2] - self._t0[2])) / self.hz / wall)


# --- one engine process ------------------------------------------------------------

def child(job_path: str, out_path: str) -> None:
    """Start ``job``'s engine, warm it up, time its passes, write the result."""
    from vllm import SamplingParams

    from hetero_harness.evaluation import spec_decode_delta, start_engine

    job = json.loads(Path(job_path).read_text())
    name, rounds, n_rounds = job["name"], job["rounds"], job["n_rounds"]
    prompts, bs = job["prompts"], job["batch_size"]
    params = [SamplingParams(max_tokens=job["max_tokens"], temperature=job["temperature"], seed=seed)
              for seed in job["request_seeds"]]

    def generate(indices: list[int]) -> list[Any]:
        outputs = []
        for s in range(0, len(indices), bs):
            chunk = indices[s:s + bs]
            outputs += llm.generate([prompts[i] for i in chunk], [params[i] for i in chunk], use_tqdm=False)
        return outputs

    def probe() -> dict[str, Any]:
        report = llm.collective_rpc("hetero_probe_report")[0]
        report.pop("runner_calls", None)
        return report

    t0 = time.perf_counter()
    with heartbeat(f"{name} engine starting (loading weights, torch.compile, vLLM's warm-up)"):
        llm = start_engine(job)
    start_s = time.perf_counter() - t0
    say(f"{name} engine ready in {start_s:.0f} s")

    # Untimed: the first pass at each new shape is slow on a CPU. The first prompt's
    # prefill and WARMUP_TOKENS of decoding (drafting and verification too for hetero).
    t0 = time.perf_counter()
    out = llm.generate([prompts[0]], SamplingParams(max_tokens=WARMUP_TOKENS, temperature=0.0), use_tqdm=False)
    say(f"{name} warm-up (not counted): {len(out[0].outputs[0].token_ids)} tokens of prompt 1 in "
        f"{time.perf_counter() - t0:.1f} s")
    before_probe = probe()

    watch, passes = CpuWatch(), {}
    for r in rounds:
        before = {m.name: m for m in llm.get_metrics()}
        watch.start()
        t0 = time.perf_counter()
        outputs = generate(list(range(len(prompts))))
        elapsed = time.perf_counter() - t0
        others = watch.stop()
        n_out = sum(len(o.outputs[0].token_ids) for o in outputs)
        res = {
            "elapsed_s": elapsed,
            "output_tokens": n_out,
            "tok_per_s": n_out / elapsed if elapsed > 0 else 0.0,
            "other_cpu_cores": others,
            "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            "texts": [o.outputs[0].text for o in outputs],
            **spec_decode_delta(before, llm.get_metrics()),
        }
        passes[str(r)] = res
        acc = f", acceptance {fmt(res['acceptance_rate'], '.0%')}" if job.get("speculative_config") else ""
        say(f"round {r + 1}/{n_rounds} {name}: {len(prompts)} prompts, {n_out} tokens in {elapsed:.1f} s = "
            f"{res['tok_per_s']:.2f} tok/s{acc}")
    Path(out_path).write_text(json.dumps({"start_s": start_s, "passes": passes, "probe_before": before_probe,
                                          "probe_after": probe()}))


def run_child(job: dict[str, Any], timeout: float = 3600) -> dict[str, Any]:
    """:func:`child` in a process of its own, its output (vLLM's logs included) shown live."""
    from hetero_harness.evaluation import default_env

    with tempfile.TemporaryDirectory(prefix="hetero_main_") as tmp:
        job_path, out_path = Path(tmp, "job.json"), Path(tmp, "result.json")
        job_path.write_text(json.dumps(job))
        argv = [sys.executable, "-m", "hetero_harness.main_job", "--child", str(job_path), str(out_path)]
        proc = subprocess.Popen(argv, env=default_env())
        try:
            code = proc.wait(timeout=timeout)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        if code != 0 or not out_path.exists():
            raise SystemExit(f"{PREFIX} the {job['name']} engine's process failed (exit {code}); its log is above")
        return json.loads(out_path.read_text())


# --- the job -----------------------------------------------------------------------

def _count_delta(after: dict[str, int] | None, before: dict[str, int] | None) -> dict[str, int]:
    before = before or {}
    return {k: n - before.get(k, 0) for k, n in (after or {}).items() if n - before.get(k, 0)}


def drafter_figures(processes: list[dict[str, Any]]) -> dict[str, Any]:
    """The drafter's figures over the timed passes of every hetero process (each
    process's counters at its end, less those after its warm-up)."""
    steps = bridge_s = draft_s = fallbacks = 0.0
    lengths: dict[str, int] = {}
    rules: dict[str, int] | None = None
    last: dict[str, Any] = {}
    for proc in processes:
        a, b = proc["probe_after"], proc["probe_before"]
        raw_a, raw_b = a.get("drafter_raw") or {}, b.get("drafter_raw") or {}
        steps += raw_a.get("steps", 0) - raw_b.get("steps", 0)
        bridge_s += raw_a.get("bridge_s", 0.0) - raw_b.get("bridge_s", 0.0)
        draft_s += raw_a.get("draft_s", 0.0) - raw_b.get("draft_s", 0.0)
        fallbacks += raw_a.get("fallbacks", 0) - raw_b.get("fallbacks", 0)
        for k, n in _count_delta(a.get("draft_lengths"), b.get("draft_lengths")).items():
            lengths[k] = lengths.get(k, 0) + n
        if a.get("rules_chosen") is not None:
            rules = rules if rules is not None else {}
            for k, n in _count_delta(a.get("rules_chosen"), b.get("rules_chosen")).items():
                rules[k] = rules.get(k, 0) + n
        last = a
    return {
        "draft_dtype": last.get("draft_dtype"),
        "bridge_ms_per_step": 1e3 * bridge_s / steps if steps else None,
        "draft_ms_per_step": 1e3 * draft_s / steps if steps else None,
        "draft_lengths": dict(sorted(lengths.items(), key=lambda kv: int(kv[0]))),
        "rules_chosen": rules,
        "rule_rates": last.get("rule_rates"),  # the last hetero process's, at its end
        "fallbacks": int(fallbacks),
    }


def round_row(r: int, plain: dict[str, Any], hetero: dict[str, Any], first: str) -> dict[str, Any]:
    same = sum(a == b for a, b in zip(plain["token_ids"], hetero["token_ids"]))
    others = [x for x in (plain["other_cpu_cores"], hetero["other_cpu_cores"]) if x is not None]
    return {
        "round": r + 1,
        "first": first,
        "plain_tok_per_s": plain["tok_per_s"],
        "hetero_tok_per_s": hetero["tok_per_s"],
        "speedup": hetero["tok_per_s"] / plain["tok_per_s"],
        "plain_elapsed_s": plain["elapsed_s"],
        "hetero_elapsed_s": hetero["elapsed_s"],
        "plain_output_tokens": plain["output_tokens"],
        "hetero_output_tokens": hetero["output_tokens"],
        "acceptance_rate": hetero["acceptance_rate"],
        "mean_acceptance_length": hetero["mean_acceptance_length"],
        "num_drafts": hetero["num_drafts"],
        "num_draft_tokens": hetero["num_draft_tokens"],
        "num_accepted_tokens": hetero["num_accepted_tokens"],
        "identical_outputs": same,
        "other_cpu_cores": max(others) if others else None,
    }


def summarize(rows: list[dict[str, Any]], n_prompts: int) -> dict[str, Any]:
    """Median speedup and spread over the rounds, acceptance over all of them, and
    whether the machine looked busy."""
    speedups = [row["speedup"] for row in rows]
    drafts = sum(row["num_drafts"] for row in rows)
    draft_tokens = sum(row["num_draft_tokens"] for row in rows)
    accepted = sum(row["num_accepted_tokens"] for row in rows)
    others = [row["other_cpu_cores"] for row in rows if row["other_cpu_cores"] is not None]
    spread = max(speedups) / min(speedups) if min(speedups) > 0 else float("inf")
    busy = []
    if spread > SPREAD_WARN:
        busy.append(f"the rounds' speedups differ by a factor of {spread:.2f} (max/min)")
    if others and max(others) > OTHERS_WARN:
        busy.append(f"other processes kept {max(others):.2f} cores busy during a timed pass")
    return {
        "speedup": statistics.median(speedups),
        "speedup_min": min(speedups),
        "speedup_max": max(speedups),
        "speedups": speedups,
        "plain_tok_per_s": statistics.median(row["plain_tok_per_s"] for row in rows),
        "hetero_tok_per_s": statistics.median(row["hetero_tok_per_s"] for row in rows),
        "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        "identical_outputs": f"{sum(row['identical_outputs'] for row in rows)}/{n_prompts * len(rows)}",
        "other_cpu_cores_max": max(others) if others else None,
        "busy_machine": busy,
        "rounds": rows,
    }


def report(args: argparse.Namespace, summary: dict[str, Any], n_prompts: int, sample: str) -> None:
    rows = summary["rounds"]
    print(flush=True)
    say(f"==== {args.target} with {args.draft} drafting ({args.algorithm}): {n_prompts} prompts x "
        f"{args.max_tokens} tokens, batch {args.batch_size}, T={args.temperature}, {len(rows)} rounds ====")
    say("round  first   plain tok/s  hetero tok/s  speedup  others' CPU")
    for row in rows:
        say(f"{row['round']:>5}  {row['first']:<6}  {row['plain_tok_per_s']:>11.2f}  {row['hetero_tok_per_s']:>12.2f}  "
            f"{row['speedup']:>6.2f}x  {fmt(row['other_cpu_cores'], '.2f'):>5} cores")
    say(f"plain decoding: {summary['plain_tok_per_s']:.2f} tok/s (median)")
    say(f"hetero ({args.algorithm}, draft dtype {summary['draft_dtype']}): {summary['hetero_tok_per_s']:.2f} tok/s "
        "(median)")
    say(f"speedup {summary['speedup']:.2f}x (median of {len(rows)} rounds; min-max {summary['speedup_min']:.2f}-"
        f"{summary['speedup_max']:.2f}x; per round " + ", ".join(f"{s:.2f}x" for s in summary["speedups"]) + ")"
        + ("  [one round: no spread to judge it by; --rounds 2 or more]" if len(rows) == 1 else ""))
    say(f"acceptance rate {fmt(summary['acceptance_rate'], '.1%')}  mean acceptance length "
        f"{fmt(summary['mean_acceptance_length'], '.2f')}  bridge {fmt(summary['bridge_ms_per_step'], '.2f')} ms/step  "
        f"drafter {fmt(summary['draft_ms_per_step'], '.1f')} ms/step")
    say("draft length chosen per step (k: steps): "
        + ", ".join(f"{k}: {n}" for k, n in summary["draft_lengths"].items()))
    if summary["rules_chosen"] is not None:
        rates = "; ".join(f"{kind}: " + ", ".join(f"{r} {v:.2f}" for r, v in by_rule.items())
                          for kind, by_rule in (summary["rule_rates"] or {}).items() if by_rule)
        say("rule chosen per drafted request-step: " + ", ".join(
            f"{r}: {n}" for r, n in sorted(summary["rules_chosen"].items(), key=lambda x: -x[1]))
            + (f"  (measured tok/s per rule, {rates})" if rates else ""))
    if args.temperature == 0:
        say(f"identical to plain decoding: {summary['identical_outputs']} prompt runs "
            f"({n_prompts} prompts x {len(rows)} rounds)")
    say("sample output: " + json.dumps(sample[:200]))
    starts = summary["engine_start_s"]
    say(f"engine start-ups (not in the tok/s): " + ", ".join(f"{n} {s:.0f} s" for n, s in starts)
        + f"; whole job {summary['wall_s']:.0f} s")
    if summary["busy_machine"]:
        say("WARNING: the machine looks busy: " + "; ".join(summary["busy_machine"]) + ". The speedup is "
            "unreliable; rerun when nothing else runs, or with more --rounds.")


def main() -> None:
    from vllm_hetero_spec.config import ALGORITHMS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b", help="target model folder or short name")
    ap.add_argument("--draft", default="smollm2-135m", help="draft model folder or short name")
    ap.add_argument("--algorithm", default="auto", choices=ALGORITHMS,
                    help="auto: the plugin picks the rule per request from what it measures")
    ap.add_argument("-k", "--num-speculative-tokens", type=int, default=4,
                    help="the most tokens drafted per step (the adaptive budget picks 0..k each step)")
    ap.add_argument("--draft-budget", default="adaptive", choices=("adaptive", "fixed"),
                    help="fixed: always k draft tokens")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=1, help="requests submitted together")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--draft-dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                    help="auto: the target's dtype on CUDA, bfloat16 on a CPU with native bf16, else float32")
    ap.add_argument("--executor", default="inprocess", choices=("inprocess", "ray"),
                    help="ray: draft in a Ray actor on CPU cores, pipelined with the target")
    ap.add_argument("--rounds", type=int, default=2,
                    help="timed rounds, each a pass of every prompt through both engines (default 2: "
                         "3 engine start-ups; 3 rounds: 4)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=512,
                    help="vLLM's token budget per step, which sizes the one forward its start-up profile runs "
                         "(vLLM's CPU default, 4096, costs a 1.5B target minutes on two cores at every start); "
                         "batch-1 decoding does not depend on it. 0: vLLM's default")
    ap.add_argument("--json", help="also write the results, every round's figures included, to this file")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    t_job = time.perf_counter()

    from hetero_harness.models import MODELS, ensure_model
    from hetero_harness.prompts import chat_prompts, spec_bench_questions

    def path(name: str) -> str:
        return str(ensure_model(name)) if name in MODELS else name

    blocks = schedule(args.rounds)
    say(f"target={args.target} draft={args.draft} algorithm={args.algorithm} executor={args.executor} "
        f"k<={args.num_speculative_tokens} budget={args.draft_budget} prompts={args.num_prompts} "
        f"max_tokens={args.max_tokens} batch={args.batch_size} T={args.temperature} rounds={args.rounds}")
    say(f"plan: {len(blocks)} engine start-ups, one engine at a time: "
        + " | ".join(f"{name} (round{'s' if len(rs) > 1 else ''} {', '.join(str(r + 1) for r in rs)})"
                     for name, rs in blocks)
        + ". The first start-up of each engine on a machine compiles for a few minutes; later ones load "
        "the compiled graphs from ~/.cache/vllm.")
    target, draft = path(args.target), path(args.draft)
    prompts = chat_prompts(target, spec_bench_questions(args.num_prompts))
    base = {
        "target": target,
        "prompts": prompts,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "batch_size": args.batch_size,
        "request_seeds": list(range(len(prompts))),
        "n_rounds": args.rounds,
        "max_num_batched_tokens": args.max_num_batched_tokens or None,
    }
    spec = {
        "method": "hetero",
        "model": draft,
        "num_speculative_tokens": args.num_speculative_tokens,
        "algorithm": args.algorithm,
        "draft_dtype": args.draft_dtype,
        "draft_budget": args.draft_budget,
    }
    if args.executor == "ray":
        spec["executor"] = "ray"

    passes: dict[str, dict[int, dict[str, Any]]] = {name: {} for name in ENGINES}
    starts: list[tuple[str, float]] = []
    hetero_procs: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for i, (name, rs) in enumerate(blocks):
        say(f"engine start-up {i + 1}/{len(blocks)}: {name} "
            + ("(the target alone)" if name == "plain" else "(the target with the draft model)")
            + f", round{'s' if len(rs) > 1 else ''} {', '.join(str(r + 1) for r in rs)}")
        job = {**base, "name": name, "rounds": rs}
        if name == "hetero":
            job["speculative_config"] = spec
        result = run_child(job)
        starts.append((name, result["start_s"]))
        if name == "hetero":
            hetero_procs.append(result)
        for r, res in result["passes"].items():
            passes[name][int(r)] = res
        # Rounds now complete, in order.
        while len(rows) < args.rounds and all(len(rows) in passes[n] for n in ENGINES):
            r = len(rows)
            rows.append(round_row(r, passes["plain"][r], passes["hetero"][r], "plain" if r % 2 == 0 else "hetero"))
            row = rows[-1]
            say(f"round {r + 1}/{args.rounds} done: plain {row['plain_tok_per_s']:.2f} tok/s, hetero "
                f"{row['hetero_tok_per_s']:.2f} tok/s, speedup {row['speedup']:.2f}x"
                + (f", identical outputs {row['identical_outputs']}/{len(prompts)}" if args.temperature == 0 else ""))

    summary = summarize(rows, len(prompts))
    summary.update(drafter_figures(hetero_procs))
    summary["engine_start_s"] = starts
    summary["wall_s"] = time.perf_counter() - t_job
    report(args, summary, len(prompts), passes["hetero"][args.rounds - 1]["texts"][0])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "summary": summary}, f, indent=2)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    else:
        main()
