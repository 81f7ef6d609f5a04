"""From measured sessions to options and a recommendation, on made-up measurements whose
answer is known: the target's step at each k, the drafting's cost, acceptance, and the
prefill's share. Also what the table, the plot and the config show."""

from __future__ import annotations

import json
import math

import pytest

from vllm_hetero_spec.advise.analysis import (
    DRAFT_MODEL, OUTPUT_LENGTHS, ConfigNames, Option, best_per_setting, config_for, draft_model_options, hetero_options, plain_step,
    recommend, rescaled, sweep_costs)
from vllm_hetero_spec.advise.projection import Phased, StepCosts, at_length, best_at_lengths, group_steps
from vllm_hetero_spec.advise.report import plot, table, verdict, write_json
from vllm_hetero_spec.config import parse_settings

K = 4
PLAIN_STEP = {1: 0.10, 8: 0.20}  # seconds per plain decode step
HOST = 0.004  # the proposal's fixed cost per step
READING = 2.0  # a non-steady proposal: the drafter reading the prompts


def _steps(b: int, k: int, target_s: float, propose_s: float, n: int = 9) -> list[dict]:
    steady = [{"rows": b, "tokens": b * (k + 1), "target_s": target_s, "propose_s": propose_s, "steady": True}
              for _ in range(n)]
    # a prefill step (not steady) and a tail step (fewer rows): neither may count as a steady step
    return steady + [{"rows": b, "tokens": 300, "target_s": 5.0, "propose_s": READING, "steady": False},
                     {"rows": max(b - 1, 1), "tokens": 1, "target_s": 0.01, "propose_s": 0.0, "steady": True}]


def _target_s(b: int, k: int) -> float:
    return PLAIN_STEP[b] * (1 + 0.05 * k * b ** 0.5)


def _per_position(b: int, dearer: float = 1.0) -> float:
    return 0.01 * b ** 0.5 * dearer


def _hetero(acceptance: dict[str, list[float]], dearer: dict[str, float] | None = None) -> dict:
    dearer = dearer or {}
    sweep = [{"b": b, "k": k, "steps": _steps(b, k, _target_s(b, k), (HOST + k * _per_position(b)) if k else 0.0)}
             for b in PLAIN_STEP for k in (0, 1, 2, 4)]
    runs = []
    for rule, acc in acceptance.items():
        for b in PLAIN_STEP:
            drafts = 100.0
            runs.append({"rule": rule, "T": 0.0, "b": b, "wall": 10.0, "lengths": [64] * 8,
                         "counters": {"num_drafts": drafts, "accepted_per_position": [a * drafts for a in acc]},
                         "steps": _steps(b, K, _target_s(b, K), HOST + K * _per_position(b, dearer.get(rule, 1.0)))})
    return {"kind": "hetero", "sweep": sweep, "runs": runs}


def _plain_run(b: int) -> dict:
    decode = 8 // b * 63 * PLAIN_STEP[b]  # groups of b requests, 63 steps past the first token each
    return {"T": 0.0, "b": b, "rule": None, "wall": decode + 2.0, "wall_first": 2.0, "lengths": [64] * 8}


PLAIN = {"kind": "plain", "runs": [_plain_run(b) for b in PLAIN_STEP]}


def test_sweep_costs_are_the_steady_full_steps_and_a_line_through_the_proposals() -> None:
    target, host, per_position = sweep_costs(_hetero({"tli": [0.5] * K}), 8)
    assert target == pytest.approx({k: _target_s(8, k) for k in (0, 1, 2, 4)})
    assert (host, per_position) == pytest.approx((HOST, _per_position(8)))
    assert plain_step(_plain_run(8), 8) == pytest.approx(PLAIN_STEP[8])


