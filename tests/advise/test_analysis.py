"""From measured sessions to options and a recommendation, on made-up measurements whose
answer is known: the target's step at each k, the drafting's cost, acceptance, and the
prefill's share. Also what the table, the plot and the config show."""

from __future__ import annotations

import json
import math

import pytest

from vllm_hetero_spec.advise.analysis import (
    DRAFT_MODEL, draft_model_options, hetero_options, recommend, verify_costs)
from vllm_hetero_spec.advise.projection import StepCosts, best
from vllm_hetero_spec.advise.report import plot, table, verdict, write_json
from vllm_hetero_spec.config import parse_settings

K = 4
PLAIN_STEP = {1: 0.10, 8: 0.20}  # seconds


def _steps(b: int, k: int, target_s: float, propose_s: float, n: int = 9) -> list[dict]:
    steady = [{"rows": b, "tokens": b * (k + 1), "k": k, "target_s": target_s, "propose_s": propose_s,
               "steady": True} for _ in range(n)]
    # a prefill step (not steady) and a tail step (fewer rows): neither may count
    return steady + [{"rows": b, "tokens": 300, "k": k, "target_s": 5.0, "propose_s": 2.0, "steady": False},
                     {"rows": max(b - 1, 1), "tokens": 1, "k": k, "target_s": 0.01, "propose_s": 0.0, "steady": True}]


def _target_s(b: int, k: int) -> float:
    return PLAIN_STEP[b] * (1 + 0.05 * k * b ** 0.5)


def _hetero(acceptance: dict[str, list[float]], draft_s: float) -> dict:
    sweep = [{"b": b, "k": k, "steps": _steps(b, k, _target_s(b, k), draft_s * k / K)}
             for b in PLAIN_STEP for k in (0, 1, 2, 4)]
    runs = []
    for rule, acc in acceptance.items():
        for b in PLAIN_STEP:
            drafts = 100.0
            runs.append({"rule": rule, "T": 0.0, "b": b, "wall": 10.0, "lengths": [64] * 8,
                         "counters": {"num_drafts": drafts, "accepted_per_position": [a * drafts for a in acc]},
                         "stats": {"steps": 50, "draft_s": 50 * draft_s * b ** 0.5},
                         "steps": _steps(b, K, _target_s(b, K), draft_s * b ** 0.5 + 0.004)})
    return {"kind": "hetero", "sweep": sweep, "runs": runs}


PLAIN = {"kind": "plain", "runs": [{"T": 0.0, "b": b, "rule": None, "wall": 20.0, "wall_first": 2.0,
                                     "lengths": [64] * 8} for b in PLAIN_STEP]}


def test_verify_costs_are_the_steady_full_steps_in_plain_step_units() -> None:
    base, verify = verify_costs(_hetero({"tli": [0.5] * K}, 0.01), 8)
    assert base == pytest.approx(PLAIN_STEP[8])
    assert verify == pytest.approx({k: _target_s(8, k) / PLAIN_STEP[8] for k in (0, 1, 2, 4)})


def test_each_option_is_the_projection_of_its_measured_parts() -> None:
    acc = [0.8, 0.6, 0.4, 0.3]
    options = hetero_options("small", _hetero({"slem": acc, "tli": [0.5, 0.2, 0.1, 0.0]}, 0.01), PLAIN, K)
    assert len(options) == 4
    slem_b8 = next(o for o in options if o.rule == "slem" and o.batch == 8)
    draft = 0.01 * 8 ** 0.5
    costs = StepCosts({k: _target_s(8, k) / 0.2 for k in (0, 1, 2, 4)}, draft / K / 0.2, 0.004 / 0.2, 0.1)
    expected = best(acc, costs)
    assert (slem_b8.k, slem_b8.projected) == (expected.k, pytest.approx(expected.speedup))
    assert slem_b8.sample == pytest.approx((64 * 8 / 10.0) / (64 * 8 / 20.0))
    assert slem_b8.mean_accepted == pytest.approx(1 + sum(acc))
    tli = [o for o in options if o.rule == "tli"]
    assert all(o.projected < s.projected for o in tli for s in options if s.rule == "slem" and s.batch == o.batch)


def test_the_recommendation_orders_the_rules_and_sizes_k(tmp_path) -> None:
    options = hetero_options("small", _hetero({"slem": [0.8, 0.6, 0.4, 0.3], "tli": [0.5, 0.2, 0.1, 0.0]}, 0.01),
                             PLAIN, K)
    options += hetero_options("weak", _hetero({"slem": [0.2, 0.0, 0.0, 0.0], "tli": [0.1, 0, 0, 0]}, 0.05), PLAIN, K)
    rec = recommend(options, {"small": "/m/small", "weak": "/m/weak"})
    assert rec.drafter == "small" and rec.method == "hetero"
    assert rec.config["auto_greedy"] == ["slem", "tli"] and "auto_sampled" not in rec.config
    assert rec.config["num_speculative_tokens"] == max(o.k for o in rec.per_setting.values()) >= 1
    # the config is one the plugin accepts as it is
    (tmp_path / "config.json").write_text("{}")
    settings, _ = parse_settings({**rec.config, "model": str(tmp_path)})
    assert settings.auto_greedy == ("slem", "tli") and settings.draft_budget == "adaptive"
    assert "Use small with vllm_hetero_spec" in verdict(rec)


def test_vllm_draft_model_is_recommended_when_it_is_faster() -> None:
    options = hetero_options("small", _hetero({"tli": [0.5, 0.2, 0.1, 0.0]}, 0.01), PLAIN, K)
    fast = {"kind": "draft_model", "runs": [
        {"T": 0.0, "b": b, "rule": None, "wall": 5.0, "lengths": [64] * 8,
         "counters": {"num_drafts": 10.0, "accepted_per_position": [9.0, 8.0, 7.0, 6.0]}} for b in PLAIN_STEP]}
    options += draft_model_options("small", fast, PLAIN, K)
    rec = recommend(options, {"small": "/m/small"})
    assert rec.method == DRAFT_MODEL and rec.score == pytest.approx(4.0)
    assert rec.config == {"method": "draft_model", "model": "/m/small", "num_speculative_tokens": K}
    assert "vLLM's own draft_model" in verdict(rec)


def test_plain_decoding_is_recommended_when_no_drafter_pays() -> None:
    options = hetero_options("weak", _hetero({"tli": [0.0] * K}, 0.05), PLAIN, K)
    rec = recommend(options, {"weak": "/m/weak"})
    assert rec.config is None and rec.score == 1.0 and all(o.k == 0 for o in options)
    assert verdict(rec).startswith("Plain decoding")


def test_table_plot_and_json(tmp_path) -> None:
    options = hetero_options("small", _hetero({"slem": [0.8, 0.6, 0.4, 0.3]}, 0.01), PLAIN, K)
    rec = recommend(options, {"small": "/m/small"})
    md = table(options)
    assert md.count("\n") == 2 and "| small | slem | 0 | 0.80 0.60 0.40 0.30 | 3.10 |" in md
    path = plot(options, ["small"], tmp_path / "a.png")
    assert path is not None and path.stat().st_size > 1000
    write_json(tmp_path / "a.json", options, rec, {"target": "t"})
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["recommendation"]["config"] == rec.config and len(data["options"]) == 2
    assert not any(isinstance(v, float) and math.isnan(v) for o in data["options"] for v in o.values())
