"""The defaults against every lossless rule alone, plain decoding and vLLM's built-in TLI.

Per cell (target x batch size x temperature), each configuration runs in its own engine
with default settings: plain decoding, ours with ``algorithm: auto`` (the default), ours
with each lossless rule alone (``--rules``), and vLLM's built-in heterogeneous TLI
(``draft_model`` with ``use_heterogeneous_vocab``, k = 4). Runs are interleaved -- every
configuration of every cell once, then the whole round again (``--repeats``), each round
starting one configuration later -- so a slow patch of a shared machine does not land on
one configuration, nor a drift on the same neighbours every round; the median is
reported with the spread (min-max over the repeats).

Prompts are held out: Spec-Bench questions past the first ``--skip`` (the ones tests
and earlier benchmarks use), of at most 1,200 characters, in the target's chat template.

    .venv/bin/python benchmarks/defaults.py                       # the whole matrix (hours)
    .venv/bin/python benchmarks/defaults.py --targets qwen2.5-coder-1.5b --batch-sizes 1
    # the defaults as a commit shipped them, beside today's, in the same rounds:
    git worktree add /tmp/before REV && .venv/bin/python benchmarks/defaults.py --before /tmp/before
    # every cell of a target in one engine per configuration and round (a start costs minutes):
    .venv/bin/python benchmarks/defaults.py --targets qwen2.5-coder-1.5b --batch-sizes 1 8 --one-engine

Writes benchmarks/results/<name>.{json,md,png} after every run (a cut-off run keeps
what it measured; ``--append`` adds rounds to an existing file). ``--store`` then merges
the run's cells into the defaults matrix's store and rebuilds its table (``matrix.py``).
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import matrix
from config_names import BUILTIN, RULES, by_configuration
from report import appended_meta, figure, fmt, median, range_cell, read_result, runs_cell, spread, table, write_report
from report import meta as run_meta

from hetero_harness.evaluation import run_isolated
from hetero_harness.models import MODELS, ensure_model
from hetero_harness.prompts import MAX_CHARS, chat_prompts, held_out_questions

NAME = "defaults"


SYNC_PLAIN = "plain, no async scheduling"
BEFORE = "auto, before"
#: Runs once labelled BEFORE that imported the current plugin (docs/benchmarks.md): the defaults again.
SECOND = "auto, second engine"
#: A phase key: the engine serves it, untimed, before the cells (``--served-before``).
UNTIMED = "untimed"


def configs(draft: str, rules: list[str], builtin: bool, plain: bool = True, plain_sync: bool = False,
            auto_variants: tuple[tuple[str, dict], ...] = (), auto: bool = True,
            before: str | None = None,
            others: tuple[tuple[str, dict], ...] = ()) -> list[tuple[str, dict | None, dict]]:
    """The configurations of one cell: (name, speculative config, extra job keys).

    ``auto_variants`` adds ``auto`` with each (label, settings) pair's settings over the
    defaults (``--draft-dtypes`` and ``--auto-variant``). ``plain_sync`` adds plain decoding with async
    scheduling off, as vLLM 0.32.0 runs every engine with our proposer (it keeps async
    scheduling for its own methods only): what the speculative path costs where nothing
    drafts, minus what the scheduling mode costs. ``auto=False`` leaves ``auto`` out (a
    cell measured before gets a configuration it lacked, beside plain run again). ``before``:
    a checkout of an earlier commit, whose ``auto`` runs as that commit shipped it (its
    plugin first on the engine's path, extra key ``env``; the harness stays this one's, which
    runs ``--one-engine``'s phases). ``others``: (label, speculative
    config) pairs run as given (``--config``: vLLM's ``draft_model`` with a same-family
    drafter, or ours with another drafter)."""
    ours = {"method": "hetero", "model": draft, "num_speculative_tokens": 4}
    out: list[tuple[str, dict | None, dict]] = [("plain", None, {})] if plain else []
    if plain_sync:
        out.append((SYNC_PLAIN, None, {"async_scheduling": False}))
    if auto:
        out.append(("auto", {**ours, "algorithm": "auto"}, {}))
    if before:
        out.append((BEFORE, {**ours, "algorithm": "auto"}, {"env": {"PYTHONPATH": before}}))
    out += [(f"auto, {label}", {**ours, "algorithm": "auto", **settings}, {}) for label, settings in auto_variants]
    out += [(rule, {**ours, "algorithm": rule}, {}) for rule in rules]
    out += [(label, spec, {}) for label, spec in others]
    if builtin:
        out.append((BUILTIN, {"method": "draft_model", "model": draft, "num_speculative_tokens": 4,
                              "use_heterogeneous_vocab": True}, {}))
    return out


def auto_variant(text: str, flag: str = "--auto-variant") -> tuple[str, dict]:
    """``LABEL=JSON`` as (label, settings); the label may hold ``=`` itself (``fixed k=2``):
    the settings start at the first ``={``."""
    label, sep, settings = text.partition("={")
    try:
        parsed = json.loads("{" + settings) if sep else None
    except json.JSONDecodeError as err:
        raise SystemExit(f"{flag} {text!r}: the settings are not JSON ({err})") from None
    if not label or not isinstance(parsed, dict):
        raise SystemExit(f"{flag} {text!r}: expected LABEL=JSON object, e.g. 'fixed k=2={{\"draft_budget\": "
                         "\"fixed\", \"num_speculative_tokens\": 2}'")
    return label, parsed


def resolve(model: str) -> str:
    """A model's folder for a short name set-up builds (vLLM's own methods need a path), else ``model``."""
    return str(ensure_model(model)) if model in MODELS else model


def seeds_work(batch_size: int, temperature: float) -> bool:
    """Whether a cell can seed its requests on vLLM 0.32.0's CPU build.

    When a seeded request's prefill is chunked (32 prompts overflow one step's token
    budget), vLLM's runner rewinds the request's generator with ``set_offset``, which a
    CPU generator does not support: the engine dies, plain decoding too. Such cells run
    unseeded (recorded per run); greedy rows use no generator.
    """
    return temperature == 0 or batch_size < 32


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", nargs="+", default=["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma3-270m"])
    ap.add_argument("--draft", default="smollm2-135m")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--rules", nargs="*", default=list(RULES), help="lossless rules run alone")
    ap.add_argument("--rules-at-t1", nargs="*", default=None,
                    help="the rules run alone at T > 0 (default: --rules)")
    ap.add_argument("--no-builtin", action="store_true")
    ap.add_argument("--draft-dtypes", nargs="*", default=[],
                    help="also run auto with each of these draft dtypes set (auto picks one itself)")
    ap.add_argument("--auto-variant", action="append", default=[], metavar="LABEL=JSON",
                    help='also run auto with these settings, e.g. \'slem only={"auto_greedy": ["slem"]}\'')
    ap.add_argument("--config", action="append", default=[], metavar="LABEL=JSON",
                    help="also run this whole speculative config, a model's short name resolved to its folder, e.g. "
                         '\'draft_model 0.5b={"method": "draft_model", "model": "qwen2.5-coder-0.5b", '
                         '"num_speculative_tokens": 4}\'')
    ap.add_argument("--plain-sync", action="store_true",
                    help="also run plain decoding with async scheduling off (as every engine of ours runs)")
    ap.add_argument("--no-plain", action="store_true",
                    help="leave plain decoding out (with --append: the cell's earlier plain runs are the baseline)")
    ap.add_argument("--no-auto", action="store_true",
                    help="leave auto out (with --append: add a configuration a cell lacked, e.g. the built-in)")
    ap.add_argument("--before", metavar="DIR",
                    help="also run auto from this checkout of an earlier commit (git worktree add DIR REV)")
    ap.add_argument("--one-engine", action="store_true",
                    help="each configuration runs every cell of a target in one engine per round (the batch sizes "
                         "and temperatures in the order given), as one served engine meets them: one start instead "
                         "of one per cell; the adaptive budget carries what it learnt into the next cell")
    ap.add_argument("--batch1-prompts", type=int, default=6, help="prompts run one at a time at batch 1")
    ap.add_argument("--served-before", type=int, default=0, metavar="N",
                    help="with --one-engine: each engine first serves N other held-out prompts one at a time per "
                         "temperature, untimed, as a server has served requests before the ones measured")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="auto",
                    help="the target's dtype; auto: what vLLM runs where the CPU has native bf16, else float32 "
                         "(as advise measures), recorded resolved in the result's meta")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--skip", type=int, default=40, help="Spec-Bench questions to skip (used elsewhere)")
    ap.add_argument("--name", default=NAME)
    ap.add_argument("--append", action="store_true")
    ap.add_argument("--render", action="store_true",
                    help="only draw the table and figure again from the result's JSON (--name), running nothing")
    ap.add_argument("--store", action="store_true",
                    help="when the run ends, merge its cells into the defaults matrix's store (each configuration "
                         "it measured beside plain decoding replaces the store's) and rebuild defaults_matrix.md; "
                         "for runs on the store's machine only (matrix.MACHINE)")
    args = ap.parse_args()
    if args.render:
        previous = read_result(args.name)
        write(previous["runs"], previous["meta"], args.name)
        plot(previous["runs"], args.name)
        return
    if args.one_engine and args.rules_at_t1 is not None:
        ap.error("--one-engine runs every temperature in one engine: --rules-at-t1 cannot differ from --rules")

    draft = str(ensure_model(args.draft))
    targets = {t: str(ensure_model(t)) for t in args.targets}
    if args.served_before and not args.one_engine:
        ap.error("--served-before needs --one-engine: it warms the engine that serves the cells")
    timed = max(args.batch_sizes + [args.batch1_prompts])
    questions = held_out_questions(timed + args.served_before, args.skip)
    from vllm_hetero_spec.advise.cli import engine_dtype

    args.dtype = engine_dtype(args.dtype)  # the meta records what ran, not "auto"
    meta = run_meta(args)
    runs: list[dict] = []
    if args.append:
        previous = read_result(args.name)
        runs, meta = previous["runs"], appended_meta(previous["meta"], meta)
    variants = (*((f"{dtype} drafter", {"draft_dtype": dtype}) for dtype in args.draft_dtypes),
                *(auto_variant(v) for v in args.auto_variant))
    others = tuple((label, {**spec, "model": resolve(spec["model"])} if "model" in spec else spec)
                   for label, spec in (auto_variant(v, "--config") for v in args.config))
    cells = [(t, bs, temp) for t in args.targets for bs in args.batch_sizes for temp in args.temperatures]
    first = 1 + max((r.get("repeat", -1) for r in runs), default=-1)  # --append: rounds go on counting

    def order(rules: list[str]) -> list[tuple[str, dict | None, dict]]:
        return configs(draft, rules, not args.no_builtin, not args.no_plain, args.plain_sync, variants,
                       not args.no_auto, args.before, others)

    @functools.cache
    def prompts(target: str, n: int) -> list[str]:
        """The first ``n`` questions in ``target``'s chat template (its tokenizer loaded once)."""
        return chat_prompts(targets[target], questions[:n])

    def phase(target: str, bs: int, temp: float, shape_seen: bool = False) -> dict:
        """The job keys of one cell: a batch runs once untimed first, unless its engine has
        run that batch size already (``shape_seen``)."""
        n = bs if bs > 1 else args.batch1_prompts
        seeded = seeds_work(bs, temp)
        return {"prompts": prompts(target, n), "temperature": temp, "batch_size": bs,
                "request_seeds": list(range(n)) if seeded else None,
                "warmup": "full" if bs > 1 and not shape_seen else True}

    def engine_phases(target: str) -> list[dict]:
        """A target's cells for one engine, in order, after the untimed phases of
        :func:`served_before`."""
        mine = [(bs, temp) for t, bs, temp in cells if t == target]
        return served_before(target) + [phase(target, bs, temp, any(b == bs for b, _ in mine[:i]))
                                        for i, (bs, temp) in enumerate(mine)]

    @functools.cache
    def served_before(target: str) -> list[dict]:
        """``--served-before``'s phases: the held-out questions past the timed ones."""
        return served_phases(chat_prompts(targets[target], questions[timed:]), args.temperatures)

    def run(target: str, name: str, spec: dict | None, extra: dict, rep: int, phases: list[dict]) -> None:
        """One engine: the configuration ``name`` on ``phases`` (cells), each recorded as a run."""
        extra = dict(extra)
        env = extra.pop("env", None)
        job = {"target": targets[target], "dtype": args.dtype, "max_tokens": args.max_tokens,
               "speculative_config": spec, "ignore_eos": True,
               "max_num_seqs": max(max(p["batch_size"] for p in phases), 16), **extra}
        job = {**job, **phases[0]} if len(phases) == 1 else {**job, "phases": phases}
        t0 = time.time()
        try:
            out = run_isolated(job, env=env)
        except Exception as err:  # one failing configuration must not lose the round
            for p in (p for p in phases if not p.get(UNTIMED)):
                print(f"{target} bs={p['batch_size']} T={p['temperature']} {name}: FAILED {err}", flush=True)
                runs.append({"target": target, "batch_size": p["batch_size"], "temperature": p["temperature"],
                             "config": name, "error": str(err)[-500:]})
            write(runs, meta, args.name)
            return
        for p, result in timed_results(phases, out.get("phases", [out])):
            runs.append(record(result, target, p, name, rep, time.time() - t0, shared=len(phases) > 1))
            print(f"{target} bs={p['batch_size']} T={p['temperature']} {name} rep={rep}: "
                  f"{result['tok_per_s']:.2f} tok/s rules={result.get('rules_chosen')} "
                  f"k={result.get('draft_lengths')} ({time.time() - t0:.0f}s wall)", flush=True)
        write(runs, meta, args.name)

    for rep in range(first, first + args.repeats):
        if args.one_engine:
            for target in args.targets:
                configurations = order(args.rules)
                shift = rep % len(configurations)  # each round starts one configuration later
                for name, spec, extra in configurations[shift:] + configurations[:shift]:
                    run(target, name, spec, extra, rep, engine_phases(target))
            continue
        for target, bs, temp in cells:
            rules = args.rules if temp == 0 or args.rules_at_t1 is None else args.rules_at_t1
            configurations = order(rules)
            shift = rep % len(configurations)  # each round starts one configuration later
            for name, spec, extra in configurations[shift:] + configurations[:shift]:
                run(target, name, spec, extra, rep, [phase(target, bs, temp)])
    plot(runs, args.name)
    print(to_markdown(runs, meta))
    if args.store:
        print(matrix.add_and_build([args.name]))


