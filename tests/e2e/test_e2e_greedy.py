"""T = 0 on the Qwen pair (SmolLM2-135M drafting for Qwen2.5-Coder-0.5B, a byte-level
BPE target): heterogeneous speculation in real vLLM gives exactly the target's own
output, with the adaptive draft budget.

Real engines, real models, float32 (bf16 rounding differs between one- and multi-token
forwards, see README). The shipped config (``algorithm: auto``) with vLLM's default
flags, as users run it (torch.compile, and the profile run that sends the rejection
sampler dummy drafts with no request), in a batch that mixes the greedy requests with
as many sampled ones (seeded, T = 1), so its rows draft with different rules in one
step, beside the target alone under the same flags (two processes side by side): the
greedy rows must be the target's own output.

Every rule, each in batches that mix greedy and sampled rows, runs on the Gemma pair in
test_e2e_rules.py (``slrs`` on the Qwen tokenizer: tests/drafter/test_proposer_token_level.py);
the Ray executor's greedy identity on this pair, faults included, in test_ray_executor.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from hetero_harness.evaluation import run_isolated_many, unwrap
from hetero_harness.prompts import BRIDGE_STRESS


MAX_TOKENS = 24


# min_p and logit_bias, which vLLM refuses under speculation and method hetero accepts:
# four prompts at T = 0 with a logit_bias that changes the target's output, and four at
# T = 1 with min_p = 1, which leaves only the argmax (so their output is the greedy one).
BIASED = BRIDGE_STRESS[:4]
MIN_P = BRIDGE_STRESS[4:8]
# Every other SamplingParams field plain decoding applies to the tokens, one request
# each at T = 0 (docs/verification.md's table points here).
CODE = "def merge_sorted(a, b):"
PARAMS: dict[str, tuple[str, dict]] = {
    "repetition_penalty": (CODE, {"repetition_penalty": 1.3}),
    "presence and frequency penalties": (CODE, {"presence_penalty": 1.0, "frequency_penalty": 0.7}),
    "bad_words": (CODE, {"bad_words": [" the", "(", " if"]}),
    "allowed_token_ids": (CODE, {"allowed_token_ids": list(range(4000))}),
    "min_tokens": ("The capital of France is Paris.<|endoftext|>", {"min_tokens": 16}),
    "stop strings": (CODE, {"stop": ["\n"], "include_stop_str_in_output": True}),
    "logprobs": (CODE, {"logprobs": 3}),
    "prompt_logprobs": (CODE, {"prompt_logprobs": 2}),
    "n = 2": (BRIDGE_STRESS[1], {"n": 2, "temperature": 1.0, "min_p": 1.0}),  # n > 1 needs T > 0; min_p = 1: greedy
}


def _job(target: str, eager: bool, bias: dict[int, float], spec: dict | None = None, mixed: bool = False) -> dict:
    """The greedy requests (first), the biased ones, one per :data:`PARAMS` field, then
    with ``mixed`` the greedy prompts sampled (seeded, T = 1) and the min_p ones."""
    requests = [(p, 0.0, None, {}) for p in BRIDGE_STRESS] + [(p, 0.0, None, {"logit_bias": bias}) for p in BIASED]
    requests += [(prompt, 0.0, None, params) for prompt, params in PARAMS.values()]
    if mixed:
        requests += [(p, 1.0, i, {}) for i, p in enumerate(BRIDGE_STRESS)]
        requests += [(p, 1.0, None, {"min_p": 1.0}) for p in MIN_P]
    prompts, temps, seeds, params = (list(column) for column in zip(*requests))
    return {
        "target": target,
        "prompts": prompts,
        "max_tokens": MAX_TOKENS,
        "temperatures": temps,
        "params": params,
        "request_seeds": seeds,
        "max_model_len": 1024,
        "speculative_config": spec,
        "warmup": False,
        "enforce_eager": eager,
    }


SHIPPED = json.loads((Path(__file__).parents[2] / "configs" / "hetero.json").read_text())


@pytest.fixture(scope="module")
def runs(qwen05: str, smollm2: str) -> dict[str, dict | Exception]:
    """The shipped config's mixed batch and the target alone, both with vLLM's default
    flags, side by side."""
    spec = {**{k: v for k, v in SHIPPED.items() if k != "model"}, "method": "hetero", "model": smollm2}
    tok = AutoTokenizer.from_pretrained(qwen05)
    bias = {tok.convert_tokens_to_ids("Ġthe"): 8.0, tok.convert_tokens_to_ids("Ċ"): -100.0}  # " the", newline
    plain, shipped = run_isolated_many([_job(qwen05, eager=False, bias=bias),
                                        _job(qwen05, eager=False, bias=bias, spec=spec, mixed=True)])
    return {"plain": plain, "shipped": shipped}


def test_shipped_config_with_default_flags_identical_to_target_alone(runs: dict) -> None:
    plain = unwrap(runs["plain"])
    spec = unwrap(runs["shipped"])
    assert len(plain["token_ids"]) == len(BRIDGE_STRESS) + len(BIASED) + len(PARAMS) and len(BRIDGE_STRESS) >= 8
    for prompt, a, b in zip(BRIDGE_STRESS, plain["token_ids"], spec["token_ids"]):
        assert a == b, f"output differs for prompt {prompt!r}"
    # Greedy rows draft with a greedy candidate, sampled ones with a sampled one.
    assert {"slem", "tli"} & set(spec["rules_chosen"]) and {"tli", "slrs"} & set(spec["rules_chosen"])
    assert set(spec["rules_chosen"]) != {"tli"}, spec["rules_chosen"]
    assert spec["num_draft_tokens"] > 0
    assert spec["fallbacks"] == 0
    assert spec["num_accepted_tokens"] > 0, "no draft token was ever accepted"
    assert plain["num_draft_tokens"] == 0


def test_logit_bias_and_min_p_as_plain_decoding_applies_them(runs: dict) -> None:
    """A logit_bias that changes the target's output gives the biased target's output
    token for token; min_p = 1 at T = 1 gives the target's greedy output (at drafted
    positions too: without min_p there, T = 1 would sample other tokens)."""
    plain = unwrap(runs["plain"])["token_ids"]
    spec = unwrap(runs["shipped"])["token_ids"]
    n = len(BRIDGE_STRESS)
    unbiased, biased = plain[: len(BIASED)], plain[n: n + len(BIASED)]
    assert sum(a != b for a, b in zip(unbiased, biased)) >= 2, "the bias hardly changed the output: proves little"
    for prompt, want, got in zip(BIASED, biased, spec[n: n + len(BIASED)]):
        assert got == want, f"logit_bias: output differs for prompt {prompt!r}"
    for prompt, want, got in zip(MIN_P, plain[4:8], spec[-len(MIN_P):]):
        assert got == want, f"min_p = 1 at T = 1: output differs from greedy for prompt {prompt!r}"


@pytest.mark.parametrize("field", list(PARAMS))
def test_every_sampling_field_as_plain_decoding_applies_it(runs: dict, field: str) -> None:
    """The request with ``field`` set gives the target alone's tokens, finish reason and
    stop, every completion (n), and the same logprobs (to float32 rounding between one-
    and multi-token forwards)."""
    at = len(BRIDGE_STRESS) + len(BIASED) + list(PARAMS).index(field)
    plain, spec = unwrap(runs["plain"]), unwrap(runs["shipped"])
    assert spec["token_ids"][at] == plain["token_ids"][at]
    want, got = plain["extras"][at], spec["extras"][at]
    assert {k: got[k] for k in ("finish_reason", "stop_reason")} == {k: want[k] for k in ("finish_reason", "stop_reason")}
    assert got.get("completions") == want.get("completions")
    assert got.get("top_logprobs") == want.get("top_logprobs")
    for key in ("logprobs",):
        if key in want:
            assert got[key] == pytest.approx(want[key], abs=2e-3)
    if "prompt_logprobs" in want:
        assert len(got["prompt_logprobs"]) == len(want["prompt_logprobs"])
        for a, b in zip(want["prompt_logprobs"], got["prompt_logprobs"]):
            assert (a is None) == (b is None) and (a is None or (a.keys() == b.keys()
                                                                 and list(b.values()) == pytest.approx(list(a.values()), abs=2e-3)))
    asked = PARAMS[field][1]
    if "n" in asked:
        assert len(got["completions"]) == asked["n"]
    if "logprobs" in asked:
        assert len(got["logprobs"]) == len(spec["token_ids"][at]) > 0
    if "stop" in asked:
        assert got["finish_reason"] == "stop", "the stop string never came: the test would prove little"
    if "min_tokens" in asked:
        assert len(spec["token_ids"][at]) >= asked["min_tokens"]
