"""Every rule end to end on the Gemma pair (SmolLM2-135M drafting for Gemma-3-270M): at
T = 0 the output is the target's own, token for token, and at T > 0 its distribution is
the target's.

One engine per configuration, each running both claims at once: ten greedy requests
that stress the vocabulary bridge (code, CJK, emoji, whitespace runs; 24 tokens each)
and :data:`N` unseeded requests of one prompt sampled at T = 1 with top-k and top-p set
(so vLLM's filters reach p through our sampler). Each also runs four seeded requests,
which must come out the same in every engine and alone (a seeded row is verified by
equality with its position's seeded sample, ``verify/seeded.py``). Greedy and sampled rows
share the engine's steps, so every rule is also verified in mixed batches. Greedy rows
must equal the target alone's; the sampled tokens at the positions the drafter proposes
(1 and 2; position 0 comes from the prefill) are compared with the target alone's by a
two-sample chi-square test. A control shows the test has power: the target at another
temperature is detected.

Power: the target alone's engine draws :data:`N_REF` = 4 N reference samples and each
configuration N = 60 (the reference is cheaper to draw than 7 configurations' samples),
an effective size n1 n2 / (n1 + n2) = 48. At p > 1e-3 and 8 degrees of freedom, the test
detects with 80% power a bias of 0.24 of probability moved between two tokens of
probability 0.2 each. Given up for the 30-minute suite: 0.18 (N = 120 against 360, an
effective size of 90) and, before that, 0.15 (240 against 240). What it still detects is
a rule or its plumbing gone wrong (q read from another row or column, p without vLLM's
filters, a residual not drawn): those move far more than 0.24, and the mutation check's
controls show it (``tests/mutations.py``); small biases are the sampler-level tests'
subject (``tests/verify``: 20k to 2M samples per case, 0.5% caught).

The target alone and the control run in one engine (per-request temperatures), the
session's (``conftest.gemma_alone``): the Ray, lifecycle and tensor-parallel modules
compare with it too. Three configurations that had an engine here ride other modules'
engines with the same rows and reference: union in a Ray actor the Ray module's
(``test_ray_executor.py``), fsd at tau = 0 with a frequent-token output layer the
lifecycle engine (``test_lifecycle.py``), dtw's faithful transfer the batch schedule's
(``test_batch_schedule.py``). Prompts go
in as token ids, tokenized once (``_gemma_pair.py``), and engines without structured
outputs load no vLLM tokenizer: Gemma-3's 262k-token tokenizer cost an engine about 18 s
(one core).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from _gemma_pair import (GREEDY, GREEDY_TOKENS, IN_PROCESS, JSON, SAMPLED, SEEDED, SEEDED_TOKENS, SEEDS, Group,
                         Rows, job, prompts, split)
from hetero_harness.evaluation import run_isolated_many, unwrap
from hetero_harness.prompts import BRIDGE_STRESS

from _stats import two_sample_pvalue


MIXED = "auto-mixed"
# Two engines offer every lossless rule (``algorithm: auto``, each of them a candidate for
# both kinds of request) and each case's requests name their rule
# (``extra_args["algorithm"]``, vLLM's ``vllm_xargs`` over HTTP), so that they verify every
# rule in mixed batches, beside auto's own choices (MIXED: its greedy and sampled rows
# drafting with different rules in one step). Two of them, each with half the cases,
# because one took as long as all the other engines of this module together: one core sat
# idle for half the module. Three settings are the engine's, not a request's, and ride
# other modules' engines with these rows: fsd at tau = 0 with the frequent-token output
# layer (draft_head_tokens) the lifecycle engine (test_lifecycle.py), dtw's paper-faithful
# transfer (lossless at T = 0 only) the batch schedule's (test_batch_schedule.py), and
# union drafting in a Ray actor the Ray module's. The rules that verify
# with a real q also run structured outputs. Every case also runs the seeded requests
# (first in auto's rows, last elsewhere), which must come out the same in every engine
# (other rules, drafts, batches and histories), and again one at a time after the batch.
ALL_RULES = ["slem", "tli", "dtw", "slrs", "union"]
# auto starts greedy rows on slem and sampled ones on tli, so its rows of one step differ.
RULES_ENGINE = {"algorithm": "auto", "auto_greedy": ALL_RULES, "auto_sampled": ["tli", "slrs", "union", "slem", "dtw"],
                "dtw_verify": "lossless"}
# case: (its engine, the rule its requests name or None for auto's choice, its rows)
CASES: dict[str, tuple[str, str | None, tuple[Rows, ...]]] = {
    MIXED: ("rules", None, (SEEDED, GREEDY, SAMPLED)),
    "slem": ("rules", "slem", (GREEDY, SAMPLED, SEEDED)),
    "tli": ("rules", "tli", (GREEDY, SAMPLED, JSON, SEEDED)),
    "dtw": ("rules-2", "dtw", (GREEDY, SAMPLED, SEEDED)),
    "slrs": ("rules-2", "slrs", (GREEDY, SAMPLED, SEEDED)),
    "union": ("rules-2", "union", (GREEDY, SAMPLED, JSON, SEEDED)),
}
ENGINES: dict[str, dict] = {
    "rules": RULES_ENGINE,
    "rules-2": RULES_ENGINE,
}
# The seeded requests run again one at a time in auto's engine only: auto starts sampled
# rows on tli (RULES_ENGINE), so these are tli's seeded rows too. tli's own case ran
# them alone as well: eight more single-request generations that repeated this.
SOLO_CASES = (MIXED,)
SAMPLED_CASES = [c for c, (_, _, rows) in CASES.items() if SAMPLED in rows]
JSON_CASES = [c for c, (_, _, rows) in CASES.items() if JSON in rows]


@pytest.fixture(scope="module")
def runs(selected_params, gemma: str, smollm2: str, count_rows, gemma_alone) -> dict[str, dict[str, dict | Exception]]:
    """The target alone (the session's, ``conftest.gemma_alone``, run here beside this
    module's engines unless another module ran it first) and every engine the selected
    cases need, two at a time, the longest first: ``{"target" or case: {rows name:
    result}}``. A fixed draft length, so that every step drafts and the tests keep their
    power (the Qwen pair's identity tests, test_serving.py, run the adaptive budget)."""
    cases = list(dict.fromkeys(selected_params("case") + selected_params("json_case")))
    ids = prompts(gemma)
    jobs: dict[str, tuple[dict, list[Group]]] = {}
    for engine, spec in ENGINES.items():
        groups = [(case, rule, group) for case in cases for group in CASES[case][2]
                  if CASES[case][0] == engine for rule in (CASES[case][1],)]
        if groups:
            jobs[engine] = (job(gemma, ids, groups, {
                "method": "hetero", "model": smollm2, "num_speculative_tokens": 3, "draft_budget": "fixed", **spec},
                SOLO_CASES), groups)
    count_rows(sum(g.count for _, groups in jobs.values() for _, _, g in groups if not g.greedy and not g.seeded))
    order = sorted(jobs, key=lambda name: -len(jobs[name][0]["prompts"]))
    # The target alone beside this module's engines (unless another module ran it first):
    # its thread holds no lease while it waits for the run-wide result.
    with ThreadPoolExecutor(1) as alone:
        target = alone.submit(gemma_alone.results)
        results = dict(zip(order, run_isolated_many([jobs[name][0] for name in order], env=IN_PROCESS)))
        out: dict[str, dict[str, dict | Exception]] = {"target": target.result()}
    for name, result in results.items():
        out.update(split(result, jobs[name][1], ids, jobs[name][0]["solo"]))
    return out


def _tokens(runs: dict, name: str, rows: str) -> list[list[int]]:
    result = unwrap(runs[name][rows])
    if name in CASES:
        # Otherwise a drafter that never drafts (or always fails) would pass vacuously.
        summary = {k: result.get(k) for k in ("num_draft_tokens", "num_accepted_tokens", "fallbacks", "elapsed_s",
                                              "drafter_stats")}
        assert result["num_accepted_tokens"] > 0 and result["fallbacks"] == 0, summary
        if CASES[name][1] in ("slrs", "slem", "dtw", "tli", "union"):  # each named rule drafted
            assert CASES[name][1] in result["rules_chosen"], result["rules_chosen"]
        if CASES[name][1] == "slrs":  # psi was computed, not skipped for slem
            assert result["drafter_stats"]["slrs_tree_nodes"] > 0, result["drafter_stats"]
    return result["token_ids"]


def _same_distribution(runs: dict, reference: tuple[str, str], other: tuple[str, str]) -> list[float]:
    a, b = _tokens(runs, *reference), _tokens(runs, *other)
    return [two_sample_pvalue([o[pos] for o in a], [o[pos] for o in b]) for pos in (1, 2)]


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_identical_to_target_alone(runs: dict, case: str) -> None:
    want, got = _tokens(runs, "target", "greedy"), _tokens(runs, case, "greedy")
    assert len(got) == len(BRIDGE_STRESS) and all(len(t) == GREEDY_TOKENS for t in got)
    for prompt, a, b in zip(BRIDGE_STRESS, want, got):
        assert a == b, f"{case}: output differs for prompt {prompt!r}"


@pytest.mark.parametrize("case", SAMPLED_CASES)
def test_output_distribution_matches_target(runs: dict, case: str) -> None:
    for pos, p in zip((1, 2), _same_distribution(runs, ("target", "sampled"), (case, "sampled"))):
        assert p > 1e-3, f"{case}: position {pos} distribution differs from the target's (p={p:.1e})"


@pytest.mark.parametrize("json_case", JSON_CASES)
def test_structured_output_distribution_matches_target(runs: dict, json_case: str) -> None:
    """With a JSON schema, vLLM cuts each draft at its first invalid token; those
    requests are verified one-hot, and their outputs follow the constrained target's."""
    for pos, p in zip((1, 2), _same_distribution(runs, ("target", "json"), (json_case, "json"))):
        assert p > 1e-3, f"{json_case}: position {pos} distribution differs from the target's (p={p:.1e})"


def test_control_detects_a_different_distribution(runs: dict) -> None:
    assert min(_same_distribution(runs, ("target", "sampled"), ("target", "control"))) < 1e-3


def test_seeded_requests_repeat_in_every_engine(runs: dict) -> None:
    """Same seed, same tokens: the seeded requests come out token for token the same
    under every rule, in batches of other compositions and orders, after other
    histories, and alone after the batch; and their seeds give different outputs (the
    test could fail)."""
    outputs = {}
    for case in CASES:
        if case not in runs:
            continue
        result = unwrap(runs[case]["seeded"])
        outputs[case] = result["token_ids"]
        assert all(len(t) == SEEDED_TOKENS for t in outputs[case]), case
        if case in SOLO_CASES:
            outputs[f"{case} (alone)"] = result["solo_token_ids"]
    assert len(outputs) >= 2, "fewer than two engines ran the seeded requests: nothing to compare"
    reference = outputs[next(iter(outputs))]
    for name, tokens in outputs.items():
        assert tokens == reference, f"{name}: the seeded requests' tokens differ from {next(iter(outputs))}'s"
    assert len({tuple(t) for t in reference}) == len(SEEDS), "the seeded requests gave equal outputs"