def served_phases(prompts: list[str], temperatures: list[float]) -> list[dict]:
    """Untimed phases an engine serves before its cells (``--served-before``): per
    temperature, ``prompts`` one at a time. An engine's first minute differs from the
    rest of its life: on a CPU each new step shape builds its kernels once, and the
    adaptive budget runs its warm-up and first probes. A cell's own warm-up (4 tokens)
    covers a fixed k's one shape only, so without these the first cell charged the
    budget alone for the engine's start. ``prompts`` must not be the cells' own."""
    return [{"prompts": prompts, "temperature": temp, "batch_size": 1, "request_seeds": None, "warmup": True,
             UNTIMED: True} for temp in temperatures] if prompts else []


def timed_results(phases: list[dict], results: list[dict]) -> list[tuple[dict, dict]]:
    """Each timed phase with its result (an engine's untimed phases dropped)."""
    return [(p, r) for p, r in zip(phases, results, strict=True) if not p.get(UNTIMED)]


def record(result: dict, target: str, phase: dict, name: str, rep: int, wall_s: float, shared: bool) -> dict:
    """One run's row: a cell's result and what it ran under (``shared``: its engine
    served other cells of the round before or after it; ``wall_s`` then is the engine's
    wall time so far)."""
    return {
        "target": target, "batch_size": phase["batch_size"], "temperature": phase["temperature"], "config": name,
        "repeat": rep, "seeded": phase["request_seeds"] is not None, "shared_engine": shared,
        "tok_per_s": result["tok_per_s"], "acceptance_rate": result["acceptance_rate"],
        "mean_acceptance_length": result["mean_acceptance_length"],
        "draft_lengths": result.get("draft_lengths"), "exploration": result.get("exploration"),
        "target_curve": result.get("target_curve"), "sampled_target_curve": result.get("sampled_target_curve"),
        "rules_chosen": result.get("rules_chosen"),
        "rule_rates": result.get("rule_rates"), "draft_dtype": result.get("draft_dtype"),
        "elapsed_s": result["elapsed_s"], "runner_s": result.get("runner_s"),
        "wall_s": wall_s,
    }


