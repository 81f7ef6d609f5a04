"""Distribution bias of `dtw`'s paper-faithful verification, next to its lossless mode.

TokenTiming carries the matched draft token's probability over to each proxy target
token. A proxy token's true proposal probability is a sum over every draft tokenization
that spells it, so the carried value is wrong whenever tokenizations do not line up one
to one, and speculative sampling with a wrong q is biased. This benchmark measures how
much, end to end in vLLM: many independently seeded requests of one prompt at T = 1,
and the total variation (TV) distance between the empirical distribution of the tokens
at the drafted positions and the target alone's. Two independent target-only samples
give the noise floor (the TV two finite samples of one distribution show).

    .venv/bin/python benchmarks/dtw_bias.py [--n 1500]

Writes benchmarks/results/dtw_bias.json and dtw_bias.md.
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

import numpy as np
from report import table, write_report
from scipy.stats import chi2_contingency

from hetero_harness.evaluation import run_isolated
from hetero_harness.models import ensure_model

PROMPTS = ["My favourite thing about the weekend is", "def fibonacci(n):\n    "]
POSITIONS = (1, 2)  # position 0 comes from the prefill, not from a draft


def tv_distance(a: list[int], b: list[int]) -> float:
    ca, cb = Counter(a), Counter(b)
    return 0.5 * sum(abs(ca[t] / len(a) - cb[t] / len(b)) for t in set(ca) | set(cb))


def chi2_pvalue(a: list[int], b: list[int]) -> float:
    """Two-sample homogeneity test; tokens seen fewer than 10 times pooled."""
    ca, cb = Counter(a), Counter(b)
    common = [t for t, c in (ca + cb).items() if c >= 10]
    table = np.array([[c[t] for t in common] + [len(x) - sum(c[t] for t in common)] for c, x in ((ca, a), (cb, b))])
    table = table[:, table.sum(0) > 0]
    return float(chi2_contingency(table)[1]) if table.shape[1] > 1 else 1.0


def sample(target: str, prompt: str, n: int, seed0: int, spec: dict | None) -> dict[str, Any]:
    return run_isolated({
        "target": target, "prompts": [prompt] * n, "request_seeds": list(range(seed0, seed0 + n)),
        "max_tokens": 3, "temperature": 1.0, "ignore_eos": True, "max_model_len": 256,
        "max_num_seqs": 64, "speculative_config": spec, "warmup": False,
    })


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1500, help="seeded requests per configuration and prompt")
    args = ap.parse_args()
    target, draft = str(ensure_model("gemma3-270m")), str(ensure_model("smollm2-135m"))
    configs = {
        "target alone (second sample: noise floor)": None,
        "dtw, lossless verification": {"dtw_verify": "lossless"},
        "dtw, paper-faithful transfer": {"dtw_verify": "faithful"},
    }
    rows = []
    for pi, prompt in enumerate(PROMPTS):
        ref = sample(target, prompt, args.n, 0, None)["token_ids"]
        for ci, (name, extra) in enumerate(configs.items()):
            spec = None if extra is None else {"method": "hetero", "model": draft, "num_speculative_tokens": 3,
                                               "algorithm": "dtw", **extra}
            res = sample(target, prompt, args.n, (ci + 1) * 100_000, spec)
            for pos in POSITIONS:
                a, b = [o[pos] for o in ref], [o[pos] for o in res["token_ids"]]
                rows.append({"prompt": pi, "config": name, "position": pos, "n": args.n,
                             "tv": tv_distance(a, b), "chi2_p": chi2_pvalue(a, b),
                             "acceptance_rate": res["acceptance_rate"]})
                print(rows[-1], flush=True)
    lines = table(["prompt", "configuration", "position", "TV to target alone", "chi-square p", "acceptance"],
                  ([r["prompt"], r["config"], r["position"], f"{r['tv']:.3f}", f"{r['chi2_p']:.1e}",
                    f"{100 * r['acceptance_rate']:.1f}%" if r["acceptance_rate"] is not None else "-"] for r in rows))
    write_report("dtw_bias", {"target": "gemma3-270m", "draft": "smollm2-135m", "prompts": PROMPTS, "rows": rows},
                 lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
