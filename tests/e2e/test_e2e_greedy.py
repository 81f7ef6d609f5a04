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

from vllm_hetero_spec.harness.evaluation import run_isolated_many, unwrap
from vllm_hetero_spec.harness.prompts import BRIDGE_STRESS


MAX_TOKENS = 24


def _job(target: str, eager: bool, spec: dict | None = None, mixed: bool = False) -> dict:
    """The greedy requests (first), then with ``mixed`` the same prompts sampled."""
    n = len(BRIDGE_STRESS)
    return {
        "target": target,
        "prompts": BRIDGE_STRESS * (2 if mixed else 1),
        "max_tokens": MAX_TOKENS,
        "temperatures": [0.0] * n + ([1.0] * n if mixed else []),
        "request_seeds": list(range(2 * n if mixed else n)),
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
    plain, shipped = run_isolated_many([_job(qwen05, eager=False), _job(qwen05, eager=False, spec=spec, mixed=True)])
    return {"plain": plain, "shipped": shipped}


def test_shipped_config_with_default_flags_identical_to_target_alone(runs: dict) -> None:
    plain = unwrap(runs["plain"])
    spec = unwrap(runs["shipped"])
    assert len(plain["token_ids"]) == len(BRIDGE_STRESS) >= 8
    for prompt, a, b in zip(BRIDGE_STRESS, plain["token_ids"], spec["token_ids"]):
        assert a == b, f"output differs for prompt {prompt!r}"
    # Greedy rows draft with a greedy candidate, sampled ones with a sampled one.
    assert {"slem", "tli"} & set(spec["rules_chosen"]) and {"tli", "slrs"} & set(spec["rules_chosen"])
    assert set(spec["rules_chosen"]) != {"tli"}, spec["rules_chosen"]
    assert spec["num_draft_tokens"] > 0
    assert spec["fallbacks"] == 0
    assert spec["num_accepted_tokens"] > 0, "no draft token was ever accepted"
    assert plain["num_draft_tokens"] == 0