def write(runs: list[dict], meta: dict, name: str) -> None:
    """The JSON and the table so far, after every run (a failed one too)."""
    write_report(name, {"meta": meta, "runs": runs}, to_markdown(runs, meta))


def summarize(runs: list[dict]) -> list[dict]:
    """Per (cell, configuration): the median tok/s, its spread, and ratios to plain."""
    rows = []
    for key, group in by_configuration(runs).items():
        mine = [r for r in group if "error" not in r]
        failed = len(group) - len(mine)
        tps = [r["tok_per_s"] for r in mine]
        rows.append({"target": key[0], "batch_size": key[1], "temperature": key[2], "config": key[3],
                     "runs": tps, "tok_per_s": median(tps), "failed": failed,
                     "acceptance_rate": median([r["acceptance_rate"] for r in mine]),
                     "rules_chosen": mine[-1].get("rules_chosen") if mine else None})
    for row in rows:
        cell = [r for r in rows if (r["target"], r["batch_size"], r["temperature"]) ==
                (row["target"], row["batch_size"], row["temperature"])]
        plain = next((r for r in cell if r["config"] == "plain"), None)
        base = plain["tok_per_s"] if plain else None
        row["speedup"] = row["tok_per_s"] / base if base and row["tok_per_s"] else None
        row["spread"] = spread(row["runs"], base)
    return rows


