"""Every tensor-parallel rank verifies the proposals the scheduler runs (rank 0's) with
the q they were drawn from, whatever happens on the other ranks: a real two-rank group
(vLLM's ``GroupCoordinator`` over gloo, two processes) around the real proposer, its
draft model scripted. Rank 1's drafter, where the design gives it one, either raises or
rounds its logits one unit in the last place differently; what each rank would verify
must still be identical, byte for byte."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from hetero_harness.server_process import free_port

RANK = Path(__file__).with_name("_tp_rank.py")


FAULTS = ["raise", "last-bit"]


@pytest.fixture(scope="module")
def ranks(smollm2: str, qwen05: str, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Each rank's steps per fault, from one process pair."""
    port, folder = free_port(), tmp_path_factory.mktemp("tp")
    outs = [folder / f"rank{r}.pkl" for r in range(2)]
    procs = [subprocess.Popen([sys.executable, str(RANK), str(r), str(port), smollm2, qwen05, str(outs[r]), *FAULTS],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(f"rank {r}: {log[-3000:]}" for r, log in enumerate(logs))
    return [pickle.loads(o.read_bytes()) for o in outs]


@pytest.mark.parametrize("fault", FAULTS)
def test_every_rank_verifies_rank_zeros_drafts_with_their_q(fault: str, ranks: list[dict]) -> None:
    rank0, rank1 = (r[fault] for r in ranks)
    assert rank0["fallbacks"] == 0 and rank0["drafter"]
    drafted = [s for s in rank0["steps"] if any(s["proposals"]) and s["q"] is not None]
    assert len(drafted) == len(rank0["steps"]), "rank 0 drafted, with q for its sampled request, every step"
    assert rank1["steps"] == rank0["steps"]
    # Only rank 0 plans: the others neither load a drafter nor run the budget.
    assert not rank1["drafter"] and rank1["budget_steps"] == 0 < rank0["budget_steps"]
