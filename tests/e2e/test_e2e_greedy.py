"""T = 0: heterogeneous speculation in real vLLM gives exactly the target's own output.

Real engines, real models, float32 (bf16 rounding differs between one- and multi-token
forwards, see README). Each configuration runs in its own process, two side by side.
"""

from __future__ import annotations

import pytest

from vllm_hetero_spec.harness.evaluation import run_isolated_many, unwrap
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


CASES = {
    "qwen05-slem": ("qwen05", {"algorithm": "slem"}),
    "qwen05-tli": ("qwen05", {"algorithm": "tli"}),
    "gemma-slem": ("gemma", {"algorithm": "slem"}),
    "gemma-tli": ("gemma", {"algorithm": "tli"}),
    "gemma-dtw": ("gemma", {"algorithm": "dtw", "dtw_verify": "faithful"}),
    "qwen05-union": ("qwen05", {"algorithm": "union"}),
    "gemma-fsd": ("gemma", {"algorithm": "fsd", "fsd_threshold": 0.0}),
    "qwen05-slrs": ("qwen05", {"algorithm": "slrs"}),
    # Drafting in a Ray actor (pipelined, adaptive budget): union's forced rejections
    # travel back from the actor too. test_ray_executor.py covers faults and shutdown.
    "qwen05-union-ray": ("qwen05", {"algorithm": "union", "executor": "ray"}),
}


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, selected_params, smollm2: str) -> dict[str, dict | Exception]:
    """Every selected case and the plain run of each target it needs, two engines at a
    time: ``{case: result, "plain:<target>": result}``."""
    cases = selected_params("case")
    targets = {name: request.getfixturevalue(name) for name in sorted({CASES[c][0] for c in cases})}
    names = [f"plain:{t}" for t in targets] + cases
    jobs = [_job(targets[t]) for t in targets] + [
        _job(targets[CASES[c][0]], {"method": "hetero", "model": smollm2, "num_speculative_tokens": 4, **CASES[c][1]})
        for c in cases
    ]
    return dict(zip(names, run_isolated_many(jobs)))


@pytest.mark.parametrize("case", list(CASES))
def test_identical_to_target_alone(case: str, runs: dict) -> None:
    plain = unwrap(runs[f"plain:{CASES[case][0]}"])
    spec = unwrap(runs[case])
    assert len(plain["token_ids"]) == len(BRIDGE_STRESS) >= 8
    for prompt, a, b in zip(BRIDGE_STRESS, plain["token_ids"], spec["token_ids"]):
        assert a == b, f"output differs for prompt {prompt!r}"
    assert spec["num_draft_tokens"] > 0
    assert spec["fallbacks"] == 0
    assert spec["num_accepted_tokens"] > 0, "no draft token was ever accepted"
    assert plain["num_draft_tokens"] == 0