def to_markdown(runs: list[dict], meta: dict) -> str:
    a = meta["args"]
    lines = [
        f"Draft {a['draft']}, targets in {a.get('dtype', 'float32')}, k <= 4, default settings otherwise; "
        f"{a['max_tokens']} tokens per request (EOS ignored); held-out Spec-Bench prompts "
        f"(past the first {a['skip']}, <= {MAX_CHARS} characters); "
        f"batch 1 runs {a['batch1_prompts']} prompts one at a time, larger batches run the job once untimed first. "
        "Each configuration in its own engine; rounds interleaved, each starting one configuration later; "
        "speedup = median tok/s over plain's median, "
        "spread = min-max of the runs over plain's median. `benchmarks/defaults.py`; machine: "
        f"{meta['machine']}, {meta['date']}.",
        *(["", meta["note"]] if meta.get("note") else []),
        *(["", "One engine per configuration per round served all of a target's cells, in the order the table "
           "lists them (`--one-engine`): the budget carried what it learnt from one cell into the next, as in "
           "a served engine; a batch size's second cell skipped the untimed run (its engine had run that "
           "batch size)."] if any(r.get("shared_engine") for r in runs) else []),
        *(["", f"Before its cells, each engine served {a['served_before']} other held-out prompt(s) one at a "
           "time per temperature, untimed (`--served-before`): the cells measure a running engine, its new "
           "shapes built and the budget's warm-up done."] if a.get("served_before") else []),
        *(["", "Cells marked unseeded run T > 0 without request seeds: vLLM 0.32.0's CPU build cannot "
           "rewind a seeded generator when a prefill is chunked (`seeds_work`)."]
          if any(not seeds_work(r["batch_size"], r["temperature"]) for r in runs) else []),
        "",
    ]
    rows = []
    for r in summarize(runs):
        chosen = r["rules_chosen"]
        rules = "-" if not chosen else " ".join(f"{k}:{v}" for k, v in sorted(chosen.items(), key=lambda x: -x[1]))
        runs_txt = runs_cell(r["runs"]) + (f" ({r['failed']} failed)" if r["failed"] else "")
        seeds = "" if seeds_work(r["batch_size"], r["temperature"]) else " (unseeded)"
        rows.append([r["target"], r["batch_size"], f"{r['temperature']}{seeds}", r["config"], runs_txt,
                     f"{fmt(r['speedup'], '.2f')}x", range_cell(*(r["spread"] or (None, None))),
                     fmt(r["acceptance_rate"], ".1%"), rules])
    lines += table(["target", "batch", "T", "configuration", "tok/s (runs)", "speedup", "spread", "acceptance",
                    "rules chosen (auto)"], rows)
    return "\n".join(lines + defaults_gap(runs) + budget_split(runs) + target_curve(runs) + time_split(runs)) + "\n"


