"""Would an int8 drafter pay on this CPU? vLLM's own W8A8 int8 GEMM against float32.

A drafter's forward at batch 1 reads its weights once (SmolLM2-135M in float32: about
540 MB), so int8 weights, a quarter of the bytes, looked like the way to a cheaper draft
token on a CPU without native bf16. vLLM's CPU build runs int8 linear layers through
oneDNN (``create_onednn_scaled_mm``: per-channel weight scales, dynamic per-token
activation scales, the kernel its compressed-tensors W8A8 path uses). This times that
kernel and vLLM's float32 one (``create_onednn_mm``) on the drafter's layer shapes
(SmolLM2-135M: hidden 576, 9 query and 3 KV heads of 64, MLP 1536, 30 layers, a 49,152
row output layer), per forward, before building anything on it.

    .venv/bin/python benchmarks/int8_gemm.py

Writes benchmarks/results/int8_gemm.{json,md}.
"""

from __future__ import annotations

import argparse
import time

import torch
from report import median, meta as run_meta, table, write_report

LAYERS = 30
# (in, out) of one decoder layer's linear layers: qkv, o, gate_up, down.
LAYER_SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)]
HEAD = (576, 49152)


def per_call_ms(fn, calls: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean time of ``calls`` calls, after a warm-up."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e3)
    return median(times)


def time_shape(rows: int, k: int, n: int, calls: int, repeats: int) -> dict:
    """float32 and int8 ms per call for ``[rows, k] @ [k, n]``, and the int8 error."""
    import vllm._custom_ops as ops

    w = torch.randn(n, k) * 0.05
    x = torch.randn(rows, k)
    f32 = ops.create_onednn_mm(w.t(), 128)
    scale = (w.abs().amax(dim=1, keepdim=True) / 127).float()
    w8 = torch.round(w / scale).clamp(-128, 127).to(torch.int8)
    i8 = ops.create_onednn_scaled_mm(w8.t(), scale.view(-1), torch.float32, True, False)
    out = torch.empty(rows, n)

    def int8() -> torch.Tensor:
        xq, xs, _ = ops.onednn_scaled_int8_quant(x)
        return ops.onednn_scaled_mm(i8, xq, out, xs, None, None, None)

    ref = torch.nn.functional.linear(x, w)
    err = float((int8() - ref).norm() / ref.norm())
    return {"rows": rows, "k": k, "n": n,
            "float32_ms": per_call_ms(lambda: ops.onednn_mm(f32, x, None), calls, repeats),
            "int8_ms": per_call_ms(int8, calls, repeats), "int8_rel_error": err}


def to_markdown(results: list[dict], meta: dict) -> str:
    lines = [
        "The drafter's linear layers (SmolLM2-135M shapes) through vLLM 0.32.0's CPU GEMMs: float32 "
        "(`create_onednn_mm`) against W8A8 int8 (`create_onednn_scaled_mm`, dynamic per-token activation "
        f"scales), {meta['threads']} threads, medians. Per forward = {LAYERS} layers + the output layer. "
        f"`benchmarks/int8_gemm.py`; machine: {meta['machine']} (flags: {meta['flags']}), {meta['date']}.",
        "",
    ]
    body = []
    for rows in sorted({r["rows"] for r in results}):
        mine = [r for r in results if r["rows"] == rows]
        head = next(r for r in mine if (r["k"], r["n"]) == HEAD)
        f32 = sum(r["float32_ms"] * (1 if r is head else LAYERS) for r in mine)
        i8 = sum(r["int8_ms"] * (1 if r is head else LAYERS) for r in mine)
        err = max(r["int8_rel_error"] for r in mine)
        body.append([rows, f"{f32:.1f}", f"{i8:.1f}", f"{i8 / f32:.1f}x", f"{head['float32_ms']:.2f}",
                     f"{head['int8_ms']:.2f}", f"{err:.3f}"])
    lines += table(["rows", "per forward float32 ms", "per forward int8 ms", "int8 / float32",
                    "output layer float32 ms", "output layer int8 ms", "int8 relative error"], body)
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results = [time_shape(rows, k, n, args.calls, args.repeats)
               for rows in args.rows for k, n in LAYER_SHAPES + [HEAD]]
    from vllm_hetero_spec.drafter.runtime.draft_dtype import cpu_flags

    flags = sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "f16c")))
    meta = run_meta(args, flags=" ".join(flags), threads=args.threads)
    write_report("int8_gemm", {"meta": meta, "results": results}, to_markdown(results, meta))
    print(to_markdown(results, meta))


if __name__ == "__main__":
    main()
