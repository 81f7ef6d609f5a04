"""The benchmark scripts' shared report module: every script writes its results through it.

One result is ``<name>.json`` (the data, with the machine that wrote it embedded under
``"environment"``: CPU model, cores, torch and vLLM versions, git commit) beside
``<name>.md`` (a caption and a markdown table) and, for some, ``<name>.png``, in
``benchmarks/results/`` -- or in the folder named by ``$HETERO_RESULTS_DIR``, or by the
``out`` argument (a throwaway run, a test).

    from report import meta, ratio_cell, table, write_report

    rows = [{"config": "auto", "speedup": 1.63, "low": 1.53, "high": 1.73}]
    md = ["Caption: what was run, on what, how to read it.", "",
          *table(["config", "speedup"], [[r["config"], ratio_cell(r["speedup"], r["low"], r["high"])] for r in rows])]
    write_report("sampling_params", {"meta": meta(args), "rows": rows}, md)

Only the standard library at import time (``cuda_check.py`` runs where vLLM is not
installed, and matplotlib is imported by :func:`figure` alone).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: Where results go unless ``$HETERO_RESULTS_DIR`` or an ``out`` argument says otherwise.
RESULTS = Path(__file__).resolve().parent / "results"
RESULTS_ENV = "HETERO_RESULTS_DIR"


# -- numbers ---------------------------------------------------------------------------


def median(xs: Iterable[float | None]) -> float | None:
    """Median of the measured values (runs that lack the figure are skipped)."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def spread(xs: Iterable[float | None], base: float | None = 1.0) -> tuple[float, float] | None:
    """(min, max) of the measured values, each divided by ``base`` (e.g. plain decoding's
    median, so the spread reads as ratios); None when nothing was measured or no base."""
    xs = [x for x in xs if x is not None]
    if not xs or not base:
        return None
    return min(xs) / base, max(xs) / base


def ratio(xs: Iterable[float | None], base: float | None) -> tuple[float | None, float | None, float | None]:
    """``(median, low, high)`` of the runs ``xs`` over ``base``: the ratio and its spread
    as every table here reports them (Nones when there is no run or no base)."""
    xs = [x for x in xs if x is not None]
    mid = median(xs)
    rng = spread(xs, base)
    if mid is None or rng is None:
        return None, None, None
    return mid / base, rng[0], rng[1]


# -- table cells -----------------------------------------------------------------------


def fmt(x: float | None, spec: str) -> str:
    """``x`` formatted for a table cell, ``-`` when not measured."""
    return "-" if x is None else format(x, spec)


def range_cell(low: float | None, high: float | None, spec: str = ".2f") -> str:
    """``"1.53-1.73"``, or ``-`` when there is no spread."""
    return "-" if low is None or high is None else f"{low:{spec}}-{high:{spec}}"


def ratio_cell(x: float | None, low: float | None = None, high: float | None = None, *, spec: str = ".2f",
               note: str | None = None) -> str:
    """A ratio with its spread: ``"1.63x (1.53-1.73)"``; ``note`` goes inside the
    brackets after the spread (``"1.21x (1.21-1.22; 2 runs)"``); ``-`` when not measured."""
    if x is None:
        return "-"
    inside = [range_cell(low, high, spec)] if low is not None and high is not None else []
    inside += [note] if note else []
    return f"{x:{spec}}x" + (f" ({'; '.join(inside)})" if inside else "")


def runs_cell(xs: Iterable[float], spec: str = ".2f") -> str:
    """Every run's figure: ``"3.97 / 4.16"``."""
    return " / ".join(format(x, spec) for x in xs)


def table(header: Sequence[str] | None, rows: Iterable[Sequence[Any] | Mapping[str, Any]]) -> list[str]:
    """A markdown table's lines. ``rows`` are cell sequences, or dicts (then ``header``
    may be None: the first row's keys). None prints as ``-``; an empty cell stays empty."""
    rows = list(rows)
    if header is None:
        if not rows or not isinstance(rows[0], Mapping):
            raise ValueError("table: no header and no dict rows to take one from")
        header = list(rows[0])
    lines = [_row(header), "|" + "---|" * len(header)]
    for row in rows:
        cells = [row.get(h) for h in header] if isinstance(row, Mapping) else list(row)
        if len(cells) != len(header):
            raise ValueError(f"table: {len(cells)} cells for {len(header)} columns: {cells}")
        lines.append(_row(cells))
    return lines


def _row(cells: Iterable[Any]) -> str:
    return "|" + "|".join(" " if c == "" else f" {'-' if c is None else c} " for c in cells) + "|"


# -- the machine -----------------------------------------------------------------------


def machine() -> str:
    """The short machine string the scripts' ``meta`` has always carried."""
    return f"{platform.machine()} {platform.processor()}".strip()


def meta(args: argparse.Namespace | Mapping[str, Any] | None = None, *, date_format: str = "%Y-%m-%d",
         **extra: Any) -> dict[str, Any]:
    """A result's ``meta``: the command's arguments, the machine, the date, and ``extra``."""
    out: dict[str, Any] = {}
    if args is not None:
        out["args"] = dict(vars(args) if isinstance(args, argparse.Namespace) else args)
    out["machine"] = machine()
    out["date"] = time.strftime(date_format)
    out.update(extra)
    return out


