"""The engine stage of the one-command GPU check (``benchmarks/cuda_check.py``): real vLLM
engines on a CUDA device, the shipped pair, each attention backend the drafter meets on
NVIDIA GPUs.

Per backend (FlashAttention: SM80/SM90's default; FlashInfer: Blackwell's, and any head
size FlashAttention lacks), two engines with vLLM's default flags (compiled, CUDA
graphs captured), one at a time, each in a process of its own:

1. the target alone;
2. the target with ``algorithm: auto`` drafting (the shipped config), the whole engine
   on that backend (``--attention-backend``, which the drafter follows).

Each runs the bridge-stress prompts greedily and :data:`SAMPLES` copies of one prompt at
T = 1. The checks: greedy outputs identical to the target alone's; the sampled tokens at
the positions drafts reach (1 and 2) from the same law as the target alone's (a
two-sample chi-square, p > 1e-3); drafts accepted and no drafting failure; the drafter
built on the asked backend, its CUDA graphs captured, their memory measured for vLLM's
profile; and, reported, the draft forward's milliseconds per batch size and both engines'
output tokens per second.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests")]

from _stats import two_sample_pvalue  # noqa: E402

TARGET, DRAFTER = "qwen2.5-coder-0.5b", "smollm2-135m"
BACKENDS = ("FLASH_ATTN", "FLASHINFER")
SAMPLES = 400
GREEDY_TOKENS = 32
PROMPT = "My favourite thing about the weekend is"
DRAFT_MS_BATCHES = [1, 8, 32]
P_MIN = 1e-3
SPEC = {"method": "hetero", "model": DRAFTER, "num_speculative_tokens": 4, "algorithm": "auto"}

NEEDS = [
    "an NVIDIA GPU (CUDA) with about 6 GiB free",
    "vLLM 0.32.0's or 0.33.0's CUDA build, with FlashInfer (`pip install 'vllm>=0.32.0,<0.34' flashinfer-python`)",
    "this plugin and the harness installed (`pip install -e . -e harness`)",
    f"the models converted once (`python -m hetero_harness.models {TARGET} {DRAFTER}`)",
]


def plan() -> list[str]:
    """What the stage runs, in order, as lines for a person."""
    lines = []
    for backend in BACKENDS:
        for name, spec in (("target alone", None), ("hetero auto", SPEC)):
            lines.append(f"{backend}: {name}: {TARGET} bf16, vLLM's default flags (CUDA graphs), "
                         f"--attention-backend {backend}" + (f", speculative_config {spec}" if spec else "")
                         + f"; bridge-stress prompts greedy ({GREEDY_TOKENS} tokens), {SAMPLES} x T = 1 (3 tokens)"
                         + (f"; draft forward ms at batch {DRAFT_MS_BATCHES}" if spec else ""))
    lines.append("checks per backend: greedy identical; positions 1, 2 two-sample chi-square p > 1e-3; drafts accepted, "
                 "no fallback; drafter on the backend; draft CUDA graphs captured and their memory measured")
    return lines


def _job(backend: str, spec: dict | None) -> dict[str, Any]:
    from hetero_harness.models import ensure_model
    from hetero_harness.prompts import BRIDGE_STRESS

    prompts = list(BRIDGE_STRESS) + [PROMPT] * SAMPLES
    greedy = len(BRIDGE_STRESS)
    return {
        "target": str(ensure_model(TARGET)),
        "dtype": "bfloat16",
        "attention_backend": backend,
        "prompts": prompts,
        "temperatures": [0.0] * greedy + [1.0] * SAMPLES,
        "max_tokens": [GREEDY_TOKENS] * greedy + [3] * SAMPLES,
        "ignore_eos": True,
        "max_model_len": 1024,
        "max_num_seqs": 128,
        "speculative_config": spec,
        "draft_ms_batches": DRAFT_MS_BATCHES if spec else None,
        "warmup": True,
    }


def _check(backend: str, alone: dict, hetero: dict) -> dict[str, Any]:
    greedy = len(alone["token_ids"]) - SAMPLES
    same = sum(a == b for a, b in zip(alone["token_ids"][:greedy], hetero["token_ids"][:greedy]))
    pvalues = [two_sample_pvalue([t[pos] for t in alone["token_ids"][greedy:]],
                                 [t[pos] for t in hetero["token_ids"][greedy:]]) for pos in (1, 2)]
    runtime = hetero.get("drafter_runtime", {})
    checks = {
        "greedy identical": same == greedy,
        "T = 1 same law (positions 1, 2)": all(p > P_MIN for p in pvalues),
        "drafts accepted, no fallback": hetero["num_accepted_tokens"] > 0 and hetero.get("fallbacks", 1) == 0,
        "drafter on the backend": runtime.get("attention_backends") == [backend],
        "draft CUDA graphs captured": runtime.get("graphs_captured", 0) > 0,
        "graph memory measured": runtime.get("graph_mib", 0) > 0,
    }
    return {
        "backend": backend, "checks": checks, "ok": all(checks.values()),
        "greedy_identical": f"{same}/{greedy}", "pvalues": pvalues,
        "acceptance": hetero["num_accepted_tokens"] / max(1, hetero["num_draft_tokens"]),
        "drafter_runtime": runtime, "draft_forward_ms": hetero.get("draft_forward_ms", {}),
        "tok_per_s": {"alone": alone["tok_per_s"], "hetero": hetero["tok_per_s"]},
    }


def run() -> dict[str, Any]:
    """Every backend's two engines, one at a time, and their checks."""
    from hetero_harness.evaluation import run_isolated, unwrap

    out = []
    for backend in BACKENDS:
        try:
            alone = unwrap(run_isolated(_job(backend, None)))
            hetero = unwrap(run_isolated(_job(backend, SPEC)))
        except Exception as exc:  # an engine that fails to start is a failed check, reported
            out.append({"backend": backend, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]})
            continue
        out.append(_check(backend, alone, hetero))
    return {"backends": out, "ok": all(b["ok"] for b in out)}


def markdown(result: dict[str, Any]) -> list[str]:
    lines = ["", f"## Engines: {DRAFTER} drafting for {TARGET} (bf16, vLLM's default flags)", ""]
    for b in result["backends"]:
        if "error" in b:
            lines += [f"**{b['backend']}: the engines did not run**: `{b['error']}`", ""]
            continue
        rt, ms = b["drafter_runtime"], b["draft_forward_ms"]
        lines += [f"### {b['backend']}", "", "| check | result |", "|---|---|"]
        lines += [f"| {name} | {'pass' if ok else 'FAIL'} |" for name, ok in b["checks"].items()]
        lines += [
            f"| greedy outputs equal | {b['greedy_identical']} |",
            f"| chi-square p, positions 1 and 2 | {b['pvalues'][0]:.3f}, {b['pvalues'][1]:.3f} |",
            f"| acceptance | {b['acceptance']:.1%} |",
            f"| drafter: backends, block size, graphs, graph memory | {rt.get('attention_backends')}, "
            f"{rt.get('block_size')}, {rt.get('graphs_captured')}, {rt.get('graph_mib', 0):.1f} MiB |",
            "| draft forward ms (batch: ms) | " + ", ".join(f"{k}: {v:.3f}" for k, v in ms.items()) + " |",
            f"| output tok/s, target alone / hetero | {b['tok_per_s']['alone']:.0f} / {b['tok_per_s']['hetero']:.0f} |",
            "",
        ]
    return lines
