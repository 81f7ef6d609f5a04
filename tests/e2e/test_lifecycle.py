"""Per-request draft state is created, dropped on finish, abort and preemption, never
leaked; preempted requests still give the target's own output.

One hetero engine on the Gemma pair (``lifecycle_job.py``, in process, a target KV cache
of 4 blocks of 128 tokens) runs both halves: aborts and finished requests, then four
requests that each grow past one block, so vLLM preempts running requests. The reference
is the session's target alone (``conftest.gemma_alone``), whose engine also serves the
rules' and the Ray module's comparisons.

The engine drafts with ``fsd`` at tau = 0 over SmolLM2's 16384 most frequent tokens
(``draft_head_tokens``: a q that is 0 on two thirds of the vocabulary), an engine-wide
setting that had an engine of its own in ``test_e2e_rules.py``; so it also runs that
module's rows for fsd, held to the same claims: the greedy rows the target alone's, the
sampled rows' tokens at the drafted positions the target alone's law (the same
two-sample test and reference), and the seeded rows the same in the batch and alone.
What that gives up: fsd's rows now run four at a time (the cache holds four requests),
not in a batch of 74, and its seeded rows are compared with themselves alone, not with
the rules engines' (which compare theirs with each other); a rule gone wrong still
fails the identity and distribution tests. The lifecycle claims do not depend on the rule.

What this gives up: the lifecycle half ran 6 concurrent requests on a roomier cache (3
run at once here, so the peak it checks is 3 states, not 4); an abort or a finish that
leaks state is caught all the same. The reference ran on the same 4-block cache, so it
was preempted too; it now runs on a cache with room for every row, so preempted
requests (resumed by recomputing their tokens in a prefill) are held to the output of
requests never preempted, a claim at least as strong.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _gemma_pair import PREEMPT, SAMPLED, SEEDED, SEEDS, group_prompts, prompts
from hetero_harness.cores import lease
from hetero_harness.evaluation import RESULT_PREFIX, default_env, unwrap
from hetero_harness.prompts import BRIDGE_STRESS

from _stats import two_sample_pvalue

#: The preemption half: 4 requests of 140 tokens (2 blocks each) in 4 blocks of 128 tokens.
KV = {"num_kv_blocks": 4, "max_model_len": 256}


@pytest.fixture(scope="module")
def runs(gemma: str, smollm2: str, gemma_alone, count_rows) -> tuple[dict, dict]:
    """The lifecycle job, and the target alone's rows of the same prompts."""
    count_rows(SAMPLED.count)
    preempt = {"prompts": group_prompts(PREEMPT, prompts(gemma)), "max_tokens": PREEMPT.max_tokens, **KV}
    with lease(1) as held:  # the job on a core of its own (vLLM's binding follows the process's)
        proc = subprocess.run([sys.executable, str(Path(__file__).with_name("lifecycle_job.py")), gemma, smollm2,
                               json.dumps(preempt)], capture_output=True, text=True, timeout=1200, env=default_env(),
                              preexec_fn=lambda: os.sched_setaffinity(0, held.cores))
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    assert line, proc.stderr[-4000:]
    alone = gemma_alone.results()
    return json.loads(line[-1][len(RESULT_PREFIX):]), {
        name: unwrap(alone[name])["token_ids"] for name in ("preempt", "greedy", "sampled")}


def test_aborted_and_finished_requests_leave_no_state(runs: tuple[dict, dict]) -> None:
    res, _ = runs
    assert res["peak"] >= 3, res  # state was really created for concurrent requests
    assert set(res["finished"]) == {"r2", "r3", "r4", "r5"}, res
    # Once the next request is scheduled, only its own state exists.
    assert res["during_next"] and max(res["during_next"]) == 1, res


def test_preemption_gives_the_target_alone_output(runs: tuple[dict, dict]) -> None:
    """Preempted requests (their draft state dropped and rebuilt when they resume): T = 0
    outputs stay exactly the target's own."""
    spec, plain = runs
    assert spec["num_preemptions"] > 0, "no preemption happened: the test proves nothing"
    assert spec["token_ids"] == plain["preempt"]
    assert spec["num_accepted_tokens"] > 0 and spec["fallbacks"] == 0


def test_fsd_greedy_rows_identical_to_target_alone(runs: tuple[dict, dict]) -> None:
    spec, plain = runs
    fsd = spec["fsd"]
    assert fsd["num_accepted_tokens"] > 0 and spec["fallbacks"] == 0, fsd["num_accepted_tokens"]
    for prompt, want, got in zip(BRIDGE_STRESS, plain["greedy"], fsd["greedy"], strict=True):
        assert got == want, f"fsd: output differs for prompt {prompt!r}"


def test_fsd_sampled_rows_follow_the_target_alone_law(runs: tuple[dict, dict]) -> None:
    """At T = 1 with top-k and top-p, the tokens at the drafted positions (1 and 2)
    against the target alone's (test_e2e_rules.py's test, its power in its docstring)."""
    spec, plain = runs
    got = spec["fsd"]["sampled"]
    assert len(got) == SAMPLED.count
    for pos in (1, 2):
        p = two_sample_pvalue([o[pos] for o in plain["sampled"]], [o[pos] for o in got])
        assert p > 1e-3, f"fsd: position {pos} distribution differs from the target's (p={p:.1e})"


def test_fsd_seeded_rows_repeat_alone(runs: tuple[dict, dict]) -> None:
    spec, _ = runs
    fsd = spec["fsd"]
    assert len(fsd["seeded"]) == SEEDED.count and all(len(t) == SEEDED.max_tokens for t in fsd["seeded"])
    assert fsd["seeded"] == fsd["seeded_alone"]
    assert len({tuple(t) for t in fsd["seeded"]}) == len(SEEDS)