def test_each_option_is_the_projection_of_its_measured_parts() -> None:
    acc = [0.8, 0.6, 0.4, 0.3]
    options = hetero_options("small", _hetero({"slem": acc, "tli": [0.5, 0.2, 0.1, 0.0]}, {"tli": 1.5}), PLAIN, K)
    assert len(options) == 4
    slem_b8 = next(o for o in options if o.rule == "slem" and o.batch == 8)
    unit, wall = PLAIN_STEP[8], _plain_run(8)["wall"]
    # one group of 8: its prefill and the drafter's reading, in plain steps
    costs = StepCosts({k: _target_s(8, k) / unit for k in (0, 1, 2, 4)}, _per_position(8) / unit, HOST / unit,
                      2.0 / unit, (READING - HOST - K * _per_position(8)) / unit)
    expected = best_at_lengths(acc, costs, 8, OUTPUT_LENGTHS)  # its run took fewer steps than predicted: no tail
    assert (slem_b8.k, slem_b8.projected) == (expected.k, pytest.approx(expected.speedup))
    assert slem_b8.by_length == pytest.approx(expected.by_length)
    assert slem_b8.draft_cost == pytest.approx(_per_position(8) / unit)
    assert slem_b8.sample == pytest.approx(wall / 10.0)
    assert slem_b8.mean_accepted == pytest.approx(1 + sum(acc))
    tli_b8 = next(o for o in options if o.rule == "tli" and o.batch == 8)
    assert tli_b8.draft_cost == pytest.approx(1.5 * slem_b8.draft_cost)  # its own cost per position
    tli = [o for o in options if o.rule == "tli"]
    assert all(o.projected < s.projected for o in tli for s in options if s.rule == "slem" and s.batch == o.batch)


def test_a_batch_that_waits_for_its_slowest_request_projects_less() -> None:
    """The run's steps beyond the count its pooled acceptance predicts (a batch runs until
    its slowest request ends) scale every k's step count."""
    acc = [0.8, 0.6, 0.4, 0.3]
    measured = _hetero({"slem": acc})
    run = next(r for r in measured["runs"] if r["b"] == 8)
    predicted = group_steps(acc, K, [[64] * 8])
    run["steps"] += run["steps"][:1] * (round(2 * predicted) + 1 - len(run["steps"]))  # twice the predicted steps
    slow = next(o for o in hetero_options("small", measured, PLAIN, K) if o.batch == 8)
    fast = next(o for o in hetero_options("small", _hetero({"slem": acc}), PLAIN, K) if o.batch == 8)
    unit = PLAIN_STEP[8]
    costs = StepCosts({k: _target_s(8, k) / unit for k in (0, 1, 2, 4)}, _per_position(8) / unit, HOST / unit,
                      2.0 / unit, (READING - HOST - K * _per_position(8)) / unit)
    tail = (len(run["steps"]) - 1) / predicted
    assert slow.by_length[256] == pytest.approx(at_length(acc, costs, slow.k, 8, 256, tail=tail))
    assert slow.projected < fast.projected


def test_the_recommendation_is_a_config_the_plugin_takes(tmp_path) -> None:
    options = hetero_options("small", _hetero({"slem": [0.8, 0.6, 0.4, 0.3], "tli": [0.5, 0.2, 0.1, 0.0]}),
                             PLAIN, K)
    options += hetero_options("weak", _hetero({"slem": [0.2, 0.0, 0.0, 0.0], "tli": [0.1, 0, 0, 0]}, {"slem": 5.0}),
                              PLAIN, K)
    rec = recommend(options, {"small": ConfigNames("small", "/m/small"), "weak": ConfigNames("weak", "/m/weak")})
    assert rec.drafter == "small" and rec.method == "hetero"
    assert {c["drafter"] for c in rec.configs} == {"small", "weak"}
    (tmp_path / "config.json").write_text("{}")
    settings, _ = parse_settings({**rec.config, "model": str(tmp_path)})
    assert settings.num_speculative_tokens == max(o.k for o in rec.per_setting.values()) >= 1
    assert rec.config["model"] == "small"  # ours takes the short name; vLLM's draft_model the folder
    assert f"Use small with vllm_hetero_spec (algorithm {rec.config['algorithm']}" in verdict(rec)


