"""The defaults matrix on one page: every cell's latest measurement on the AMD machine.

``benchmarks/defaults.py`` measures the matrix (targets x batch {1, 8, 32} x T {0, 1}),
a run at a time, often a few cells a run. Every cell a run measured goes into one store,
``results/defaults_matrix_store.json``: for each (target, batch, T, configuration), the
runs of the newest run that measured it beside that run's plain decoding, and where they
come from (the run's name, date, arguments, machine and commit). This reads the store
and writes the table: ``auto``, the best lossless rule alone and vLLM's built-in TLI, each
as a ratio to plain decoding *of the same run* (runs interleaved with it; never a ratio
between two runs), with the spread and the run it comes from. A cell or configuration
never measured shows as missing, so the gaps are as visible as the figures.

    .venv/bin/python benchmarks/matrix.py                 # store -> results/defaults_matrix.{md,json}
    .venv/bin/python benchmarks/matrix.py --add NAME      # first merge results/NAME.json (a defaults.py run)

``defaults.py --store`` does the ``--add`` itself when its run ends.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections.abc import Iterable
from pathlib import Path

from config_names import BUILTIN, RULES, by_configuration
from report import ROOT, fmt, median, ratio_cell, read_result, results_dir, table, write_report

STORE = "defaults_matrix_store"
#: The store holds one machine's runs: ratios differ by machine, so cells from two machines
#: would not make one table (``defaults.json``, an Intel machine with a bf16 drafter, is
#: not in it).
MACHINE = "2-core AMD EPYC without AVX-512 or bf16"
TARGETS = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma3-270m")


def _cell(run: dict) -> tuple:
    return Path(run["target"]).name, run["batch_size"], run["temperature"]


def _latest(sources: Iterable[tuple[str, list[dict]]]) -> dict[tuple, dict]:
    """Runs of ``defaults.py`` as ``(name, runs)``, oldest first -> ``(target, batch, T,
    configuration)`` -> its newest measurement: median and spread as ratios to plain
    decoding of the same run, the runs, and the run's name; or, where every run of it
    failed, how many did (vLLM's built-in cannot start with a Gemma-3 target). A
    configuration counts only where its run has plain decoding for the cell."""
    latest: dict[tuple, dict] = {}
    for name, runs in sources:
        groups = by_configuration(runs)
        for (target, batch, temp, config), mine in groups.items():
            plain = [r for r in groups.get((target, batch, temp, "plain"), []) if "error" not in r]
            base = median([r["tok_per_s"] for r in plain])
            if config == "plain" or not base:
                continue
            tps = [r["tok_per_s"] for r in mine if "error" not in r]
            key = (Path(target).name, batch, temp, config)
            if not tps:
                latest[key] = {"failed": len(mine), "file": name}
                continue
            latest[key] = {"speedup": median(tps) / base, "low": min(tps) / base, "high": max(tps) / base,
                           "runs": len(tps), "plain_runs": len(plain), "file": name}
    return latest


def measurements(files: list[Path]) -> dict[tuple, dict]:
    """:func:`_latest` over result files of ``defaults.py`` (oldest first; a later file's
    cell replaces an earlier one's)."""
    return _latest((path.stem, json.loads(path.read_text())["runs"]) for path in files)


# -- the store -------------------------------------------------------------------------


def empty_store() -> dict:
    return {"about": f"The defaults matrix's cells ({MACHINE}): for each (target, batch, T, configuration) the runs "
                     "of the newest defaults.py run that measured it, with that run's plain decoding of the cell; "
                     "`sources` (oldest first) says where each run comes from: its name, date, arguments (`meta`), "
                     "machine and commit (the code that ran it where the run recorded it, else the last commit "
                     "holding the run's own file). Written by benchmarks/matrix.py.",
            "machine": MACHINE, "sources": [], "runs": []}


def read_store(out: str | Path | None = None) -> dict:
    path = results_dir(out) / f"{STORE}.json"
    return json.loads(path.read_text()) if path.exists() else empty_store()


def write_store(store: dict, out: str | Path | None = None) -> Path:
    folder = results_dir(out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{STORE}.json"
    # One source, one run a line: the diff of an added run is readable.
    lines = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in store.items() if k not in ("sources", "runs")]
    for key in ("sources", "runs"):
        items = ",\n".join("  " + json.dumps(item) for item in store[key])
        lines.append(f' "{key}": [\n{items}\n ]' + ("," if key == "sources" else ""))
    path.write_text("{\n" + "\n".join(lines) + "\n}\n")
    return path


def _by_source(store: dict) -> list[tuple[str, list[dict]]]:
    return [(s["name"], [r for r in store["runs"] if r["source"] == s["name"]]) for s in store["sources"]]


def store_measurements(store: dict) -> dict[tuple, dict]:
    """The store's cells, as :func:`measurements` gives them."""
    return _latest(_by_source(store))


def add_run(store: dict, name: str, result: dict, commit: str | None = None) -> dict:
    """``store`` with the run ``result`` (a ``defaults.py`` JSON) added as its newest: each
    configuration it measured (beside plain decoding of the same cell) replaces the store's;
    runs no cell takes its figure from any more, and sources left without runs, are dropped.
    A run of the same name already in the store is replaced whole (an ``--append`` run).
    ``commit`` names the run's provenance where its JSON recorded no commit of its own."""
    env = result.get("environment") or {}
    source = {"name": name, "date": result["meta"].get("date"),
              "commit": (env.get("git_commit") or "")[:7] or commit,
              "meta": result["meta"], **({"environment": env} if env else {})}
    sources = [s for s in store["sources"] if s["name"] != name] + [source]
    runs = [r for r in store["runs"] if r["source"] != name] + [{"source": name, **r} for r in result["runs"]]
    latest = _latest((s["name"], [r for r in runs if r["source"] == s["name"]]) for s in sources)
    winner = {key: m["file"] for key, m in latest.items()}
    used = {(*_cell(r), r["source"]) for r in runs if winner.get((*_cell(r), r["config"])) == r["source"]}
    kept = [r for r in runs if winner.get((*_cell(r), r["config"])) == r["source"]
            or (r["config"] == "plain" and (*_cell(r), r["source"]) in used)]
    names = {r["source"] for r in kept}
    return {**store, "sources": [s for s in sources if s["name"] in names], "runs": kept}


def last_commit(path: Path) -> str | None:
    """The last commit that changed ``path`` (where a run's own file can be found again)."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%h", "--", str(path)], cwd=ROOT, capture_output=True,
                             text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


# -- the table -------------------------------------------------------------------------


def cells(latest: dict[tuple, dict]) -> list[dict]:
    """One row per cell of the matrix, measured or not."""
    rows = []
    for target in TARGETS:
        for batch in (1, 8, 32):
            for temp in (0.0, 1.0):
                mine = {config: m for (t, b, T, config), m in latest.items() if (t, b, T) == (target, batch, temp)}
                rules = {rule: mine[rule] for rule in RULES if "speedup" in mine.get(rule, {})}
                best = max(rules, key=lambda rule: rules[rule]["speedup"], default=None)
                rows.append({"target": target, "batch_size": batch, "temperature": temp,
                             "auto": mine.get("auto"), "best_rule": best, "rule": rules.get(best),
                             "rules_run": sorted(rules), "builtin": mine.get(BUILTIN)})
    return rows


def _ratio(m: dict | None) -> str:
    if m is None:
        return "not measured"
    if "failed" in m:
        return f"failed to start ({_runs(m['failed'])})"
    return ratio_cell(m["speedup"], m["low"], m["high"], note=_runs(m["runs"]))


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def to_markdown(rows: list[dict], sources: list[dict] = ()) -> str:
    dates = {s["name"]: s.get("date") for s in sources}
    lines = [
        f"Every cell of the defaults matrix, its newest measurement on a {MACHINE} "
        "(float32 drafter, float32 targets, SmolLM2-135M drafting, 64 tokens per request). Each ratio is to plain "
        "decoding in the same run, its runs interleaved with plain's; spread = min-max of the runs over "
        f"plain's median. `benchmarks/matrix.py` from `{STORE}.json`, which keeps each run's arguments, date and "
        "machine under `sources`.",
        "",
    ]
    body = []
    for r in rows:
        best = "not measured" if r["rule"] is None else f"`{r['best_rule']}` {_ratio(r['rule'])}"
        files = sorted({m["file"] for m in (r["auto"], r["rule"], r["builtin"]) if m})
        body.append([r["target"], r["batch_size"], f"{r['temperature']:g}", _ratio(r["auto"]), best,
                     ", ".join(r["rules_run"]) or "-", _ratio(r["builtin"]),
                     ", ".join(f"{f} ({dates[f]})" if dates.get(f) else f for f in files) or "-"])
    lines += table(["target", "batch", "T", "`auto`", "best rule alone", "rules run alone", "vLLM built-in TLI",
                    "runs"], body)
    measured = [r for r in rows if r["auto"]]
    worst = min(measured, key=lambda r: r["auto"]["speedup"], default=None)
    lines += ["", f"Cells with `auto` measured: {len(measured)} of {len(rows)}; its lowest: "
              + (f"{worst['target']} batch {worst['batch_size']} T = {worst['temperature']:g}, "
                 f"{fmt(worst['auto']['speedup'], '.2f')}x." if worst else "-")]
    return "\n".join(lines) + "\n"


def build(store: dict, out: str | Path | None = None) -> str:
    """Write ``defaults_matrix.{json,md}`` from ``store``; returns the markdown."""
    rows = cells(store_measurements(store))
    text = to_markdown(rows, store["sources"])
    write_report("defaults_matrix", {"store": f"{STORE}.json", "sources": [s["name"] for s in store["sources"]],
                                     "cells": rows}, text, out=out)
    return text


def add_and_build(names: Iterable[str], out: str | Path | None = None) -> str:
    """Merge the runs ``results/<name>.json`` into the store, in order, then rebuild the table."""
    store = read_store(out)
    for name in names:
        store = add_run(store, name, read_result(name, out), last_commit(results_dir(out) / f"{name}.json"))
    write_store(store, out)
    return build(store, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--add", nargs="+", default=[], metavar="NAME",
                    help="merge these defaults.py results (results/NAME.json, oldest first) into the store first")
    args = ap.parse_args()
    print(add_and_build(args.add) if args.add else build(read_store()))


if __name__ == "__main__":
    main()
