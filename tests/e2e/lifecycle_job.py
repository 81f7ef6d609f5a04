"""Run in a child process by test_lifecycle.py: aborts and finished requests must leave
no per-request draft state behind. Prints one JSON line with what it observed."""

from __future__ import annotations

import json
import os
import sys

# An extra configuration, in process: this job steps the engine and reads the drafter's own
# objects between steps (_find_drafter), so the engine core runs in this process, not in
# vLLM's default process of its own (what every run_job engine and server uses).
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from vllm import LLM, SamplingParams

from hetero_harness.evaluation import RESULT_PREFIX, _find_drafter
from hetero_harness.prompts import BRIDGE_STRESS


def main(target: str, draft: str) -> None:
    llm = LLM(
        model=target,
        dtype="float32",
        max_model_len=1024,
        enforce_eager=True,
        # A fixed draft length: every step drafts, so every request has draft state to leak.
        speculative_config={"method": "hetero", "model": draft, "num_speculative_tokens": 3, "algorithm": "slem",
                            "draft_budget": "fixed"},
    )
    engine = llm.llm_engine
    drafter = _find_drafter(llm)
    for i, prompt in enumerate(BRIDGE_STRESS[:6]):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=40 if i < 3 else 6, temperature=0.0))
    peak = 0
    for _ in range(4):
        engine.step()
        peak = max(peak, len(drafter.states))
    engine.abort_request(["r0", "r1"])
    finished = []
    while engine.has_unfinished_requests():
        finished += [o.request_id for o in engine.step() if o.finished]
    after_all = len(drafter.states)
    engine.add_request("z", BRIDGE_STRESS[7], SamplingParams(max_tokens=12, temperature=0.0))
    during_next = []
    while engine.has_unfinished_requests():
        engine.step()
        during_next.append(len(drafter.states))
    result = {"peak": peak, "finished": sorted(finished), "after_all": after_all, "during_next": during_next}
    print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