def _option(rule: str, t: float, b: int, k: int, projected: float) -> Option:
    return Option("d", rule, t, b, k, projected, projected, [0.5] * 4, 0.1)


def test_one_rule_at_one_k_everywhere_is_written_as_exactly_that() -> None:
    options = [_option("slem", 0.0, b, 3, 1.3) for b in (1, 8)] + [_option("tli", 0.0, b, 3, 1.1) for b in (1, 8)]
    config = config_for(options, "d", "hetero", ConfigNames("d", "/m/d"), best_per_setting(options, "d", "hetero"))
    assert config == {"method": "hetero", "model": "d", "num_speculative_tokens": 3, "draft_budget": "fixed",
                      "algorithm": "slem"}


def test_a_drafter_that_never_pays_keeps_the_adaptive_budget() -> None:
    """Its own config (for a user bound to it) must not pin a k its settings all refused."""
    options = [_option("slem", 0.0, b, 0, 1.0) for b in (1, 8)]
    config = config_for(options, "d", "hetero", ConfigNames("d", "/m/d"), best_per_setting(options, "d", "hetero"))
    assert config == {"method": "hetero", "model": "d", "num_speculative_tokens": 1, "algorithm": "slem"}


def test_settings_that_disagree_get_auto_and_the_adaptive_budget() -> None:
    """slem best at batch 1 with k = 3, tli at batch 8 with k = 1, tli at T = 1: auto,
    each kind's rules fastest first (geometric mean over its settings), up to k = 3;
    slrs, best nowhere, is no candidate (auto would pay turns on it for nothing)."""
    options = [_option("slem", 0.0, 1, 3, 1.5), _option("tli", 0.0, 1, 2, 1.2),
               _option("slem", 0.0, 8, 1, 1.01), _option("tli", 0.0, 8, 1, 1.05),
               _option("tli", 1.0, 1, 2, 1.2), _option("slrs", 1.0, 1, 1, 1.1)]
    config = config_for(options, "d", "hetero", ConfigNames("d", "/m/d"), best_per_setting(options, "d", "hetero"))
    assert config == {"method": "hetero", "model": "d", "num_speculative_tokens": 3, "algorithm": "auto",
                      "num_speculative_tokens_per_batch_size": [[1, 7, 3], [8, 1024, 1]],
                      "sampled_speculative_tokens": 2, "auto_greedy": ["slem", "tli"], "auto_sampled": ["tli"]}


def test_a_setting_that_drafts_nothing_favours_no_rule() -> None:
    """slem wins batch 1 at T = 0, tli at T = 1; at batch 8 nothing pays and the rule
    projected there (every one at 1.00x) is no candidate: each kind gets its one winner,
    so auto spends no turns comparing (the shape of advise's config for the 1.5B target)."""
    options = [_option("slem", 0.0, 1, 2, 1.60), _option("tli", 0.0, 1, 2, 1.56),
               _option("tli", 1.0, 1, 2, 1.41), _option("slrs", 1.0, 1, 2, 1.25)]
    options += [_option(rule, t, 8, 0, 1.0) for rule, t in (("tli", 0.0), ("slem", 0.0), ("slrs", 1.0))]
    config = config_for(options, "d", "hetero", ConfigNames("d", "/m/d"), best_per_setting(options, "d", "hetero"))
    assert config["algorithm"] == "auto"
    assert config["auto_greedy"] == ["slem"] and config["auto_sampled"] == ["tli"]
    one_kind = [o for o in options if o.temperature == 0]
    pinned = config_for(one_kind, "d", "hetero", ConfigNames("d", "/m/d"), best_per_setting(one_kind, "d", "hetero"))
    assert pinned["algorithm"] == "slem"  # batch 8's tli, at k = 0, does not make it auto