def budget_split(runs: list[dict]) -> list[str]:
    """What the budget chose and what exploring cost, per configuration that reports it:
    the steps at each draft length (summed over its runs), and the adaptive budget's
    exploration (steps planned before its costs were known, probes, the loss the model
    expected of them, probe slots skipped), so that a configuration that trails another
    shows whether it drafted other lengths or paid to explore."""
    rows = []
    for key, mine in by_configuration([r for r in runs if "error" not in r and r.get("draft_lengths")]).items():
        steps: dict[int, int] = {}
        for r in mine:
            for k, n in r["draft_lengths"].items():
                steps[int(k)] = steps.get(int(k), 0) + n
        total = sum(steps.values()) or 1
        lengths = " ".join(f"{k}:{n / total:.0%}" for k, n in sorted(steps.items()))
        found = [r["exploration"] for r in mine if r.get("exploration")]
        if found:
            warmup, probes, skipped = (sum(e[f] for e in found) for f in ("warmup", "probes", "skipped"))
            loss = sum(e["probe_loss_s"] for e in found) / sum(r["elapsed_s"] for r in mine)
            explored = f"{warmup} / {probes} / {loss:.1%} / {skipped}"
        else:
            explored = "-"
        rows.append([*key, total, lengths, explored])
    if not rows:
        return []
    return ["", "The budget's draft lengths (share of steps at each k, over the runs) and its exploration "
            "(warm-up steps / probes / their expected loss, as a share of the timed seconds / probe slots "
            "skipped):", "",
            *table(["target", "batch", "T", "configuration", "steps", "draft lengths", "exploration"], rows)]


