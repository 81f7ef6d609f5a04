"""What sharing the drafts costs under tensor parallelism: rank 0's drafts and q to
rank 1, per engine step, on CPU (gloo), as ``vllm_integration.drafts_broadcast.share_drafts`` sends them.

Two processes form a real two-rank group (vLLM's ``GroupCoordinator``). Rank 0 builds a
step's drafts for a batch -- k proposals per row, every row sampled, so every position
carries a q row over the real SmolLM2 -> Qwen2.5 intersection's support (the most a
step sends) -- and both ranks time ``share_drafts``, against the plan-only broadcast the
in-process design sent before (each row's length and rule). Medians over ``--reps``.

    .venv/bin/python benchmarks/tp_broadcast.py [--batches 1 8 32] [--reps 50]

Writes benchmarks/results/tp_broadcast.json and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from report import fmt, table, write_report

K = 4


def _rank(rank: int, port: int, batches: list[int], support: int, reps: int, out: str) -> None:
    import torch
    from vllm.distributed.parallel_state import GroupCoordinator

    from vllm_hetero_spec.drafter.messages import StepDrafts
    from vllm_hetero_spec.vllm_integration.drafts_broadcast import share_drafts
    from vllm_hetero_spec.verify.draft_probs import DraftProbs

    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    group = GroupCoordinator([[0, 1]], local_rank=rank, torch_distributed_backend="gloo", use_device_communicator=False)
    results = {}
    for b in batches:
        drafts = None
        if rank == 0:
            probs = torch.rand(b * K, support).softmax(dim=-1)
            drafts = StepDrafts([[7] * K for _ in range(b)], DraftProbs(probs, torch.arange(support)),
                                [list(range(i * K, (i + 1) * K)) for i in range(b)], ready=[True] * b)
        rows = list(range(b))
        plan = ([K] * b, ["tli"] * b)
        timings = {"drafts": [], "plan": []}
        for rep in range(reps + 3):
            group.barrier()
            t0 = time.perf_counter()
            got, _ = share_drafts(group, drafts, rows)
            t1 = time.perf_counter()
            group.broadcast_object(plan if rank == 0 else None, src=0)
            t2 = time.perf_counter()
            if rep >= 3:
                timings["drafts"].append(t1 - t0)
                timings["plan"].append(t2 - t1)
        assert got.q.probs.shape == (b * K, support)
        results[b] = {name: statistics.median(ts) * 1e3 for name, ts in timings.items()}
        results[b]["q_bytes"] = b * K * support * 4
    Path(out).write_text(json.dumps(results))
    torch.distributed.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--support", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:
        _rank(args.rank, args.port, args.batches, args.support, args.reps, args.out)
        return

    from hetero_harness.models import ensure_model
    from hetero_harness.server_process import free_port
    from vllm_hetero_spec.vocab.bridge import VocabBridge

    draft, target = str(ensure_model("smollm2-135m")), str(ensure_model("qwen2.5-coder-0.5b"))
    support = int(VocabBridge.build(draft, target, 49152, 151936).intersection.support.numel())
    port = free_port()
    outs = [Path(f"/tmp/tp_broadcast_rank{r}.json") for r in range(2)]
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--port", str(port), "--support",
                               str(support), "--out", str(outs[r]), "--reps", str(args.reps), "--batches",
                               *map(str, args.batches)]) for r in range(2)]
    for p in procs:
        assert p.wait() == 0
    ranks = [json.loads(o.read_text()) for o in outs]
    rows = []
    for b in args.batches:
        r0, r1 = ranks[0][str(b)], ranks[1][str(b)]
        rows.append([b, b * K, f"{r0['q_bytes'] / 2**20:.1f}", fmt(max(r0["drafts"], r1["drafts"]), ".2f"),
                     fmt(max(r0["plan"], r1["plan"]), ".3f")])
    data = {"args": vars(args), "support": support, "k": K, "ranks": ranks}
    md = [f"TP = 2 on CPU (gloo), k = {K}, every row sampled: q rows over the {support}-token shared support. "
          "Milliseconds per engine step, median over the reps, the slower rank's.", "",
          *table(["batch", "q rows", "q MiB", "drafts + q (now)", "lengths + rules (before)"], rows)]
    write_report("tp_broadcast", data, md, title="Sharing rank 0's drafts under tensor parallelism")


if __name__ == "__main__":
    main()
