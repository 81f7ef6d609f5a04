"""Do ``advise``'s projections hold on prompts it did not see?

For each target: ``python -m vllm_hetero_spec advise`` on a sample of Spec-Bench (its
table, plot, JSON and config kept in ``results/advise_<target>/``), then a measurement
on held-out Spec-Bench prompts (never in advise's sample, and of the same mix: both are
whole rounds of one question per category, the held-out ones from later rounds), at the
same batch sizes and temperatures, at each output length of ``--check-lengths`` (advise
projects per output length; each is checked against its own projection):

- each projected option as advise configured it: ours pinned to its rule and best k
  (one engine per drafter; a drafter's options projected at k = 0 share one run, as
  nothing drafts), vLLM's ``draft_model`` with its config;
- the config advise recommends, as written;
- plain decoding, before and after: plain [1] | every other engine [1, 2] | plain [2],
  each engine running its consecutive rounds in one process (one engine alive at a
  time, so a large target's memory is freed between them).

Every engine first serves ``--served-before`` other held-out prompts per temperature,
untimed, as a server has before the requests measured: the recommended config learns
(the adaptive budget's warm-up and probes, ``auto``'s comparisons), and a fresh engine
charged its first timed round with that once-in-a-life cost.

A measured speedup is the option's tokens per second over the same round's plain
decoding at the same temperature and batch size; its spread, the range over rounds.
The bar: every projection within 15% of the median measured speedup, or inside the
measured spread where that is wider; the recommended config's measured speedup the best
measured at each setting, or within 5% of it. Options that draft nothing there (pinned
to k = 0) are one configuration run in several engines, so they count as one option, its
speedup the median over all their rounds: the fastest of several engines doing the same
work is their noise, not an option.

A run records the dtype its engines ran the target in (``--dtype auto`` is float32 on a
CPU without native bf16, bf16 on one with it, and a step's prices differ between them):
``--engines`` reads an earlier run's engines only where it ran the same dtype, and
``--reuse-advise`` refuses advise's result measured in another.

    .venv/bin/python benchmarks/advise_check.py                       # every target
    .venv/bin/python benchmarks/advise_check.py --targets qwen2.5-coder-1.5b
    .venv/bin/python benchmarks/advise_check.py --targets qwen2.5-coder-1.5b --reuse-advise  # the check only
    .venv/bin/python benchmarks/advise_check.py --targets qwen2.5-coder-1.5b --reuse-advise \
        --engines recommended   # one engine (and plain) again; the rest from the newest result's run
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from report import meta, ratio_cell, results_dir, table, write_report

from vllm_hetero_spec.advise.analysis import draft_model_label
from vllm_hetero_spec.advise.prompts import as_chat, categories, spec_bench_questions

#: Target -> the drafters advise chooses among: every pair the shipped models make, but
#: for the 1.5B target a cross-family drafter and a same-family one (which also runs as
#: vLLM's ``draft_model``). Gemma 3 270M was its slowest drafter to measure and its
#: weakest (the check of 2026-11-30 in git history), and it kept the 1.5B's advise and
#: check from fitting a working session on a 2-core machine.
PAIRS = {
    "qwen2.5-coder-1.5b": ["smollm2-135m", "qwen2.5-coder-0.5b"],
    "qwen2.5-coder-0.5b": ["smollm2-135m", "gemma3-270m"],
    "gemma3-270m": ["smollm2-135m"],
}
TOLERANCE = 0.15
RECOMMENDED_WITHIN = 0.05


def advise_settings(target: str, args: argparse.Namespace) -> dict[str, Any]:
    """advise's arguments for ``target``, as its JSON records them (``args``)."""
    return {"target": target, "drafters": ",".join(PAIRS[target]), "num_prompts": args.num_prompts,
            "max_tokens": args.max_tokens, "batch_sizes": args.batch_sizes, "temperatures": args.temperatures,
            "k": args.k}