def target_curve(runs: list[dict]) -> list[str]:
    """The target's step time per step size at batch 1, as the adaptive budget priced it
    when each cell ended (medians over the rounds) and as the configurations that run one
    size took it (plain decoding: 1 token; fixed k: k + 1, over the steps at its most
    frequent length), so that a default trailing a fixed k shows whether it priced the
    steps wrong: the budget chooses k from this curve."""
    rows: list[list] = []
    done = [r for r in runs if "error" not in r and r["batch_size"] == 1]
    largest = 1 + max((int(k) for r in done for k in r.get("draft_lengths") or {}), default=0)  # a batch-1 step
    for key, mine in by_configuration(done).items():
        curves = [r["target_curve"] for r in mine if r.get("target_curve")]
        timed = [r for r in mine if r.get("runner_s")]
        if curves:
            prices: dict[int, list[float]] = {}
            for curve in curves:
                for t, (ms, priced) in curve.items():
                    if priced and int(t) <= largest:
                        prices.setdefault(int(t), []).append(ms)
            rows.append([*key, "priced", {t: median(v) for t, v in prices.items()}])
        elif key[3] == "plain" and timed:
            steps = [r["tok_per_s"] * r["elapsed_s"] for r in timed]  # one token a step
            rows.append([*key, "ran", {1: median([1e3 * r["runner_s"]["execute_model"] / n
                                                  for r, n in zip(timed, steps)])}])
        elif timed and all(r.get("draft_lengths") for r in timed):
            k = int(max(timed[0]["draft_lengths"], key=timed[0]["draft_lengths"].get))
            steps = [sum(r["draft_lengths"].values()) for r in timed]
            rows.append([*key, "ran", {k + 1: median([1e3 * r["runner_s"]["execute_model"] / n
                                                      for r, n in zip(timed, steps)])}])
    if not any(row[4] == "priced" for row in rows):
        return []
    sizes = sorted({t for row in rows for t in row[5]})
    return ["", "The target's step at batch 1, ms per step of each size (tokens verified): as the budget priced "
            "it when each cell ended (sizes priced from steps of their own; medians over the rounds), and as the "
            "runs of one size took it (`execute_model` over their steps):", "",
            *table(["target", "batch", "T", "configuration", "", *map(str, sizes)],
                   [[*row[:5], *(fmt(row[5].get(t), ".0f") for t in sizes)] for row in rows])]


