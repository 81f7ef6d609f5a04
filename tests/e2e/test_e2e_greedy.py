"""T = 0: heterogeneous speculation in real vLLM gives exactly the target's own output.

Real engines, real models, float32 (bf16 rounding differs between one- and multi-token
forwards, see README). Each configuration runs in its own process, two side by side.
The first case (Qwen's ``tli``) runs with vLLM's default flags, as users run it
(torch.compile, and the profile run that sends the rejection sampler dummy drafts with
no request); the rest add ``enforce_eager`` only to start sooner. Each is compared with
the target alone under the same flags.
"""

from __future__ import annotations

import pytest

from vllm_hetero_spec.harness.evaluation import run_isolated_many, unwrap
from vllm_hetero_spec.harness.prompts import BRIDGE_STRESS


MAX_TOKENS = 24


def _job(target: str, eager: bool, spec: dict | None = None) -> dict:
    return {
        "target": target,
        "prompts": BRIDGE_STRESS,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "max_model_len": 1024,
        "speculative_config": spec,
        "warmup": False,
        "enforce_eager": eager,
    }


DEFAULT_FLAGS, EAGER = False, True
CASES = {
    "qwen05-tli-default-flags": ("qwen05", DEFAULT_FLAGS, {"algorithm": "tli"}),
    "qwen05-slem": ("qwen05", EAGER, {"algorithm": "slem"}),
    "gemma-slem": ("gemma", EAGER, {"algorithm": "slem"}),
    "gemma-tli": ("gemma", EAGER, {"algorithm": "tli"}),
    "gemma-dtw": ("gemma", EAGER, {"algorithm": "dtw", "dtw_verify": "faithful"}),
    "qwen05-union": ("qwen05", EAGER, {"algorithm": "union"}),
    "gemma-fsd": ("gemma", EAGER, {"algorithm": "fsd", "fsd_threshold": 0.0}),
    "qwen05-slrs": ("qwen05", EAGER, {"algorithm": "slrs"}),
    # Drafting in a Ray actor (pipelined, adaptive budget): union's forced rejections
    # travel back from the actor too. test_ray_executor.py covers faults and shutdown.
    "qwen05-union-ray": ("qwen05", EAGER, {"algorithm": "union", "executor": "ray"}),
}


def _plain(case: str) -> str:
    target, eager, _ = CASES[case]
    return f"plain:{target}:{'eager' if eager else 'default'}"


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, selected_params, smollm2: str) -> dict[str, dict | Exception]:
    """Every selected case and the plain run each needs (same target, same flags), two
    engines at a time: ``{case: result, "plain:<target>:<flags>": result}``."""
    cases = selected_params("case")
    plains = sorted({_plain(c) for c in cases})
    paths = {name: request.getfixturevalue(name) for name in sorted({CASES[c][0] for c in cases})}
    jobs = {p: _job(paths[p.split(":")[1]], p.endswith(":eager")) for p in plains}
    for c in cases:
        target, eager, spec = CASES[c]
        jobs[c] = _job(paths[target], eager, {"method": "hetero", "model": smollm2, "num_speculative_tokens": 4, **spec})
    # The two slow starts (torch.compile) side by side, first.
    names = sorted(jobs, key=lambda name: jobs[name]["enforce_eager"])
    return dict(zip(names, run_isolated_many([jobs[n] for n in names])))


@pytest.mark.parametrize("case", list(CASES))
def test_identical_to_target_alone(case: str, runs: dict) -> None:
    plain = unwrap(runs[_plain(case)])
    spec = unwrap(runs[case])
    assert len(plain["token_ids"]) == len(BRIDGE_STRESS) >= 8
    for prompt, a, b in zip(BRIDGE_STRESS, plain["token_ids"], spec["token_ids"]):
        assert a == b, f"output differs for prompt {prompt!r}"
    assert spec["num_draft_tokens"] > 0
    assert spec["fallbacks"] == 0
    assert spec["num_accepted_tokens"] > 0, "no draft token was ever accepted"
    assert plain["num_draft_tokens"] == 0
