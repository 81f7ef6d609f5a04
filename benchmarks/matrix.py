"""The defaults matrix on one page: every cell's latest measurement on the AMD machine.

``benchmarks/defaults.py`` measured the matrix (targets x batch {1, 8, 32} x T {0, 1})
cell by cell over several runs and result files, as the code changed. This gathers,
for every cell and configuration, the newest run that measured it: ``auto``, the best
lossless rule alone, and vLLM's built-in TLI, each as a ratio to plain decoding *in the
same result file* (runs interleaved with it; never a ratio between two files), with the
spread and the file it comes from. A cell or configuration never measured shows as
missing, so the gaps are as visible as the figures.

    .venv/bin/python benchmarks/matrix.py            # -> results/defaults_matrix.{md,json}
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from defaults import BUILTIN, RULES, by_configuration
from report import fmt, median, ratio_cell, results_dir, table, write_report

#: The result files measured on the 2-core AMD EPYC (float32 drafter), oldest first (the
#: order they were measured in); a later file's cell replaces an earlier one's. Runs that
#: no cell takes its figure from any more were deleted (they are in the git history).
#: ``defaults.json`` (an Intel machine with a bf16 drafter) is left out: ratios differ
#: by machine, so cells from two machines would not make one table.
SOURCES = (
    "defaults_15b_b1", "defaults_15b_b1_t1", "defaults_gemma", "defaults_gemma_b1", "defaults_05b_t1",
    "defaults_05b_t1_level", "defaults_05b_t0_level", "defaults_05b_b8_b32", "defaults_gemma_b8_b32",
    "defaults_fp16_drafter", "defaults_gemma_b8_t0_rules", "defaults_gemma_b8_t0_sync",
    "defaults_gemma_b32_t0_sync", "defaults_15b_b8_b32", "defaults_15b_b1_builtin", "defaults_15b_b8_t0",
    "defaults_gemma_b1_t1", "defaults_05b_builtin", "defaults_15b_builtin_t0",
)
TARGETS = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma3-270m")


def measurements(files: list[Path]) -> dict[tuple, dict]:
    """``(target, batch, T, configuration)`` -> its newest measurement: median and spread
    as ratios to plain decoding in the same file, the runs, and the file; or, where every
    run of it failed, how many did (vLLM's built-in cannot start with a Gemma-3 target)."""
    latest: dict[tuple, dict] = {}
    for path in files:
        name = path.stem
        groups = by_configuration(json.loads(path.read_text())["runs"])
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


def to_markdown(rows: list[dict]) -> str:
    lines = [
        "Every cell of the defaults matrix, its newest measurement on a 2-core AMD EPYC without AVX-512 or bf16 "
        "(float32 drafter, float32 targets, SmolLM2-135M drafting, 64 tokens per request). Each ratio is to plain "
        "decoding in the same result file, its runs interleaved with plain's; spread = min-max of the runs over "
        "plain's median. `benchmarks/matrix.py` from the files named.",
        "",
    ]
    body = []
    for r in rows:
        best = "not measured" if r["rule"] is None else f"`{r['best_rule']}` {_ratio(r['rule'])}"
        files = sorted({m["file"] for m in (r["auto"], r["rule"], r["builtin"]) if m})
        body.append([r["target"], r["batch_size"], f"{r['temperature']:g}", _ratio(r["auto"]), best,
                     ", ".join(r["rules_run"]) or "-", _ratio(r["builtin"]),
                     ", ".join(f"[{f}]({f}.md)" for f in files) or "-"])
    lines += table(["target", "batch", "T", "`auto`", "best rule alone", "rules run alone", "vLLM built-in TLI",
                    "files"], body)
    measured = [r for r in rows if r["auto"]]
    worst = min(measured, key=lambda r: r["auto"]["speedup"], default=None)
    lines += ["", f"Cells with `auto` measured: {len(measured)} of {len(rows)}; its lowest: "
              + (f"{worst['target']} batch {worst['batch_size']} T = {worst['temperature']:g}, "
                 f"{fmt(worst['auto']['speedup'], '.2f')}x." if worst else "-")]
    return "\n".join(lines) + "\n"


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    rows = cells(measurements([results_dir() / f"{name}.json" for name in SOURCES]))
    write_report("defaults_matrix", {"sources": SOURCES, "cells": rows}, to_markdown(rows))
    print(to_markdown(rows))


if __name__ == "__main__":
    main()