def defaults_gap(runs: list[dict]) -> list[str]:
    """Per cell, the shipped defaults (``auto``) against the configuration they trail
    most (plain decoding, ``auto, before`` and a second engine of ``auto`` aside), round
    by round: the two runs of a round share the machine's state that hour, so their
    ratio is steadier than the ratio of medians, and the rival is the one whose median
    ratio is lowest -- picked by its own median instead, a rival could win on a round
    the defaults did not run. Beside it, plain decoding's own spread over the rounds,
    the machine's noise that a gap must exceed to mean anything."""
    by_cell: dict[tuple, dict[str, dict[int, float]]] = {}  # cell -> configuration -> round -> tok/s
    for (*cell, config), mine in by_configuration([r for r in runs if "error" not in r]).items():
        by_cell.setdefault(tuple(cell), {})[config] = {r["repeat"]: r["tok_per_s"] for r in mine}
    rows = []
    for cell, tps in by_cell.items():
        if "auto" not in tps:
            continue
        paired = {name: [tps["auto"][rep] / rounds[rep] for rep in sorted(tps["auto"]) if rep in rounds]
                  for name, rounds in tps.items() if name not in ("plain", BEFORE, SECOND, "auto")}
        paired = {name: ratios for name, ratios in paired.items() if ratios}
        if not paired:
            continue
        rival = min(paired, key=lambda name: median(paired[name]))
        plain = list(tps.get("plain", {}).values())
        noise = (max(plain) - min(plain)) / median(plain) if len(plain) > 1 else None
        rows.append([*cell, rival, runs_cell(paired[rival], ".3f"), fmt(median(paired[rival]), ".3f"),
                     "-" if noise is None else f"{noise:.1%}"])
    if not rows:
        return []
    return ["", "The shipped defaults (`auto`) against the configuration they trail most, round by round "
            "(`auto`'s tok/s over its tok/s in the same round; the rival is the one with the lowest median "
            "ratio; plain decoding's spread over its rounds, (max - min) / median, is the machine's noise):", "",
            *table(["target", "batch", "T", "rival", "auto / it, per round", "median", "plain's spread"],
                   rows)]


def time_split(runs: list[dict]) -> list[str]:
    """Where each configuration's timed part went, per output token (medians over its
    runs, in ms): the target's forward and logits, sampling with verification and
    drafting, and drafting alone -- so a gap between two configurations shows where
    it lies. Only runs that recorded the runner's timers (from 2026-11-27)."""
    timed = [r for r in runs if "error" not in r and r.get("runner_s")]
    if not timed:
        return []
    rows = []
    for key, mine in by_configuration(timed).items():

        def per_token(part: str) -> str:
            return fmt(median([1e3 * r["runner_s"][part] / (r["tok_per_s"] * r["elapsed_s"]) for r in mine]), ".2f")

        elapsed = fmt(median([1e3 / r["tok_per_s"] for r in mine]), ".2f")
        rows.append([*key, per_token("execute_model"), per_token("sample_tokens"),
                     per_token("propose_draft_token_ids"), elapsed])
    return ["", "Where the timed part went, ms per output token (medians over the runs; `sample_tokens` "
            "includes drafting):", "",
            *table(["target", "batch", "T", "configuration", "execute_model", "sample_tokens", "drafting", "elapsed"],
                   rows)]


def plot(runs: list[dict], name: str) -> None:
    """Speedup per configuration with its spread, one panel per cell."""
    rows = [r for r in summarize(runs)
            if r["config"] != "plain" and "superseded" not in r["config"] and r["speedup"] is not None]
    cells = list(dict.fromkeys((r["target"], r["batch_size"], r["temperature"]) for r in rows))
    if not cells:
        return
    with figure(name, 1, len(cells), figsize=(2.8 * len(cells), 3.6), sharey=True, squeeze=False) as (fig, axes):
        _draw(axes, cells, rows)


def _draw(axes, cells: list[tuple], rows: list[dict]) -> None:
    for ax, cell in zip(axes[0], cells):
        mine = [r for r in rows if (r["target"], r["batch_size"], r["temperature"]) == cell]
        colors = ["tab:green" if r["config"] == "auto" else "tab:gray" if r["config"] == BUILTIN else "tab:blue"
                  for r in mine]
        low = [r["speedup"] - r["spread"][0] for r in mine]
        high = [r["spread"][1] - r["speedup"] for r in mine]
        ax.bar(range(len(mine)), [r["speedup"] for r in mine], color=colors, yerr=[low, high], capsize=2)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(mine)), [r["config"].replace("vllm built-in TLI", "built-in") for r in mine],
                      rotation=60, fontsize=7)
        ax.set_title(f"{cell[0]}\nbatch {cell[1]}, T={cell[2]}", fontsize=8)
    axes[0][0].set_ylabel("speedup over plain decoding")


if __name__ == "__main__":
    main()