def test_sampled_requests_that_never_pay_are_capped_at_zero() -> None:
    """k = 2 pays for greedy requests at batch 1 and 8, nothing at T = 1: sampled
    requests are capped at 0 and no batch size is."""
    options = [_option("tli", 0.0, b, 2, 1.2) for b in (1, 8)] + [_option("slrs", 1.0, b, 0, 1.0) for b in (1, 8)]
    config = config_for(options, "d", "hetero", ConfigNames("d", "/m/d"), best_per_setting(options, "d", "hetero"))
    assert config["sampled_speculative_tokens"] == 0 and config["num_speculative_tokens"] == 2
    assert "num_speculative_tokens_per_batch_size" not in config


def test_a_batch_size_where_drafting_never_pays_is_scheduled_off(tmp_path) -> None:
    """k = 2 pays at batch 1, nothing at 8 or 32 at either temperature: vLLM's schedule
    caps batch 1-7 at 2 and 8 on at 0 (the budget would otherwise probe there), and the
    plugin takes it."""
    options = [_option("slem", 0.0, 1, 2, 1.2), _option("slrs", 1.0, 1, 1, 1.05)]
    options += [_option(rule, t, b, 0, 1.0) for rule, t in (("slem", 0.0), ("slrs", 1.0)) for b in (8, 32)]
    per = best_per_setting(options, "d", "hetero")
    config = config_for(options, "d", "hetero", ConfigNames("d", "/m/d"), per)
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 7, 2], [8, 31, 0], [32, 1024, 0]]
    assert config["sampled_speculative_tokens"] == 1  # T = 1 paid at k = 1 at most
    assert "draft_budget" not in config
    (tmp_path / "config.json").write_text("{}")
    _, vllm_spec = parse_settings({**config, "model": str(tmp_path)})
    assert vllm_spec["num_speculative_tokens_per_batch_size"] == [[1, 7, 2], [8, 31, 0], [32, 1024, 0]]


def test_vllm_draft_model_is_recommended_when_it_is_faster() -> None:
    options = hetero_options("small", _hetero({"tli": [0.5, 0.2, 0.1, 0.0]}), PLAIN, K)
    fast = {"kind": "draft_model", "runs": [
        {"T": 0.0, "b": b, "rule": None, "wall": _plain_run(b)["wall"] / 4, "lengths": [64] * 8,
         "counters": {"num_drafts": 10.0, "accepted_per_position": [9.0, 8.0, 7.0, 6.0]}} for b in PLAIN_STEP]}
    options += draft_model_options("small", fast, PLAIN, K)
    rec = recommend(options, {"small": ConfigNames("small", "/m/small")})
    # 4x on the sample's 64-token replies, more on longer ones (the prefill weighs less)
    assert all(o.by_length[64] == pytest.approx(4.0) for o in rec.per_setting.values())
    assert rec.method == DRAFT_MODEL and rec.score > 4.0
    assert rec.config == {"method": "draft_model", "model": "/m/small", "num_speculative_tokens": K}
    assert "vLLM's own draft_model" in verdict(rec)