def run_advise(target: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """advise on the sample; its outputs in ``folder`` (the log of vLLM's output removed)."""
    flags = [x for key, value in advise_settings(target, args).items()
             for x in (f"--{key.replace('_', '-')}", str(value))]
    cmd = [sys.executable, "-m", "vllm_hetero_spec", "advise", *flags, "--results-dir", str(folder),
           "--out", str(folder / "config.json")]
    subprocess.run(cmd, check=True)
    (folder / "advise.log").unlink(missing_ok=True)
    return json.loads((folder / "advise.json").read_text())


def reused_advise(target: str, args: argparse.Namespace, folder: Path) -> dict[str, Any] | None:
    """advise's result kept in ``folder`` by an earlier run with the same settings, so a
    check cut short (on a small machine a large target's advise and check together can
    outlast a working session) resumes at the measurement; None where there is none to
    reuse. Its measurements are analysed again by this version of advise, so the check
    tests today's projections and config."""
    path = folder / "advise.json"
    if not path.is_file():
        return None
    advised = json.loads(path.read_text())
    kept = advised["args"]
    differing = {key: (kept.get(key), value) for key, value in advise_settings(target, args).items()
                 if kept.get(key) != value}
    if differing:
        raise SystemExit(f"--reuse-advise: {path} was written with other settings (kept, wanted): {differing}")
    here = target_dtype(advised)
    if advised.get("target_dtype", here) != here:
        raise SystemExit(f"--reuse-advise: {path} measured the target in {advised['target_dtype']}, and this machine "
                         f"runs it in {here}: its projections are not this machine's; run the check without "
                         "--reuse-advise")
    from vllm_hetero_spec.advise.cli import reanalyse

    return reanalyse(folder, str(folder / "config.json"))


def target_dtype(advised: dict[str, Any]) -> str:
    """The dtype this machine's engines run the target in, for advise's settings: a
    speedup measured in bf16 and one in float32 are not one option's (a CPU without
    native bf16 runs the target in float32, and its step prices differ)."""
    from vllm_hetero_spec.advise.cli import engine_dtype

    return engine_dtype(advised["args"]["dtype"])


def check_jobs(target: str, advised: dict[str, Any], prompts: list, args: argparse.Namespace,
               served: list | None = None) -> list[tuple[str, dict[str, Any]]]:
    """The engines of the held-out measurement, in order, each with its runs (pins) and
    the ``served`` prompts it serves, untimed, before them."""
    from vllm_hetero_spec.advise.cli import resolve_model
    from vllm_hetero_spec.advise.session import base_job

    rounds = list(range(args.rounds))
    settings = sorted({(o["temperature"], o["batch"], n) for o in advised["options"] for n in args.check_lengths})
    ran = advised["args"]  # the engines as advise ran them
    base = base_job(str(resolve_model("--target", target).folder), prompts, dtype=target_dtype(advised),
                    max_model_len=ran["max_model_len"], seed=ran["seed"], max_tokens=max(args.check_lengths),
                    k=args.k, batch_sizes=sorted({b for _, b, _ in settings}),
                    temperatures=sorted({t for t, _, _ in settings}),
                    enforce_eager=ran.get("enforce_eager", False)) | {"served": served or []}

    def pins(rows: list[dict[str, Any]], rs: list[int]) -> list[dict[str, Any]]:
        few = {"prompts": args.batch1_prompts} if args.batch1_prompts else {}
        return [{**row, "round": r, **(few if row["b"] == 1 else {})} for r in rs for row in rows]

    plain_rows = [{"T": t, "b": b, "max_tokens": n} for t, b, n in settings]
    jobs = [("plain 1", {**base, "kind": "plain", "first_token": False, "pins": pins(plain_rows, rounds[:1])})]
    for drafter in advised["drafters"]:
        ours = distinct_runs([{"rule": o["rule"], "T": o["temperature"], "b": o["batch"], "k": o["k"], "max_tokens": n}
                              for o in advised["options"] if o["drafter"] == drafter and o["rule"] != "draft_model"
                              for n in args.check_lengths])
        rules = {str(t): sorted({p["rule"] for p in ours if p["T"] == t}) for t in base["temperatures"]}
        jobs.append((f"{drafter} (pinned)", {**base, "kind": "hetero", "drafter": drafter, "rules": rules,
                                             "pins": pins(ours, rounds)}))
    configs = [c for c in advised["recommendation"]["per_drafter"] if c["method"] == "draft_model"]
    recommended = advised["recommendation"]["config"]
    if recommended is not None:
        configs.append({"drafter": "recommended", "config": recommended})
    for c in configs:
        rows = [{"T": t, "b": b, "max_tokens": n} for t, b, n in settings]
        label = "recommended" if c["drafter"] == "recommended" else draft_model_label(c["drafter"])
        jobs.append((label, {**base, "kind": "config", "config": c["config"], "pins": pins(rows, rounds)}))
    if len(rounds) > 1:
        jobs.append(("plain 2", {**base, "kind": "plain", "first_token": False, "pins": pins(plain_rows, rounds[1:])}))
    return jobs


def distinct_runs(pins: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``pins`` with one run per distinct measurement: pinned to k = 0 the engine drafts
    nothing whatever its rule, so the options of one drafter that ``advise`` projected
    at k = 0 share one run per temperature and batch size (the first rule's pin)."""
    seen: dict[tuple, dict[str, Any]] = {}
    for p in pins:
        seen.setdefault((p["T"], p["b"], p.get("max_tokens"), _measurement(p.get("rule"), p["k"])), p)
    return list(seen.values())


def _measurement(rule: str | None, k: int | None) -> tuple:
    """What a pinned run measures: at k = 0 the rule does not matter (nothing drafts);
    ``k`` None is a config as written, which pins nothing."""
    return (k, rule if k != 0 else None)


def speedups(measured: dict[str, dict[str, Any]], label: str, rule: str | None, t: float, b: int, tokens: int,
             k: int | None = None) -> list[float]:
    """Per round, ``label``'s tokens per second at (``rule``, ``t``, ``b``, ``k``) and
    ``tokens`` per request over plain's; ``k`` = 0 takes the run of any rule
    (:func:`distinct_runs`)."""
    def at(r: dict[str, Any]) -> bool:
        return r["T"] == t and r["b"] == b and r.get("max_tokens") == tokens

    plain = {r["round"]: sum(r["lengths"]) / r["wall"] for m in ("plain 1", "plain 2") if m in measured
             for r in measured[m]["runs"] if at(r)}
    return [sum(r["lengths"]) / r["wall"] / plain[r["round"]] for r in measured[label]["runs"]
            if at(r) and r["round"] in plain
            and _measurement(r.get("rule"), r.get("k") if k is not None else None) == _measurement(rule, k)]


def verdicts(advised: dict[str, Any], runs: list[dict[str, dict[str, Any]]], lengths: list[int]
             ) -> tuple[list[dict], list[dict], list[dict]]:
    """One row per projected option and output length (projected, measured median and
    spread, within the bar?), one per setting and length for the recommended config, and
    the options no run measured. ``runs``: the sessions of one or more runs of the check,
    newest first; an engine is read from the newest run that has it, against that run's
    own plain engines."""
    def newest(label: str) -> dict[str, dict[str, Any]] | None:
        return next((m for m in runs if label in m), None)

    rows, missing = [], []
    for o in advised["options"]:
        dm = o["rule"] == "draft_model"
        label = draft_model_label(o["drafter"]) if dm else f"{o['drafter']} (pinned)"
        rule, k = (None, None) if dm else (o["rule"], o["k"])
        measured = newest(label)
        for n in lengths:
            xs = [] if measured is None else speedups(measured, label, rule, o["temperature"], o["batch"], n, k)
            if not xs:
                missing.append({**{key: o[key] for key in ("drafter", "rule", "temperature", "batch", "k")},
                                "tokens": n})
                continue
            med, projected = statistics.median(xs), o["by_length"][str(n)]
            ok = abs(projected / med - 1) <= TOLERANCE or min(xs) <= projected <= max(xs)
            rows.append({"drafter": o["drafter"], "rule": o["rule"], "T": o["temperature"], "b": o["batch"],
                         "tokens": n, "k": o["k"], "projected": projected, "measured": med, "low": min(xs),
                         "high": max(xs), "per_round": xs, "ok": ok})
    rec_rows = []
    measured = newest("recommended")
    if measured is not None:
        for t, b, n in sorted({(r["T"], r["b"], r["tokens"]) for r in rows}):
            xs = speedups(measured, "recommended", None, t, b, n)
            if not xs:  # a check cut short before this setting's run
                continue
            best, name = best_option([r for r in rows if (r["T"], r["b"], r["tokens"]) == (t, b, n)])
            med = statistics.median(xs)
            rec_rows.append({"T": t, "b": b, "tokens": n, "measured": med, "low": min(xs), "high": max(xs),
                             "best_option": best, "best_name": name, "ok": med >= (1 - RECOMMENDED_WITHIN) * best})
    return rows, rec_rows, missing


def best_option(rows: list[dict[str, Any]]) -> tuple[float, str]:
    """The best measured option of one setting's ``rows`` and its name. The options that
    draft nothing (k = 0) are one configuration measured in several engines: they count
    once, at the median over all their rounds (one engine's k = 0 options share a run,
    :func:`distinct_runs`, so each engine's rounds count once)."""
    def name(r: dict[str, Any]) -> str:
        return f"{r['drafter']} {r['rule']}" + ("" if r["rule"] == "draft_model" else f" k={r['k']}")

    drafting = [(r["measured"], name(r)) for r in rows if r["k"] != 0]
    idle = {r["drafter"]: r["per_round"] for r in rows if r["k"] == 0}
    if idle:
        pooled = statistics.median([x for xs in idle.values() for x in xs])
        drafting.append((pooled, f"drafting nothing ({len(idle)} engine{'s' if len(idle) > 1 else ''})"))
    return max(drafting)


def slim(measured: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The sessions' results without their per-step logs (advise's own JSON keeps its)."""
    return {label: {**m, "runs": [{k: v for k, v in r.items() if k != "steps"} for r in m["runs"]]}
            for label, m in measured.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    ap.add_argument("--num-prompts", type=int, default=13, help="advise's sample (13: a round of Spec-Bench)")
    ap.add_argument("--held-out", type=int, default=13, help="prompts of the check, from the rounds after the sample's")
    ap.add_argument("--batch1-prompts", type=int,
                    help="the first N held-out prompts only at batch 1 (default: every one): a large target "
                         "at 256 tokens, one request at a time, outlasts a working session on a small machine")
    ap.add_argument("--max-tokens", type=int, default=48, help="advise's tokens per request on its sample")
    ap.add_argument("--check-lengths", type=int, nargs="+", default=[64, 256],
                    help="output tokens per request of the check, each against advise's projection at it")
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--k", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--served-before", type=int, default=1, metavar="N",
                    help="held-out prompts (past the check's) each engine serves per temperature, untimed, "
                         "before its runs")
    ap.add_argument("--reuse-advise", action="store_true",
                    help="take advise's result already in results/advise_<target>/ (same settings) "
                         "instead of rerunning it")
    ap.add_argument("--engines", nargs="+", metavar="LABEL",
                    help="run only these engines of the check (with plain 1 and 2), e.g. 'recommended' "
                         "'qwen2.5-coder-0.5b (pinned)'; the others are read from the newest result's run, "
                         "each against that run's plain engines")
    args = ap.parse_args()
    from tqdm import tqdm

    from vllm_hetero_spec.advise.cli import run_session
    from vllm_hetero_spec.advise.session import planned_calls

    first_round = -(-args.num_prompts // categories())
    questions = as_chat(spec_bench_questions(args.held_out + args.served_before, first_round=first_round))
    prompts, served = questions[:args.held_out], questions[args.held_out:]
    results = {"meta": meta(args), "targets": earlier_targets()}
    for target in args.targets:
        folder = results_dir() / f"advise_{target}"
        advised = reused_advise(target, args, folder) if args.reuse_advise else None
        if advised is None:
            shutil.rmtree(folder, ignore_errors=True)
            advised = run_advise(target, args, folder)
        jobs = check_jobs(target, advised, prompts, args, served)
        dtype = target_dtype(advised)
        earlier = []
        if args.engines is not None:
            unknown = set(args.engines) - {label for label, _ in jobs}
            if unknown:
                raise SystemExit(f"--engines {sorted(unknown)}: not engines of this check: {[x for x, _ in jobs]}")
            kept = {label for label, _ in jobs if label not in args.engines and not label.startswith("plain")}
            earlier = earlier_runs(results["targets"].get(target), kept, dtype)
            jobs = [(label, job) for label, job in jobs if label.startswith("plain") or label in args.engines]
        log = Path(f"/tmp/advise_check_{target}.log")
        log.write_text("")
        measured = {}
        with tqdm(total=sum(planned_calls(j) for _, j in jobs), unit="pass") as bar:
            for label, job in jobs:
                measured[label] = run_session(label, job, log, bar)
                # Written after each engine: a check cut short keeps what it measured, and
                # `--engines` resumes it with the engines it lacks.
                rows, rec_rows, missing = verdicts(advised, [measured, *[run["measured"] for run in earlier]],
                                                   args.check_lengths)
                this_run = {"meta": meta(args, target_dtype=dtype), "order": list(measured), "measured": slim(measured)}
                results["targets"][target] = {**this_run, "rows": rows, "recommended": rec_rows,
                                              "not_measured": missing, "recommendation": advised["recommendation"],
                                              "earlier_runs": earlier}
                write(results)


def earlier_runs(newest: dict[str, Any] | None, wanted: set[str], dtype: str) -> list[dict[str, Any]]:
    """The runs of the newest result for this target (its own first, then those it
    read) that ran the target in ``dtype``, each with the ``wanted`` engines it is the
    newest to have measured, and its plain engines; runs left with none are dropped. A
    run in another dtype, or one that did not record it, is never read: its options
    would be set beside this machine's recommended config as if measured alike."""
    if newest is None:
        return []
    runs = [{key: newest[key] for key in ("meta", "order", "measured") if key in newest},
            *newest.get("earlier_runs", [])]
    out, taken = [], set()
    for run in runs:
        if run.get("meta", {}).get("target_dtype") != dtype:
            continue
        mine = {label for label in run.get("measured", {}) if label in wanted - taken}
        if mine:
            taken |= mine
            out.append({**run, "measured": {label: m for label, m in run["measured"].items()
                                            if label in mine or label.startswith("plain")}})
    return out


def earlier_targets() -> dict[str, Any]:
    """The targets of the newest result, each as its own run left it: a run of some
    targets replaces theirs and keeps the others'."""
    path = results_dir() / "advise_check.json"
    if not path.is_file():
        return {}
    return json.loads(path.read_text())["targets"]


def settings_line(m: dict[str, Any]) -> str:
    a = m["args"]
    at_one = f" ({a['batch1_prompts']} at batch 1)" if a.get("batch1_prompts") else ""
    dtype = f", the target in {m['target_dtype']}" if m.get("target_dtype") else ""
    return (f"{m['date']}{dtype}: advise on {a['num_prompts']} prompts, checked on {a['held_out']} held-out "
            f"ones{at_one}, {a['max_tokens']} tokens on the sample, {a.get('check_lengths', [a['max_tokens']])} "
            f"held out, T {a['temperatures']}, batch {a['batch_sizes']}, k <= {a['k']}, "
            f"{a['rounds']} rounds" + (f", each engine serving {a['served_before']} other held-out prompt(s) per "
                                       "temperature first, untimed" if a.get("served_before") else "") + ".")


def write(results: dict[str, Any]) -> None:
    md = ["advise's projections (on its sample of Spec-Bench) against speedups measured on held-out Spec-Bench "
          "prompts, over plain decoding in the same round: median [min-max] over rounds. Bar: within "
          f"{TOLERANCE:.0%} or inside the spread; the recommended config within {RECOMMENDED_WITHIN:.0%} of the "
          "best measured option.", ""]
    for target, r in results["targets"].items():
        md += [f"## {target}", "", settings_line(r["meta"]), ""]
        md += table(["drafter", "rule", "T", "b", "tokens", "k", "projected", "measured", "within bar"],
                    [[x["drafter"], x["rule"], f"{x['T']:g}", x["b"], x.get("tokens", "-"), x["k"],
                      f"{x['projected']:.2f}x",
                      ratio_cell(x["measured"], x["low"], x["high"]), "yes" if x["ok"] else "**no**"]
                     for x in r["rows"]])
        if r["recommended"]:
            md += ["", f"Recommended: `{json.dumps(r['recommendation']['config'])}`", ""]
            md += table(["T", "b", "tokens", "measured", "best option measured", f"within {RECOMMENDED_WITHIN:.0%}"],
                        [[f"{x['T']:g}", x["b"], x.get("tokens", "-"), ratio_cell(x["measured"], x["low"], x["high"]),
                          f"{x['best_option']:.2f}x" + (f" ({x['best_name']})" if x.get("best_name") else ""),
                          "yes" if x["ok"] else "**no**"] for x in r["recommended"]])
        if r.get("order"):
            md += ["", "Engine order of this run: " + " | ".join(r["order"]) + "."]
        for run in r.get("earlier_runs", []):
            read = [label for label in run["measured"] if not label.startswith("plain")]
            if read:
                md += ["", f"Read from the run of {run['meta']['date']} (the target in {run['meta']['target_dtype']}, "
                       "against its own plain engines): "
                       + ", ".join(read) + "."]
        if r.get("not_measured"):
            md += ["", "Not measured: " + ", ".join(
                f"{o['drafter']} {o['rule']} T={o['temperature']:g} b={o['batch']} k={o['k']} "
                f"{o.get('tokens', '-')} tokens"
                for o in r["not_measured"]) + "."]
        md.append("")
    write_report("advise_check", results, md, title="advise_check: projections against held-out measurements")


if __name__ == "__main__":
    main()
