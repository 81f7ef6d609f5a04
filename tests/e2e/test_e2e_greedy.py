"""T = 0: heterogeneous speculation in real vLLM gives exactly the target's own output.

Real engines, real models, float32 (bf16 rounding differs between one- and multi-token
forwards, see README). Each configuration runs in its own process.
"""

from __future__ import annotations

import pytest

from vllm_hetero_spec.harness.evaluation import run_isolated
from vllm_hetero_spec.harness.prompts import BRIDGE_STRESS


MAX_TOKENS = 24


def _job(target: str, spec: dict | None = None) -> dict:
    return {
        "target": target,
        "prompts": BRIDGE_STRESS,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "max_model_len": 1024,
        "speculative_config": spec,
        "warmup": False,
    }


_plain_cache: dict[str, dict] = {}


def _plain(target: str) -> dict:
    if target not in _plain_cache:
        _plain_cache[target] = run_isolated(_job(target))
    return _plain_cache[target]


CASES = [
    ("qwen05", {"algorithm": "slem"}),
    ("qwen05", {"algorithm": "tli"}),
    ("gemma", {"algorithm": "slem"}),
    ("gemma", {"algorithm": "tli"}),
    ("gemma", {"algorithm": "dtw", "dtw_verify": "faithful"}),
    ("qwen05", {"algorithm": "union"}),
    ("gemma", {"algorithm": "fsd", "fsd_threshold": 0.0}),
    ("qwen05", {"algorithm": "slrs"}),
    # Drafting in a Ray actor (pipelined, adaptive budget): union's forced rejections
    # travel back from the actor too. test_ray_executor.py covers faults and shutdown.
    ("qwen05", {"algorithm": "union", "executor": "ray"}),
]


@pytest.mark.parametrize("target_name,settings", CASES, ids=[f"{t}-{s['algorithm']}" + ("-ray" if "executor" in s else "") for t, s in CASES])
def test_identical_to_target_alone(target_name: str, settings: dict, request: pytest.FixtureRequest,
                                   smollm2: str) -> None:
    target = request.getfixturevalue(target_name)
    plain = _plain(target)
    spec = run_isolated(
        _job(target, {"method": "hetero", "model": smollm2, "num_speculative_tokens": 4, **settings})
    )
    assert len(plain["token_ids"]) == len(BRIDGE_STRESS) >= 8
    for prompt, a, b in zip(BRIDGE_STRESS, plain["token_ids"], spec["token_ids"]):
        assert a == b, f"output differs for prompt {prompt!r}"
    assert spec["num_draft_tokens"] > 0
    assert spec["fallbacks"] == 0
    assert spec["num_accepted_tokens"] > 0, "no draft token was ever accepted"
    assert plain["num_draft_tokens"] == 0
