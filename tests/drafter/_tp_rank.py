"""One rank of ``test_tensor_parallel_drafts.py``'s two-rank group: the real proposer
over a real ``GroupCoordinator`` (gloo, CPU), with a scripted draft model; writes what
this rank verifies each step, for each fault in turn (one process pair for all: each
start imports vLLM).

    python _tp_rank.py RANK PORT SMOLLM2 QWEN05 OUT FAULT...
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))

from test_proposer_token_level import ScriptedRuntime, target_config  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.distributed.parallel_state import GroupCoordinator  # noqa: E402

from vllm_hetero_spec.vllm_integration import proposer as proposer_module  # noqa: E402
from vllm_hetero_spec.config import HeteroSettings  # noqa: E402
from vllm_hetero_spec.drafter import batch_drafter as engine_module  # noqa: E402
from vllm_hetero_spec.vocab.bridge import load_tokenizer  # noqa: E402

STEPS = 3
TOKEN = 1820  # a shared draft token, scripted at every position


class FaultyRuntime(ScriptedRuntime):
    """Rank 1's drafter, where it has one: ``raise`` fails every forward; ``last-bit``
    moves every logit by one unit in the last place (another kernel's rounding)."""

    fault = ""

    def forward(self, caches, new_tokens):
        if self.fault == "raise":
            raise RuntimeError("rank 1's drafter failed")
        logits = super().forward(caches, new_tokens)
        return torch.nextafter(logits, torch.full_like(logits, float("inf"))) if self.fault == "last-bit" else logits


def main(rank: int, port: int, smollm2: str, qwen05: str, out: str, faults: list[str]) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    group = GroupCoordinator([[0, 1]], local_rank=rank, torch_distributed_backend="gloo", use_device_communicator=False)
    FaultyRuntime.script, FaultyRuntime.confidence = [TOKEN], {0: 0.6, 1: 0.7, 2: 0.8}
    engine_module.DraftModel = FaultyRuntime
    proposer_module.tp_group = lambda: group
    results = {}
    for fault in faults:
        FaultyRuntime.fault = fault if rank == 1 else ""
        results[fault] = _steps(smollm2, qwen05)
    with open(out, "wb") as f:
        pickle.dump(results, f)
    torch.distributed.destroy_process_group()


def _steps(smollm2: str, qwen05: str) -> dict:
    """A fresh proposer's ``STEPS`` steps: what this rank verifies each step."""
    settings = HeteroSettings(algorithm="tli", draft_model=smollm2, draft_tokenizer=smollm2, num_speculative_tokens=3,
                              max_draft_tokens=3, draft_budget="fixed", draft_kv_pool_mb=64, draft_dtype="float32")
    prop = proposer_module.HeteroProposer(target_config(settings, qwen05))
    prop.load_model(None)
    order = ["greedy", "sampled"]
    requests = {"greedy": SamplingParams(temperature=0.0), "sampled": SamplingParams(temperature=1.0)}
    states = {r: SimpleNamespace(sampling_params=p, output_token_ids=[]) for r, p in requests.items()}
    prop.attach_runner(SimpleNamespace(input_batch=SimpleNamespace(req_ids=order), requests=states))
    prompt = load_tokenizer(qwen05).encode("The quick brown fox jumps over the")
    seen = []
    for step in range(STEPS):
        tokens = np.array([prompt + [prompt[-1]] * step] * len(order))
        proposals = prop.propose([[prompt[-1]]] * len(order), np.array([tokens.shape[1]] * len(order)), tokens)
        plan = prop.take_verify_plan()
        q = None if plan is None or plan.q is None else (plan.q.probs.numpy().tobytes(), plan.q.support.tolist())
        seen.append({"proposals": proposals, "q": q, "q_index": None if plan is None else plan.q_index,
                     "force_reject": None if plan is None else plan.force_reject})
    return {"steps": seen, "drafter": prop.host is not None, "fallbacks": prop.stats.fallbacks,
            "budget_steps": prop.stats.budget_steps}


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:6], sys.argv[6:])
