"""T = 0: heterogeneous speculation in real vLLM gives exactly the target's own output.

Real engines, real models, float32 (bf16 rounding differs between one- and multi-token
forwards, see README). Each configuration runs in its own process, two side by side.
The first case runs the shipped config (``algorithm: auto``) with vLLM's default flags,
as users run it (torch.compile, and the profile run that sends the rejection sampler
dummy drafts with no request); the rest add ``enforce_eager`` only to start sooner. Each
is compared with the target alone under the same flags. ``auto`` also runs a batch that
mixes greedy and sampled requests (so its rows draft with different rules in one step):
its greedy rows must still be the target's own output.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_hetero_spec.harness.evaluation import run_isolated_many, unwrap
from vllm_hetero_spec.harness.prompts import BRIDGE_STRESS


MAX_TOKENS = 24


def _job(target: str, eager: bool, spec: dict | None = None, mixed: bool = False) -> dict:
    return {
        "target": target,
        "prompts": BRIDGE_STRESS,
        "max_tokens": MAX_TOKENS,
        "temperatures": [1.0 if mixed and i % 2 else 0.0 for i in range(len(BRIDGE_STRESS))],
        "request_seeds": list(range(len(BRIDGE_STRESS))),
        "max_model_len": 1024,
        "speculative_config": spec,
        "warmup": False,
        "enforce_eager": eager,
    }


DEFAULT_FLAGS, EAGER = False, True
SHIPPED = json.loads((Path(__file__).parents[2] / "configs" / "hetero.json").read_text())
# The rows of the mixed batch that are greedy (the others sample at T = 1, seeded).
MIXED = "qwen05-auto-mixed"
# slem and tli alone run on the Gemma target; on the Qwen target they run inside auto
# (the shipped case and the mixed one), whose greedy rows choose between them.
CASES = {
    "qwen05-shipped-default-flags": ("qwen05", DEFAULT_FLAGS, {k: v for k, v in SHIPPED.items() if k != "model"}),
    MIXED: ("qwen05", EAGER, {"algorithm": "auto"}),
    "gemma-slem": ("gemma", EAGER, {"algorithm": "slem"}),
    "gemma-tli": ("gemma", EAGER, {"algorithm": "tli"}),
    "gemma-dtw": ("gemma", EAGER, {"algorithm": "dtw", "dtw_verify": "faithful"}),
    "qwen05-union": ("qwen05", EAGER, {"algorithm": "union"}),
    "gemma-fsd": ("gemma", EAGER, {"algorithm": "fsd", "fsd_threshold": 0.0}),
    "qwen05-slrs": ("qwen05", EAGER, {"algorithm": "slrs"}),
    # Drafting in a Ray actor (pipelined, adaptive budget): union's forced rejections
    # travel back from the actor too. test_ray_executor.py covers faults, timeouts and
    # shutdown; here every step waits for its drafts, so that a loaded machine cannot
    # leave the case undrafted (it did to the sampling module's Ray case on CI).
    "qwen05-union-ray": ("qwen05", EAGER, {"algorithm": "union", "executor": "ray", "ray_timeout_s": 300.0}),
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
        jobs[c] = _job(paths[target], eager, {"method": "hetero", "model": smollm2, "num_speculative_tokens": 4, **spec},
                       mixed=c == MIXED)
    # The two slow starts (torch.compile) side by side, first.
    names = sorted(jobs, key=lambda name: jobs[name]["enforce_eager"])
    return dict(zip(names, run_isolated_many([jobs[n] for n in names])))


@pytest.mark.parametrize("case", list(CASES))
def test_identical_to_target_alone(case: str, runs: dict) -> None:
    plain = unwrap(runs[_plain(case)])
    spec = unwrap(runs[case])
    assert len(plain["token_ids"]) == len(BRIDGE_STRESS) >= 8
    temps = _job("", False, mixed=case == MIXED)["temperatures"]
    for prompt, a, b, t in zip(BRIDGE_STRESS, plain["token_ids"], spec["token_ids"], temps):
        if t == 0.0:
            assert a == b, f"output differs for prompt {prompt!r}"
    if case == MIXED:
        # Greedy rows draft with a greedy candidate, sampled ones with a sampled one.
        assert {"slem", "tli"} & set(spec["rules_chosen"]) and {"tli", "slrs"} & set(spec["rules_chosen"])
        assert set(spec["rules_chosen"]) != {"tli"}, spec["rules_chosen"]
    assert spec["num_draft_tokens"] > 0
    assert spec["fallbacks"] == 0
    assert spec["num_accepted_tokens"] > 0, "no draft token was ever accepted"
    assert plain["num_draft_tokens"] == 0
