"""Run in a child process by test_lifecycle.py: one engine whose target KV cache is 4
blocks, so that both halves of the lifecycle happen in it. First aborts and finished
requests must leave no per-request draft state behind; then four requests that outgrow
a block make vLLM preempt running requests (their draft state dropped, rebuilt when they
resume). The engine drafts with fsd at tau = 0 over the drafter's 16384 most frequent
tokens (``draft_head_tokens``), a setting of the engine that test_e2e_rules.py's rows
would otherwise need an engine of their own for: so it then runs those rows too (greedy,
sampled and seeded; the seeded ones again alone). Prints one JSON line with what it
observed and the token ids of the preempted batch and of the rules' rows."""

from __future__ import annotations

import json
import os
import sys

# An extra configuration, in process: this job steps the engine and reads the drafter's own
# objects between steps (_find_drafter), so the engine core runs in this process, not in
# vLLM's default process of its own (what every run_job engine and server uses).
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

from _gemma_pair import FSD, GREEDY, SAMPLED, SEEDED, engine_rows, prompts, spans
from hetero_harness.evaluation import RESULT_PREFIX, _find_drafter
from hetero_harness.prompts import BRIDGE_STRESS
from vllm_hetero_spec.advise.counters import spec_decode_delta


def _fsd_rows(llm: LLM, target: str) -> dict:
    """The rules' rows (``_gemma_pair``: greedy, sampled, seeded) in one batch, then the
    seeded ones alone: ``{rows name: token ids}``, and the drafts accepted."""
    before = {m.name: m for m in llm.get_metrics()}
    groups, ids = (GREEDY, SAMPLED, SEEDED), prompts(target)
    rows, params = engine_rows(groups, ids)
    out = [list(o.outputs[0].token_ids)
           for o in llm.generate([TokensPrompt(prompt_token_ids=p) for p in rows], params, use_tqdm=False)]
    seeded = -SEEDED.count
    alone = [list(llm.generate([TokensPrompt(prompt_token_ids=p)], [sp], use_tqdm=False)[0].outputs[0].token_ids)
             for p, sp in zip(rows[seeded:], params[seeded:])]
    result = {group.name: out[start:start + n] for group, (start, n) in zip(groups, spans(groups, ids))}
    return {**result, "seeded_alone": alone,
            "num_accepted_tokens": spec_decode_delta(before, llm.get_metrics())["num_accepted_tokens"]}


def main(target: str, draft: str, preempt: dict) -> None:
    """``preempt``: the preemption half's prompts (token ids), tokens, KV blocks and
    context (test_lifecycle.py)."""
    llm = LLM(
        model=target,
        dtype="float32",
        max_model_len=preempt["max_model_len"],
        num_gpu_blocks_override=preempt["num_kv_blocks"],
        # One KV cache group, so that the block count is the requests' room: Gemma-3's
        # sliding-window and full-attention layers would otherwise take blocks of their
        # own groups for each request (vLLM's hybrid KV cache manager). The window (512)
        # exceeds the context (256), so attention is the same either way.
        disable_hybrid_kv_cache_manager=True,
        enforce_eager=True,
        disable_log_stats=False,
        # A fixed draft length: every step drafts, so every request has draft state to
        # leak, and preempted requests have draft state to rebuild.
        speculative_config={"method": "hetero", "model": draft, "num_speculative_tokens": 4, "draft_budget": "fixed",
                            **FSD},
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
    before = {m.name: m for m in llm.get_metrics()}
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in preempt["prompts"]], SamplingParams(max_tokens=preempt["max_tokens"], temperature=0.0,
                                                              ignore_eos=True), use_tqdm=False)
    spec = spec_decode_delta(before, llm.get_metrics())
    result = {"peak": peak, "finished": sorted(finished), "after_all": after_all, "during_next": during_next,
              "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
              "num_preemptions": spec["num_preemptions"], "num_accepted_tokens": spec["num_accepted_tokens"],
              "fsd": _fsd_rows(llm, target), "fallbacks": drafter.stats.fallbacks}
    print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
