"""The one-command GPU check. Its tensor stage is the per-step tensor work that needs no
vLLM, run on a real GPU: verification and drafting; its engine stage
(``benchmarks/gpu_engine_check.py``) runs real vLLM engines on FlashAttention and
FlashInfer. ``--dry-run`` prints the plan anywhere; without CUDA the script refuses
(exit 2) unless asked for the tensor stage on the CPU (``--device cpu --no-engine``).

The GPU machines lent to this project carry torch but no vLLM (vLLM's CUDA wheel does
not travel there), so this checks what can run without it: the verification rule
(``verify/rules.py``, compact q included), the drafter's sampling and the mapping onto
the target vocabulary (``drafter/sampling.py``, ``drafter/rules/mapped_sampling.py``). Four checks:

1. **Agreement**: the same inputs give the same emitted tokens on the device as on the
   CPU (the rule is exact arithmetic on its inputs), and the same draft distributions
   within float tolerance.
2. **No host sync**: each per-step function runs under
   ``torch.cuda.set_sync_debug_mode("error")``, which raises on any synchronizing call
   (a read-back such as ``.item()``, ``.tolist()``, ``nonzero``, a blocking copy). The
   harness first shows that a planted ``.item()`` raises. Building a step's small
   inputs from host lists (``host_to_device.py``) and a seeded row's generators
   (``verify/seeded.py``) are in the list: a copy, never a wait.
3. **Losslessness on the device**: chi-square tests, with the device's own random
   streams, that the emitted tokens follow the target law (the rule with q, the
   one-hot rule, ``tli`` drafted through a vocabulary intersection), and a control
   that the same test rejects a broken rule.
4. **Timings**: CUDA events per call at batch 1, 8 and 64, k = 4, Qwen2.5's
   151,936-token vocabulary and SmolLM2's 49,152.

    python benchmarks/cuda_check.py                  # on a CUDA machine with vLLM: both stages
    python benchmarks/cuda_check.py --no-engine      # a CUDA machine without vLLM: the tensor stage
    python benchmarks/cuda_check.py --dry-run        # anywhere: what it would run
    .venv/bin/python benchmarks/cuda_check.py --device cpu --no-engine --samples 20000 --no-timings  # CPU

Writes ``cuda_check.{json,md}`` to ``--out`` (default ``benchmarks/results``), through
``benchmarks/report.py``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

import gpu_engine_check  # noqa: E402
from _stats import follows_pvalue  # noqa: E402
from report import results_dir, write_report  # noqa: E402

from vllm_hetero_spec.pin import SUPPORTED_VERSIONS, installed_release  # noqa: E402
from vllm_hetero_spec.drafter.sampling import SamplingRows, processed_probs, sample  # noqa: E402
from vllm_hetero_spec.drafter.rules.mapped_sampling import TOKEN_LEVEL, draft_step  # noqa: E402
from vllm_hetero_spec.verify.draft_probs import DraftProbs  # noqa: E402
from vllm_hetero_spec.verify.plan import VerifyPlan  # noqa: E402
from vllm_hetero_spec.verify.rules import BlockQ, verify_tokens  # noqa: E402
from vllm_hetero_spec.verify.seeded import position_generators  # noqa: E402
from vllm_hetero_spec.vocab.intersection import VocabIntersection  # noqa: E402

TARGET_V, DRAFT_V, K = 151_936, 49_152, 4
ALPHA = 1e-4


def intersection(draft_v: int, target_v: int) -> VocabIntersection:
    """A synthetic pair of vocabularies: every 7th draft token has no target twin, the
    others map to scattered target ids (3 i mod V), as real vocabularies interleave."""
    target = [f"w{j}".encode() for j in range(target_v)]
    draft = [f"z{i}".encode() if i % 7 == 0 else f"w{(3 * i) % target_v}".encode() for i in range(draft_v)]
    return VocabIntersection.build(draft, target)


def rows(b: int, device: torch.device, seeded: bool = False) -> SamplingRows:
    """A mix of greedy, plain T = 1, top-k and top-p rows (the batch's settings)."""
    temp = [[0.0, 1.0, 0.7, 1.3][i % 4] for i in range(b)]
    top_k = [[0, 0, 20, 0][i % 4] for i in range(b)]
    top_p = [[1.0, 1.0, 0.9, 0.8][i % 4] for i in range(b)]
    gens = [torch.Generator(device=device).manual_seed(i) if seeded and i % 2 else None for i in range(b)]
    return SamplingRows.build(temp, top_k, top_p, gens, device)


def verify_inputs(b: int, inter: VocabIntersection, seed: int, device: torch.device) -> dict:
    """One verification step as the sampler hands it to the rule: ``b`` rows of K drafts
    drawn from q on the intersection's support, compact q, half the rows greedy, one
    forced rejection; made on the CPU, then copied (so both sides see the same inputs)."""
    g = torch.Generator().manual_seed(seed)
    s = inter.support.shape[0]
    probs = (torch.randn(b * (K + 1), TARGET_V, generator=g) * 3).softmax(-1)
    q = (torch.randn(b * K, s, generator=g) * 3).softmax(-1)
    # Drafts from q half the time, else the target's top token: both accepted and rejected paths.
    cols = torch.multinomial(q, 1, generator=g).squeeze(1)
    drafts = inter.support[cols].view(b, K)
    top = probs.view(b, K + 1, TARGET_V)[:, :K].argmax(-1)
    drafts = torch.where(torch.rand(b, K, generator=g) < 0.5, top, drafts)
    flat_index = (torch.arange(b).unsqueeze(1) * (K + 1) + torch.arange(K)).long()
    greedy = torch.arange(b) % 2 == 0
    force = torch.zeros(b, K, dtype=torch.bool)
    force[0, -1] = True
    noise_rows = torch.nonzero(~greedy).flatten()
    cpu = {
        "draft_ids": drafts, "num_draft": torch.full((b,), K), "flat_index": flat_index, "target_probs": probs,
        "q": BlockQ(DraftProbs(q, inter.support), torch.arange(b * K).view(b, K)),
        "bonus_ids": torch.multinomial(probs.view(b, K + 1, TARGET_V)[:, K], 1, generator=g).squeeze(1),
        "exact": greedy, "uniform": torch.rand(b, K, generator=g, dtype=torch.float64).float(),
        "race_noise": torch.empty(noise_rows.shape[0], TARGET_V).exponential_(generator=g),
        "noise_rows": noise_rows, "force_reject": force, "target_choice": probs.argmax(-1),
    }
    return {name: _to(v, device) for name, v in cpu.items()}


def _to(v, device: torch.device):
    if isinstance(v, BlockQ):
        return BlockQ(v.probs.to(device), v.index.to(device))
    return v.to(device)


def check_agreement(device: torch.device, inter: VocabIntersection, seeds: int) -> dict:
    """Emitted tokens equal on CPU and device for ``seeds`` verification steps at batch
    8; draft distributions of every token-level algorithm within float tolerance."""
    cpu = torch.device("cpu")
    dev_inter = inter.to(device)
    mismatched = 0
    for seed in range(seeds):
        inputs = verify_inputs(8, inter, seed, cpu)  # made once, then copied
        a = verify_tokens(**inputs)
        b = verify_tokens(**{name: _to(v, device) for name, v in inputs.items()}).cpu()
        mismatched += int((a != b).any(dim=1).sum())
    q_diff, greedy_same = {}, True
    logits = torch.randn(8, DRAFT_V, generator=torch.Generator().manual_seed(0)) * 3
    cpu_rows, dev_rows = rows(8, cpu), rows(8, device)
    greedy = cpu_rows.greedy
    for algorithm in TOKEN_LEVEL:
        on_cpu = draft_step(logits, cpu_rows, inter, algorithm)
        on_dev = draft_step(logits.to(device), dev_rows, dev_inter, algorithm)
        q_diff[algorithm] = max(float((on_cpu.q - on_dev.q.cpu()).abs().max()),
                                float((on_cpu.verify_q - on_dev.verify_q.cpu()).abs().max()))
        greedy_same &= bool((on_cpu.ids[greedy] == on_dev.ids.cpu()[greedy]).all())
    return {"verify_steps": seeds, "rows_differing": mismatched, "max_abs_q_difference": q_diff,
            "greedy_draft_ids_equal": greedy_same,
            "ok": mismatched == 0 and greedy_same and max(q_diff.values()) < 1e-5}


def check_no_sync(device: torch.device, inter: VocabIntersection) -> dict:
    """Every per-step function under ``set_sync_debug_mode("error")``; the planted
    read-back must raise, or the check proves nothing."""
    if device.type != "cuda":
        return {"skipped": "needs CUDA (the CPU has no host sync to catch)", "ok": True}
    dev_inter = inter.to(device)
    inputs = verify_inputs(8, inter, 0, device)
    logits = torch.randn(8, DRAFT_V, device=device)
    unseeded, seeded = rows(8, device), rows(8, device, seeded=True)
    greedy = SamplingRows.build([0.0] * 8, [0] * 8, [1.0] * 8, [None] * 8, device)
    plan = VerifyPlan(inputs["q"].probs, {"a": [0, 1], "b": [2, -1], "c": [3, 4]}, set(), {"c": [False, True]},
                      {"a": 0.1, "c": 0.0}, "js")
    calls: dict[str, Callable[[], object]] = {
        "verify_tokens (compact q, mixed greedy, forced rejection)": lambda: verify_tokens(**inputs),
        "processed_probs + sample (unseeded)": lambda: sample(processed_probs(logits, unseeded), unseeded),
        "processed_probs + sample (seeded rows)": lambda: sample(processed_probs(logits, seeded), seeded),
        "processed_probs + sample (all greedy)": lambda: sample(processed_probs(logits, greedy), greedy),
        **{f"draft_step {a}": (lambda a=a: draft_step(logits, unseeded, dev_inter, a)) for a in TOKEN_LEVEL},
        # Inputs a step builds from host lists (host_to_device.py): copies, never waits.
        "SamplingRows.build": lambda: rows(8, device),
        "SamplingRows.select": lambda: unseeded.select([3, 1, 1]),
        "DraftProbs.take": lambda: inputs["q"].probs.take([5, 0, 2]),
        "position_generators (a seeded row's generator per position)": lambda: position_generators(
            [0, 1, 2], [7, 7, 9], [10, 11, 10], device),
        "VerifyPlan.layout (q rows, forced rejection, fsd thresholds)": lambda: plan.layout(["a", "b", "c"], [2, 1, 2], 2,
                                                                                              device),
    }
    results: dict[str, str] = {}
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        try:
            logits.sum().item()
            planted = "did not raise"
        except RuntimeError:
            planted = "raised"
        for name, call in calls.items():
            try:
                call()
                results[name] = "no sync"
            except RuntimeError as e:
                results[name] = f"SYNC: {str(e).splitlines()[0]}"
        try:
            torch.tensor([[0.5] * 8] * 3, device=device)
            pageable = "no sync"
        except RuntimeError:
            pageable = "syncs"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return {"planted_item": planted, "calls": results, "pageable_copy": pageable,
            "ok": planted == "raised" and all(v == "no sync" for v in results.values())}


def _emitted_first(p: torch.Tensor, draft: torch.Tensor, q: torch.Tensor | None, k: int, uniform_scale: float,
                   device: torch.device) -> torch.Tensor:
    """The first emitted token of N verification blocks, every position with target p."""
    n, v = draft.shape[0] // k, p.shape[0]
    probs = p.expand(n * (k + 1), v).contiguous()
    block_q = None
    if q is not None:
        block_q = BlockQ(DraftProbs(q.expand(n * k, v).contiguous(), torch.arange(v, device=device)),
                         torch.arange(n * k, device=device).view(n, k))
    flat_index = (torch.arange(n, device=device).unsqueeze(1) * (k + 1) + torch.arange(k, device=device))
    out = verify_tokens(
        draft.view(n, k), torch.full((n,), k, device=device), flat_index, probs, block_q,
        torch.multinomial(p, n, replacement=True), torch.zeros(n, dtype=torch.bool, device=device),
        torch.rand(n, k, device=device) * uniform_scale, torch.empty(n, v, device=device).exponential_(),
        torch.arange(n, device=device),
    )
    return out[:, 0]


def check_lossless(device: torch.device, n: int) -> dict:
    """Chi-square p-values that the first emitted token follows p (every case must pass
    at ALPHA) and that a rule accepting every draft does not (the control)."""
    g = torch.Generator().manual_seed(1)
    v = 12
    p = torch.rand(v, generator=g)
    p[:2] = 0
    p = (p / p.sum()).to(device)
    q = torch.rand(v, generator=g)
    q[-3:] = 0
    q = (q / q.sum()).to(device)
    torch.manual_seed(0)
    pvalues = {
        "q rule, k = 1": follows_pvalue(_emitted_first(p, torch.multinomial(q, n, True), q, 1, 1.0, device).cpu(), p.cpu()),
        "q rule, k = 3": follows_pvalue(
            _emitted_first(p, torch.multinomial(q, 3 * n, True), q, 3, 1.0, device).cpu(), p.cpu()),
        "one-hot rule (slem), k = 1": follows_pvalue(
            _emitted_first(p, torch.full((n,), 5, device=device), None, 1, 1.0, device).cpu(), p.cpu()),
    }
    # tli end to end: the drafter samples on the device from its restricted q, mapped to target ids.
    inter = intersection(64, 80).to(device)
    logits = torch.randn(64, generator=g).to(device) * 2
    step = draft_step(logits.expand(n, 64), SamplingRows.build([1.0] * n, [0] * n, [1.0] * n, [None] * n, device),
                      inter, "tli")
    pt = torch.rand(80, generator=g).to(device)
    pt = pt / pt.sum()
    out = verify_tokens(
        step.target_ids.view(n, 1), torch.ones(n, dtype=torch.long, device=device),
        torch.arange(n, device=device).view(n, 1) * 2, pt.expand(2 * n, 80).contiguous(),
        BlockQ(DraftProbs(step.verify_q, step.support), torch.arange(n, device=device).view(n, 1)),
        torch.multinomial(pt, n, replacement=True), torch.zeros(n, dtype=torch.bool, device=device),
        torch.rand(n, 1, device=device), torch.empty(n, 80, device=device).exponential_(),
        torch.arange(n, device=device),
    )
    pvalues["tli drafted on the device, k = 1"] = follows_pvalue(out[:, 0].cpu(), pt.cpu())
    # The control: uniforms of 0 accept every draft the target allows, so tokens follow
    # (mostly) q; the same test must reject that.
    control = follows_pvalue(_emitted_first(p, torch.multinomial(q, n, True), q, 1, 0.0, device).cpu(), p.cpu())
    return {"samples": n, "alpha": ALPHA, "pvalues": pvalues, "control_accept_everything_pvalue": control,
            "ok": min(pvalues.values()) > ALPHA and control < ALPHA}


def _time(call: Callable[[], object], device: torch.device, reps: int) -> float:
    """Median milliseconds of one call (CUDA events on CUDA, the host clock elsewhere)."""
    for _ in range(5):
        call()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            call()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def timings(device: torch.device, inter: VocabIntersection, reps: int) -> list[dict]:
    dev_inter = inter.to(device)
    out = []
    for b in (1, 8, 64):
        inputs = verify_inputs(b, inter, 0, device)
        logits = torch.randn(b, DRAFT_V, device=device)
        r = rows(b, device)
        out.append({
            "batch": b,
            "verify_tokens_ms": _time(lambda: verify_tokens(**inputs), device, reps),
            "draft_step_tli_ms": _time(lambda: draft_step(logits, r, dev_inter, "tli"), device, reps),
            "input_staging_ms": _time(lambda: rows(b, device), device, reps),
        })
    return out


def markdown(result: dict) -> str:
    a, s, lo = result["agreement"], result["no_sync"], result["lossless"]
    lines = [
        "# The per-step tensor work on a real GPU (no vLLM)",
        "",
        f"{result['device']}, torch {result['torch']}, {result['when']}. `benchmarks/cuda_check.py`: the verification "
        "rule and the drafter's sampling and mapping, the parts that run without vLLM (the GPU machine has none).",
        "",
        "| check | result |",
        "|---|---|",
        f"| agreement: emitted tokens, CPU vs device, {a['verify_steps']} steps of 8 rows x k = 4, V = 151,936 | "
        f"{a['rows_differing']} rows differ |",
        "| agreement: draft q, max abs difference | "
        + ", ".join(f"{k} {v:.1e}" for k, v in a["max_abs_q_difference"].items()) + " |",
        f"| agreement: greedy draft ids | {'equal' if a['greedy_draft_ids_equal'] else 'DIFFER'} |",
    ]
    if "calls" in s:
        lines.append(f"| no-sync harness: a planted `.item()` under `set_sync_debug_mode(\"error\")` | {s['planted_item']} |")
        lines += [f"| no sync: {name} | {verdict} |" for name, verdict in s["calls"].items()]
        lines.append(f"| for comparison: `torch.tensor(host list, device=\"cuda\")`, how those inputs were built "
                     f"before `host_to_device.py` | {s['pageable_copy']} |")
    else:
        lines.append(f"| no sync | {s['skipped']} |")
    lines += [f"| lossless: {name} ({lo['samples']:,} samples) | chi-square p = {pv:.3f} |" for name, pv in lo["pvalues"].items()]
    lines.append(f"| control: a rule accepting every draft | chi-square p = {lo['control_accept_everything_pvalue']:.1e} "
                 f"(must be < {ALPHA}) |")
    lines.append(f"| **all checks** | **{'pass' if result['ok'] else 'FAIL'}** |")
    if result.get("timings"):
        clock = "CUDA events" if "CPU" not in result["device"] else "host clock"
        lines += ["", f"Median ms per call ({clock}), k = 4, half the rows greedy:", "",
                  "| batch | verify_tokens | draft_step (tli, V = 49,152) | input staging |", "|---|---|---|---|"]
        lines += [f"| {t['batch']} | {t['verify_tokens_ms']:.3f} | {t['draft_step_tli_ms']:.3f} | "
                  f"{t['input_staging_ms']:.3f} |" for t in result["timings"]]
    return "\n".join(lines) + "\n"


def dry_run(args: argparse.Namespace) -> dict:
    """What a run would do, printed; runs nothing and needs no GPU."""
    lines = ["# benchmarks/cuda_check.py: the plan (dry run, nothing runs)", "",
             f"Tensor stage, on `{args.device}` (torch only, no vLLM): agreement with the CPU over {args.seeds} "
             f"verification steps; no host sync under `torch.cuda.set_sync_debug_mode(\"error\")`; "
             f"4 lossless chi-square tests of {args.samples:,} samples and a control"
             + ("" if args.no_timings else "; CUDA-event timings at batch 1, 8, 64") + "."]
    if args.no_engine:
        lines.append("Engine stage: off (`--no-engine`).")
    else:
        lines += ["", "Engine stage (vLLM on CUDA):", *[f"- {line}" for line in gpu_engine_check.plan()],
                  "", "It needs:", *[f"- {need}" for need in gpu_engine_check.NEEDS]]
    lines += ["", f"Writes `cuda_check.json` and `cuda_check.md` to `{args.out}`."]
    print("\n".join(lines))
    return {"ok": True, "dry_run": True, "plan": lines}


def refusal(args: argparse.Namespace) -> str | None:
    """Why this run cannot go ahead here (None: it can)."""
    if args.device == "cpu":
        return None if args.no_engine else "the engine stage needs CUDA: add --no-engine to run the tensor checks on CPU"
    if not torch.cuda.is_available():
        return (f"no CUDA device here (torch {torch.__version__}): this check runs on an NVIDIA GPU. "
                "`--dry-run` shows what it would run; `--device cpu --no-engine` runs the tensor checks on the CPU.")
    if not args.no_engine and installed_release() not in SUPPORTED_VERSIONS:
        return (f"the engine stage needs the CUDA build of vLLM {' or '.join(SUPPORTED_VERSIONS)}, found "
                f"{installed_release() or 'none'} (pip install 'vllm>=0.32.0,<0.34'); or add --no-engine")
    return None


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description="The one-command GPU check: tensor stage (torch), engine stage (vLLM).")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--samples", type=int, default=400_000, help="verification blocks per chi-square test")
    ap.add_argument("--seeds", type=int, default=20, help="verification steps compared with the CPU")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--no-timings", action="store_true")
    ap.add_argument("--no-engine", action="store_true", help="the tensor stage only (machines without vLLM)")
    ap.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    ap.add_argument("--out", type=Path, default=results_dir())
    args = ap.parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    why = refusal(args)
    if why is not None:
        print(f"cuda_check: refusing to run: {why}", file=sys.stderr)
        raise SystemExit(2)
    device = torch.device(args.device)
    inter = intersection(DRAFT_V, TARGET_V)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.machine()})"
    result = {
        "device": name, "torch": torch.__version__, "vllm": None if args.no_engine else installed_release(),
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "agreement": check_agreement(device, inter, args.seeds),
        "no_sync": check_no_sync(device, inter),
        "lossless": check_lossless(device, args.samples),
        "timings": None if args.no_timings else timings(device, inter, args.reps),
    }
    parts = ["agreement", "no_sync", "lossless"]
    text_parts = []
    if not args.no_engine:
        result["engine"] = gpu_engine_check.run()
        parts.append("engine")
        text_parts = gpu_engine_check.markdown(result["engine"])
    result["ok"] = all(result[part]["ok"] for part in parts)
    text = markdown(result) + "".join(line + "\n" for line in text_parts)
    if result["vllm"]:
        text += f"\nThe engine stage ran on vLLM {result['vllm']}.\n"
    write_report("cuda_check", result, text, out=args.out, indent=1)
    print(text)
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