def appended_meta(previous: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
    """The ``meta`` of a result that ``--append`` adds runs to: the first run's, with this
    run's arguments under ``"appended <date>"`` (``"appended <date> (2)"``, ... for a
    second append the same day, so every command that added runs stays on record)."""
    key, n = f"appended {meta['date']}", 1
    while key in previous:
        n += 1
        key = f"appended {meta['date']} ({n})"
    return {**previous, key: meta["args"]}


@functools.lru_cache(maxsize=1)
def _static_environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cpu_features": _cpu_features(),
        "arch": platform.machine(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "os": platform.platform(),
        "python": platform.python_version(),
    }
    for dist in ("torch", "vllm", "transformers"):
        try:
            env[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            env[dist] = None
    env["git_commit"], env["git_dirty"] = _git_state()
    return env


def environment() -> dict[str, Any]:
    """The machine and code that wrote a result: CPU model, cores, OS, Python, torch,
    vLLM and transformers versions, the git commit (and whether the tree had uncommitted
    changes), the GPU when torch is loaded and sees one, and the time of writing.
    Embedded in every JSON :func:`write_report` writes, under ``"environment"``."""
    env = dict(_static_environment())
    torch = sys.modules.get("torch")  # never imported here: only reported if the script has it
    if torch is not None:
        try:
            if torch.cuda.is_available():
                env["gpu"] = torch.cuda.get_device_name(0)
            env["torch_threads"] = torch.get_num_threads()
        except Exception:  # noqa: BLE001 -- a description must not fail a run
            pass
    env["written"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
    return env


def _cpuinfo(field: str) -> str | None:
    """The first ``/proc/cpuinfo`` line's value for ``field`` (None where unreadable)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


#: The instruction sets that pick a CPU's GEMM kernels. Two machines that both call
#: themselves "AMD EPYC" have differed in these, and with them in which draft length pays.
KERNEL_FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16")


def _cpu_features() -> list[str]:
    flags = set((_cpuinfo("flags") or "").split())
    return [f for f in KERNEL_FEATURES if f in flags]


def _git_state() -> tuple[str | None, bool | None]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True,
                              timeout=20).stdout.strip()

    try:
        return git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None, None


# -- files -----------------------------------------------------------------------------


def results_dir(out: str | Path | None = None) -> Path:
    """``out`` if given, else ``$HETERO_RESULTS_DIR`` if set, else ``benchmarks/results``."""
    if out is not None:
        return Path(out)
    return Path(os.environ[RESULTS_ENV]) if os.environ.get(RESULTS_ENV) else RESULTS


def read_result(name: str, out: str | Path | None = None) -> Any:
    """The JSON of result ``name`` (``<results>/<name>.json``)."""
    return json.loads((results_dir(out) / f"{name}.json").read_text())


def write_report(name: str, data: Mapping[str, Any], markdown: str | Sequence[str] | None = None, *,
                 title: str | None = None, notes: Sequence[str] = (), out: str | Path | None = None,
                 indent: int = 2) -> Path:
    """Write result ``name``: ``<name>.json`` (``data`` plus ``"environment"``, see
    :func:`environment`) and, when given, ``<name>.md`` (see :func:`write_markdown`).
    Returns the JSON's path. Scripts call it after every run, so a cut-off run keeps
    what it measured."""
    folder = results_dir(out)
    folder.mkdir(parents=True, exist_ok=True)
    payload = {**data, "environment": environment()}
    path = folder / f"{name}.json"
    path.write_text(json.dumps(payload, indent=indent, default=_jsonable))
    if markdown is not None or title is not None or notes:
        write_markdown(name, markdown or [], title=title, notes=notes, out=folder)
    return path


def write_markdown(name: str, markdown: str | Sequence[str], *, title: str | None = None,
                   notes: Sequence[str] = (), out: str | Path | None = None) -> Path:
    """Write ``<name>.md``: ``# title`` if given, then ``markdown`` (a string or lines,
    typically a caption, a blank line and :func:`table`'s lines), then each of ``notes``
    as a paragraph of its own."""
    lines = [f"# {title}", ""] if title else []
    lines += markdown.rstrip("\n").split("\n") if isinstance(markdown, str) else list(markdown)
    for note in notes:
        lines += ["", note]
    folder = results_dir(out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, argparse.Namespace):
        return vars(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


@contextmanager
def figure(name: str, nrows: int = 1, ncols: int = 1, *, out: str | Path | None = None, dpi: int = 110,
           **subplots: Any) -> Iterator[tuple[Any, Any]]:
    """``with figure(name, 1, 3, figsize=(9, 3)) as (fig, axes): ...`` draws on
    matplotlib's ``plt.subplots(nrows, ncols, **subplots)`` (the Agg backend, no display)
    and, when the block ends without an error, lays it out and saves ``<name>.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, **subplots)
    try:
        yield fig, axes
        fig.tight_layout()
        folder = results_dir(out)
        folder.mkdir(parents=True, exist_ok=True)
        fig.savefig(folder / f"{name}.png", dpi=dpi)
    finally:
        plt.close(fig)
