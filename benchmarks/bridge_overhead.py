"""Per-step bridge overhead: re-tokenization + DTW alignment, per request per step.

Replays real text through the real tokenizers (SmolLM2 draft, Qwen2.5-Coder target):
each simulated step commits k+1 target tokens, realigns the draft tokenization
(look-behind re-encode), re-tokenizes k draft tokens' text into target tokens, and
aligns draft and proxy tokens by DTW (w = 8). The compiled DTW is compared with a
plain-Python reference kept here for that purpose.

    .venv/bin/python benchmarks/bridge_overhead.py

Writes benchmarks/results/bridge.json and bridge.md.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from vllm_hetero_spec.alignment import PackedVocab, dtw_align_batch
from vllm_hetero_spec.models import ensure_model
from vllm_hetero_spec.prompts import spec_bench_questions
from vllm_hetero_spec.vocab.bridge import VocabBridge
from vllm_hetero_spec.vocab.retokenize import AlignedTokens, propose_continuation

OUT = Path(__file__).parent / "results"


def python_dtw(a: list[bytes], b: list[bytes], w: int) -> int:
    """Reference: the same banded DTW with Levenshtein cost, in plain Python."""

    def lev(x: bytes, y: bytes) -> int:
        row = list(range(len(y) + 1))
        for i in range(1, len(x) + 1):
            prev, row[0] = row[0], i
            for j in range(1, len(y) + 1):
                cur = min(row[j] + 1, row[j - 1] + 1, prev + (x[i - 1] != y[j - 1]))
                prev, row[j] = row[j], cur
        return row[-1]

    n, m, inf = len(a), len(b), float("inf")
    d = [[inf] * m for _ in range(n)]
    for i in range(n):
        center = 0 if n <= 1 else (i * (m - 1) + (n - 1) // 2) // (n - 1)
        for j in range(max(0, center - w), min(m, center + w + 1)):
            prev = 0 if i == j == 0 else min(
                d[i - 1][j - 1] if i and j else inf, d[i - 1][j] if i else inf, d[i][j - 1] if j else inf)
            d[i][j] = prev + lev(a[i], b[j])
    return int(d[-1][-1])


def main() -> None:
    draft_path, target_path = str(ensure_model("smollm2-135m")), str(ensure_model("qwen2.5-coder-1.5b"))
    bridge = VocabBridge.build(draft_path, target_path, 49152, 151936)
    denc, tenc = bridge.draft_encoder, bridge.target_encoder
    dpack, tpack = PackedVocab.build(denc.token_bytes), PackedVocab.build(tenc.token_bytes)
    texts = spec_bench_questions(64)
    rows = []
    for k in (4, 8):
        for batch in (1, 16, 64):
            streams = [bridge.target_tokenizer.encode(texts[i % len(texts)] * 3, add_special_tokens=False)
                       for i in range(batch)]
            drafts = [bridge.draft_tokenizer.encode(texts[(i + 1) % len(texts)], add_special_tokens=False)
                      for i in range(batch)]
            states = [AlignedTokens(denc, [], 4) for _ in range(batch)]
            texts_b = [bytearray() for _ in range(batch)]
            for i in range(batch):  # prompt: 16 target tokens
                for t in streams[i][:16]:
                    texts_b[i] += tenc.bytes_of(t)
                states[i].sync(texts_b[i])
            steps, retok_s, dtw_s, py_s = 8, 0.0, 0.0, 0.0
            for s in range(steps):
                lo = 16 + s * (k + 1)
                t0 = time.perf_counter()
                proxies, bodies = [], []
                for i in range(batch):
                    for t in streams[i][lo : lo + k + 1]:
                        texts_b[i] += tenc.bytes_of(t)
                    states[i].sync(texts_b[i])
                    body = drafts[i][s * k : (s + 1) * k]
                    text = b"".join(denc.bytes_of(t) for t in body)
                    proxies.append(propose_continuation(tenc, streams[i][lo + k - 3 : lo + k + 1], text, k))
                    bodies.append(body)
                t1 = time.perf_counter()
                dtw_align_batch(bodies, proxies, dpack, tpack, 8)
                t2 = time.perf_counter()
                for body, proxy in zip(bodies, proxies):
                    if body and proxy:
                        python_dtw([denc.bytes_of(t) for t in body], [tenc.bytes_of(t) for t in proxy], 8)
                t3 = time.perf_counter()
                retok_s, dtw_s, py_s = retok_s + t1 - t0, dtw_s + t2 - t1, py_s + t3 - t2
            per = steps * batch
            rows.append({
                "k": k, "batch": batch,
                "retokenize_us": 1e6 * retok_s / per, "dtw_compiled_us": 1e6 * dtw_s / per,
                "dtw_python_us": 1e6 * py_s / per, "dtw_speedup": py_s / dtw_s if dtw_s else None,
            })
            print(rows[-1], flush=True)
    OUT.mkdir(exist_ok=True)
    (OUT / "bridge.json").write_text(json.dumps(rows, indent=2))
    lines = ["| k | batch | re-tokenization µs/req/step | DTW compiled µs/req/step | DTW Python µs/req/step | DTW speedup |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['k']} | {r['batch']} | {r['retokenize_us']:.1f} | {r['dtw_compiled_us']:.1f} | "
                     f"{r['dtw_python_us']:.1f} | {r['dtw_speedup']:.0f}x |")
    (OUT / "bridge.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
