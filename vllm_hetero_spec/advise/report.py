"""What ``advise`` shows: a table a person reads at a glance, a plot of projected speedup
against batch size per drafter, and the JSON it writes (every option, and the config)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm_hetero_spec.advise.analysis import DRAFT_MODEL, Option, Recommendation, best_per_setting


def _fmt(x: float, spec: str = ".2f") -> str:
    return "-" if x != x else format(x, spec)  # NaN: not measured


def _by_length(o: Option) -> str:
    return " / ".join(f"{v:.2f}x" for _, v in sorted(o.by_length.items()))


def table(options: list[Option]) -> str:
    """One row per drafter, method and temperature; per batch size the projected speedup
    with its best k (the geometric mean over the output lengths), the speedup at each
    length, and the sample's measured speedup at the longest k."""
    sizes = sorted({o.batch for o in options})
    lengths = "/".join(str(n) for n in sorted({n for o in options for n in o.by_length}))
    head = ["drafter", "rule", "T", "acceptance per position", "E(k)", "draft/target"]
    head += [f"b={b}: projected (k)" for b in sizes] + [f"b={b}: at {lengths} tokens" for b in sizes]
    head += [f"b={b}: sample" for b in sizes]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    groups: dict[tuple[str, str, float], dict[int, Option]] = {}
    for o in options:
        groups.setdefault((o.drafter, o.rule, o.temperature), {})[o.batch] = o
    for (drafter, rule, t), by_b in groups.items():
        first = next(iter(by_b.values()))
        cells = [drafter, rule, f"{t:g}", _acceptance(first),
                 f"{first.mean_accepted:.2f}", _fmt(first.draft_cost)]
        cells += [f"{by_b[b].projected:.2f}x ({by_b[b].k})" if b in by_b else "-" for b in sizes]
        cells += [_by_length(by_b[b]) if b in by_b else "-" for b in sizes]
        cells += [f"{by_b[b].sample:.2f}x" if b in by_b else "-" for b in sizes]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _acceptance(o: Option) -> str:
    """Per position over the sample, and past the first half of a reply where measured."""
    def shares(xs: Sequence[float]) -> str:
        return " ".join(f"{a:.2f}" for a in xs)

    late = f" (from token {o.phases.switch}: {shares(o.phases.late)})" if o.phases is not None else ""
    return shares(o.acceptance) + late


def verdict(rec: Recommendation) -> str:
    """One paragraph: what to run (the config as written), and what it should gain."""
    if rec.config is None:
        return (f"Plain decoding: no drafter measured here beats it (the best, geometric mean {rec.score:.2f}x). "
                "No config written.")
    if rec.method == DRAFT_MODEL:
        what = "vLLM's own draft_model"
    else:
        fixed = ", a fixed k" if rec.config.get("draft_budget") == "fixed" else ""
        what = f"vllm_hetero_spec (algorithm {rec.config['algorithm']}{fixed})"
    lengths = "/".join(str(n) for n in sorted({n for o in rec.per_setting.values() for n in o.by_length}))
    gains = ", ".join(f"T={t:g} b={b}: {_by_length(o)}" for (t, b), o in sorted(rec.per_setting.items()))
    return (f"Use {rec.drafter} with {what}: {rec.score:.2f}x plain decoding (geometric mean; at {lengths} "
            f"output tokens, {gains}).")


def plot(options: list[Option], drafters: list[str], path: Path) -> Path | None:
    """Projected speedup against batch size, one line per drafter and method at each
    temperature; ``None`` where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    temps = sorted({o.temperature for o in options})
    ticks = sorted({o.batch for o in options})
    fig, axes = plt.subplots(1, len(temps), figsize=(5 * len(temps), 3.8), squeeze=False)
    for ax, t in zip(axes[0], temps):
        for drafter in drafters:
            for method in ("hetero", DRAFT_MODEL):
                per = {b: o for (tt, b), o in best_per_setting(options, drafter, method).items() if tt == t}
                if per:
                    sizes = sorted(per)
                    label = f"{drafter} ({'vLLM draft_model' if method == DRAFT_MODEL else 'ours'})"
                    ax.plot(sizes, [per[b].projected for b in sizes], marker="o", label=label)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(b) for b in ticks])
        ax.set_xlabel("batch size")
        ax.set_ylabel("projected speedup over plain")
        ax.set_title(f"T = {t:g}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_json(path: Path, options: list[Option], rec: Recommendation, meta: dict[str, Any]) -> None:
    data = {
        **meta,
        "recommendation": {"drafter": rec.drafter, "method": rec.method, "geomean_speedup": rec.score,
                           "config": rec.config, "per_drafter": rec.configs,
                           "per_setting": [{"T": t, "b": b, "rule": o.rule, "k": o.k, "projected": o.projected,
                                            "by_length": {str(n): v for n, v in o.by_length.items()}}
                                           for (t, b), o in sorted(rec.per_setting.items())]},
        "options": [{**dataclasses.asdict(o), "mean_accepted": o.mean_accepted,
                     "draft_cost": None if o.draft_cost != o.draft_cost else o.draft_cost,
                     "by_k": {str(k): v for k, v in o.by_k.items()},
                     "by_length": {str(n): v for n, v in o.by_length.items()}} for o in options],
    }
    path.write_text(json.dumps(data, indent=1) + "\n")