def test_vllm_draft_model_projects_from_the_acceptance_pooled_over_batch_sizes() -> None:
    """Two runs at T = 1 drew different acceptance (9 and 5 of 10 at each position): each
    run's decode step is its time past the prefill over the steps its own acceptance
    predicts, and each output length's steps are counted with the pooled acceptance."""
    def run(b: int, accepted: float) -> dict:
        return {"T": 0.0, "b": b, "rule": None, "wall": _plain_run(b)["wall"] / 2, "lengths": [64] * 8,
                "counters": {"num_drafts": 10.0, "accepted_per_position": [accepted] * K}}

    lucky, unlucky = run(1, 9.0), run(8, 5.0)
    options = {o.batch: o for o in draft_model_options("small", {"kind": "draft_model", "runs": [lucky, unlucky]},
                                                       PLAIN, K)}
    pooled = [0.7] * K
    for o, r in ((options[1], lucky), (options[8], unlucky)):
        b = r["b"]
        groups = [[64] * b] * (8 // b)
        own = [r["counters"]["accepted_per_position"][0] / 10] * K
        step = (r["wall"] - 2.0) / group_steps(own, K, groups) / PLAIN_STEP[b]
        prefill = 2.0 / len(groups) / PLAIN_STEP[b]
        for n in OUTPUT_LENGTHS:
            plain = prefill + n - 1
            assert o.by_length[n] == pytest.approx(plain / (prefill + group_steps(pooled, K, [[n] * b]) * step))
        assert o.projected == pytest.approx(math.prod(o.by_length.values()) ** (1 / len(OUTPUT_LENGTHS)))
        assert o.sample == pytest.approx(2.0) and o.acceptance == pytest.approx(pooled)
    assert options[1].projected < 2.0 < options[8].projected


def test_the_speedup_is_projected_at_the_lengths_users_generate() -> None:
    """Measured on 64-token requests whose drafter's reading of the prompt costs as much
    as 40 decode steps: at 64 tokens drafting loses, at 1,024 it pays (issue 71: advise
    turned off what paid on longer replies). Each length is chosen for alone, and the
    mix by the geometric mean."""
    measured = _hetero({"slem": [0.6, 0.4, 0.2, 0.1]})
    for run in measured["runs"]:
        for step in run["steps"]:
            if not step["steady"]:
                # the run's one prefill step stands for its 8 // b groups
                step["propose_s"] = 40 * PLAIN_STEP[run["b"]] * (8 // run["b"]) + HOST + K * _per_position(run["b"])
    at = {n: next(o for o in hetero_options("small", measured, PLAIN, K, (n,)) if o.batch == 1) for n in (64, 1024)}
    assert at[64].k == 0 and at[64].projected == 1.0
    assert at[1024].k > 0 and at[1024].projected > 1.2
    both = next(o for o in hetero_options("small", measured, PLAIN, K, (64, 1024)) if o.batch == 1)
    assert both.k > 0 and both.by_length[64] < 1.0 < both.by_length[1024]
    assert both.projected == pytest.approx(math.sqrt(both.by_length[64] * both.by_length[1024]))


def test_plain_decoding_is_recommended_when_no_drafter_pays() -> None:
    options = hetero_options("weak", _hetero({"tli": [0.0] * K}), PLAIN, K)
    rec = recommend(options, {"weak": ConfigNames("weak", "/m/weak")})
    assert rec.config is None and rec.score == 1.0 and all(o.k == 0 for o in options)
    assert verdict(rec).startswith("Plain decoding")


def test_table_plot_and_json(tmp_path) -> None:
    options = hetero_options("small", _hetero({"slem": [0.8, 0.6, 0.4, 0.3]}), PLAIN, K)
    rec = recommend(options, {"small": ConfigNames("small", "/m/small")})
    md = table(options)
    assert md.count("\n") == 2 and "| small | slem | 0 | 0.80 0.60 0.40 0.30 | 3.10 |" in md
    path = plot(options, ["small"], tmp_path / "a.png")
    assert path is not None and path.stat().st_size > 1000
    write_json(tmp_path / "a.json", options, rec, {"target": "t"})
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["recommendation"]["config"] == rec.config and len(data["options"]) == 2
    assert not any(isinstance(v, float) and math.isnan(v) for o in data["options"] for v in o.values())


def _verified(run: dict, early: int, late: int, switch: int) -> None:
    """Give ``run``'s steady steps a log of what each row accepted: ``early`` of 4 drafts
    before output token ``switch``, ``late`` from it on (a row a step, 20 of each)."""
    run["max_tokens"] = 2 * switch
    rows = [[p, K, early] for p in range(1, switch, switch // 20)][:20]
    rows += [[switch + p, K, late] for p in range(20)]
    steady = [s for s in run["steps"] if s["steady"]]
    for i, step in enumerate(steady):
        step["verified"] = rows[i::len(steady)]


def test_acceptance_that_rises_along_a_reply_projects_long_replies_higher() -> None:
    """The sample's replies accepted 1 of 4 drafts in their first half and 3 of 4 in their
    second: long replies project from the second half's rate (pooled over batch sizes),
    short ones from the first's, and vLLM's draft_model with the same drafter takes the
    same rise over its own whole-sample acceptance."""
    measured = _hetero({"tli": [0.5, 0.5, 0.5, 0.0]})
    for run in measured["runs"]:
        _verified(run, early=1, late=3, switch=32)
    flat = {o.batch: o for o in hetero_options("small", _hetero({"tli": [0.5, 0.5, 0.5, 0.0]}), PLAIN, K)}
    options = {o.batch: o for o in hetero_options("small", measured, PLAIN, K)}
    phases = options[1].phases
    assert phases == Phased((1.0, 0.0, 0.0, 0.0), (1.0, 1.0, 1.0, 0.0), 32)
    assert flat[1].phases is None and options[1].acceptance == flat[1].acceptance  # the counters, as measured
    assert options[1].by_length[1024] > flat[1].by_length[1024]
    assert options[1].by_length[64] < options[1].by_length[1024]
    dm = {"kind": "draft_model", "runs": [
        {"T": 0.0, "b": b, "rule": None, "wall": _plain_run(b)["wall"] / 2, "lengths": [64] * 8,
         "counters": {"num_drafts": 10.0, "accepted_per_position": [8.0, 6.0, 4.0, 2.0]}} for b in PLAIN_STEP]}
    rose = draft_model_options("small", dm, PLAIN, K, OUTPUT_LENGTHS, list(options.values()))
    alone = draft_model_options("small", dm, PLAIN, K)
    assert rose[0].phases == rescaled([0.8, 0.6, 0.4, 0.2], phases, [0.5, 0.5, 0.5, 0.0])
    # 0.8 * 1.0 / 0.5 is capped at 1; a position ours never accepted keeps draft_model's own share
    assert rose[0].phases.late == pytest.approx((1.0, 1.0, 0.8, 0.2))
    assert rose[0].phases.early == pytest.approx((1.0, 0.0, 0.0, 0.0))
    assert alone[0].phases is None and rose[0].by_length[1024] > alone[0].by_length[1024]


def test_too_few_drafts_in_a_phase_keep_one_acceptance_for_the_reply() -> None:
    measured = _hetero({"tli": [0.5, 0.5, 0.5, 0.0]})
    for run in measured["runs"]:
        _verified(run, early=1, late=3, switch=32)
        for step in run["steps"]:
            step["verified"] = step.get("verified", [])[:1]  # each step's first: early ones only
    assert all(o.phases is None for o in hetero_options("small", measured, PLAIN, K))


def test_draft_model_rises_as_the_rule_of_ours_nearest_its_own_acceptance() -> None:
    """Two rules of ours rose differently; vLLM's draft_model takes the rise of the one
    whose whole-sample acceptance is nearest its own (with one vocabulary, ``tli``)."""
    measured = _hetero({"tli": [0.8, 0.6, 0.4, 0.2], "slem": [0.5, 0.5, 0.5, 0.0]})
    for run in measured["runs"]:
        rise = (1, 3) if run["rule"] == "slem" else (2, 4)
        _verified(run, *rise, switch=32)
    ours = hetero_options("small", measured, PLAIN, K)
    dm = {"kind": "draft_model", "runs": [
        {"T": 0.0, "b": 1, "rule": None, "wall": _plain_run(1)["wall"] / 2, "lengths": [64] * 8,
         "counters": {"num_drafts": 10.0, "accepted_per_position": [8.0, 6.0, 4.0, 2.0]}}]}
    tli = next(o for o in ours if o.rule == "tli")
    assert draft_model_options("small", dm, PLAIN, K, OUTPUT_LENGTHS, ours)[0].phases == rescaled(
        [0.8, 0.6, 0.4, 0.2], tli.phases, tli.acceptance)
