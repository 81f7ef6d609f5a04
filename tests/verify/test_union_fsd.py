"""union and fsd pieces, exactly: divergences, the rule's extensions, the per-request
plan, configuration and per-request validation, drafting, and the sampler's plumbing."""

from __future__ import annotations

import json
import math

import pytest
import torch
from _sampler_inputs import batch_rows, sampling_metadata, spec_metadata

import vllm_hetero_spec
from vllm_hetero_spec.config import HeteroConfigError, parse_settings, request_fsd_threshold
from vllm_hetero_spec.drafter.sampling import SamplingRows
from vllm_hetero_spec.drafter.rules.mapped_sampling import ABSENT_PLACEHOLDER, draft_step
from vllm_hetero_spec.verify.divergence import DIVERGENCE_NAMES, divergence
from vllm_hetero_spec.verify.plan import VerifyPlan
from vllm_hetero_spec.verify.rules import PLACEHOLDER, FuzzyAcceptance, verify_block
from vllm_hetero_spec.vocab.intersection import VocabIntersection

# -- divergences ------------------------------------------------------------------------


@pytest.mark.parametrize("name", DIVERGENCE_NAMES)
def test_divergence_of_identical_distributions_is_zero(name: str) -> None:
    p = torch.softmax(torch.randn(3, 4, 20), -1)
    d = divergence(name, p, p.clone(), 5)
    assert d.shape == (3, 4)
    assert torch.allclose(d, torch.zeros_like(d), atol=1e-6)


def test_divergence_values() -> None:
    p = torch.tensor([0.5, 0.5, 0.0, 0.0])
    q = torch.tensor([0.0, 0.0, 0.5, 0.5])
    assert math.isclose(float(divergence("js", p, q, 2)), math.log(2), rel_tol=1e-6)
    assert math.isclose(float(divergence("tv", p, q, 2)), 1.0)
    assert math.isinf(float(divergence("kl", p, q, 2)))
    # KL(p || q) is finite where only q has mass the other lacks, infinite the other way.
    wide = torch.tensor([0.25, 0.25, 0.25, 0.25])
    assert math.isclose(float(divergence("kl", p, wide, 2)), math.log(2), rel_tol=1e-6)
    assert math.isinf(float(divergence("kl", wide, p, 2)))


def test_topk_divergences_ignore_the_tail() -> None:
    """Equal (up to scale) on the union of both top-2 sets, different in the tail."""
    p = torch.tensor([0.5, 0.3, 0.1, 0.1, 0.0])
    q = torch.tensor([0.25, 0.15, 0.0, 0.1, 0.5])
    assert float(divergence("js", p, q, 2)) > 0.1
    q2 = torch.tensor([0.5, 0.3, 0.2, 0.0, 0.0])
    for name in ("js_topk", "kl_topk", "tv_topk"):
        assert float(divergence(name, p, q2, 2)) < 1e-6, name


def test_unknown_divergence() -> None:
    with pytest.raises(ValueError, match="unknown divergence"):
        divergence("hellinger", torch.ones(2) / 2, torch.ones(2) / 2, 1)


# -- the rule's extensions ----------------------------------------------------------------


def _block(b: int, k: int, v: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(b, k, v, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 2, -1)
    draft = torch.multinomial(q.view(-1, v), 1, generator=g).view(b, k)
    rand = (
        torch.multinomial(p[:, -1], 1, generator=g).squeeze(1),
        torch.zeros(b, dtype=torch.bool),
        torch.rand(b, k, dtype=torch.float64, generator=g),
        torch.empty(b, v).exponential_(generator=g),
    )
    return draft, torch.full((b,), k), p, q, rand


def test_fuzzy_at_zero_threshold_is_the_lossless_rule() -> None:
    draft, n, p, q, rand = _block(5000, 3, 12)
    plain = verify_block(draft, n, p, q, *rand)
    for name in DIVERGENCE_NAMES:
        fuzzy = verify_block(draft, n, p, q, *rand, fuzzy=FuzzyAcceptance(torch.zeros(5000), name, 3))
        assert torch.equal(plain, fuzzy), name


def test_fuzzy_accepts_below_threshold_but_never_a_forbidden_token() -> None:
    draft, n, p, q, rand = _block(4000, 2, 12, seed=1)
    p[:2000, 0].scatter_(1, draft[:2000, :1], 0.0)  # the target forbids the first draft here
    p = p / p.sum(-1, keepdim=True)
    tau = torch.full((4000,), 10.0)  # above every js value: accept whatever is allowed
    out = verify_block(draft, n, p, q, *rand, fuzzy=FuzzyAcceptance(tau, "js"))
    assert bool((out[:2000, 0] != draft[:2000, 0]).all())
    assert torch.equal(out[2000:, :2], draft[2000:])


def test_per_row_thresholds() -> None:
    draft, n, p, q, rand = _block(4000, 1, 12, seed=2)
    tau = torch.tensor([0.0, 10.0]).repeat(2000)
    out = verify_block(draft, n, p, q, *rand, fuzzy=FuzzyAcceptance(tau, "tv"))
    assert torch.equal(out[1::2, 0], draft[1::2, 0])
    assert float((out[::2, 0] == draft[::2, 0]).float().mean()) < 0.9


def test_forced_rejection_samples_the_unnormalized_residual() -> None:
    """q_in has mass 0.5 (the rest was on an absent token): the residual
    max(p - q_in, 0) = [0, 0.5, 0] is what must be emitted, whatever the draft."""
    b = 1000
    p = torch.tensor([0.5, 0.5, 0.0]).expand(b, 1, 3)
    q_in = torch.tensor([0.5, 0.0, 0.0]).expand(b, 1, 3)
    out = verify_block(
        torch.full((b, 1), ABSENT_PLACEHOLDER), torch.ones(b, dtype=torch.long), p, q_in,
        torch.zeros(b, dtype=torch.long), torch.zeros(b, dtype=torch.bool), torch.zeros(b, 1, dtype=torch.float64),
        torch.empty(b, 3).exponential_(), force_reject=torch.ones(b, 1, dtype=torch.bool),
    )
    assert bool((out[:, 0] == 1).all()) and bool((out[:, 1] == PLACEHOLDER).all())


def test_extensions_need_draft_probs() -> None:
    draft, n, p, _, rand = _block(4, 2, 5)
    with pytest.raises(ValueError, match="draft_probs"):
        verify_block(draft, n, p, None, *rand, force_reject=torch.zeros(4, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="draft_probs"):
        verify_block(draft, n, p, None, *rand, fuzzy=FuzzyAcceptance(torch.zeros(4)))


# -- drafting -----------------------------------------------------------------------------


def _inter() -> VocabIntersection:
    draft = [b"a", b"b", b"xy", None, b"a"]  # "xy" and the special are absent; "a" twice
    target = [b"b", b"a", b"c"]
    return VocabIntersection.build(draft, target)


def _rows(n: int) -> SamplingRows:
    return SamplingRows.build([1.0] * n, [0] * n, [1.0] * n, [None] * n, torch.device("cpu"))


def test_union_drafts_absent_tokens_with_unnormalized_q() -> None:
    inter = _inter()
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.15, 0.25]])).expand(20_000, 5)
    step = draft_step(logits, _rows(20_000), inter, "union")
    absent = torch.isin(step.ids, torch.tensor([2, 3]))
    assert torch.equal(step.absent, absent)
    assert bool((step.target_ids[absent] == ABSENT_PLACEHOLDER).all())
    assert torch.allclose(step.target_q(3)[0], torch.tensor([0.2, 0.35, 0.0]))  # the two "a" ids add up
    assert 0.4 < float(absent.float().mean()) < 0.5


def test_tli_and_fsd_draft_only_shared_tokens() -> None:
    inter = _inter()
    logits = torch.randn(5000, 5)
    for algorithm in ("tli", "fsd"):
        step = draft_step(logits, _rows(5000), inter, algorithm)
        assert not bool(step.absent.any())
        assert torch.allclose(step.target_q(3).sum(-1), torch.ones(5000))
    with pytest.raises(ValueError, match="token-level"):
        draft_step(logits, _rows(5000), inter, "slem")


def test_greedy_fsd_compares_the_models_untempered_distributions() -> None:
    """At T = 0 the drafter samples its argmax, but fsd's verifier gets the drafter's
    model distribution (restricted to the intersection), so a target whose distribution
    is close accepts a draft that is not its own argmax; tli keeps the one-hot."""
    inter = _inter()
    logits = torch.log(torch.tensor([[0.1, 0.5, 0.1, 0.2, 0.1]]))  # intersection: ids 0, 1, 4
    greedy = SamplingRows.build([0.0], [0], [1.0], [None], torch.device("cpu"))
    fsd = draft_step(logits, greedy, inter, "fsd")
    tli = draft_step(logits, greedy, inter, "tli")
    assert fsd.ids.tolist() == tli.ids.tolist() == [1]  # "b", the argmax
    assert torch.allclose(fsd.target_q(3)[0], torch.tensor([0.5, 0.2, 0.0]) / 0.7)
    assert tli.target_q(3)[0].tolist() == [1.0, 0.0, 0.0]
    p = torch.tensor([[[0.45, 0.55, 0.0]]])  # the target prefers "a" but is close to q
    args = (torch.ones(1, dtype=torch.long), p, fsd.target_q(3).unsqueeze(1), torch.tensor([2]),
            torch.ones(1, dtype=torch.bool), torch.zeros(1, 1, dtype=torch.float64), torch.ones(1, 3))
    draft = fsd.target_ids.unsqueeze(1)
    assert verify_block(draft, *args, fuzzy=FuzzyAcceptance(torch.tensor([0.05]), "js"))[0, 0] == 0
    assert verify_block(draft, *args, fuzzy=FuzzyAcceptance(torch.tensor([0.0]), "js"))[0, 0] == 1


# -- the per-request plan -----------------------------------------------------------------


def test_plan_follows_the_verify_time_batch_order() -> None:
    plan = VerifyPlan(None, {}, set(), {"b": [False, True, False]}, {"a": 0.2, "b": 0.0}, divergence="kl", topk=4)
    cpu = torch.device("cpu")
    block = plan.layout(["c", "b", "a"], [2, 2, 1], 2, cpu)
    assert block.force_reject.tolist() == [[False, False], [False, True], [False, False]]
    assert block.fuzzy is None  # no q rows, nothing to compare
    from vllm_hetero_spec.verify.draft_probs import DraftProbs

    plan.q, plan.q_index = DraftProbs(torch.ones(2, 3) / 3, torch.arange(3)), {"a": [1], "b": [-1, 0]}
    block = plan.layout(["c", "b", "a"], [2, 2, 1], 2, cpu)
    assert block.q.index.tolist() == [[-1, -1], [-1, 0], [1, -1]]
    assert block.fuzzy.threshold.tolist() == [0.0, 0.0, 0.2]  # an unknown request verifies losslessly
    assert (block.fuzzy.divergence, block.fuzzy.topk) == ("kl", 4)
    plan.fsd_threshold = {"a": 0.0, "b": 0.0}  # tau = 0 everywhere: the lossless test, no divergence computed
    assert plan.layout(["c", "b", "a"], [2, 2, 1], 2, cpu).fuzzy is None
    empty = VerifyPlan().layout(["a"], [2], 2, cpu)
    assert (empty.q, empty.force_reject, empty.fuzzy) == (None, None, None)


def test_one_hot_requests_lose_q_forced_rejections_and_tau() -> None:
    """A grammar-cut request is verified one-hot: no q row, no forced rejection, tau 0;
    the other rows keep theirs."""
    from vllm_hetero_spec.verify.draft_probs import DraftProbs

    q = DraftProbs(torch.ones(4, 3) / 3, torch.arange(3))
    plan = VerifyPlan(q, {"a": [0, 1], "b": [2, 3]}, {"b"}, {"a": [False, True], "b": [True, False]},
                      {"a": 0.2, "b": 0.3})
    block = plan.layout(["b", "a"], [2, 2], 2, torch.device("cpu"))
    assert block.q.index.tolist() == [[-1, -1], [0, 1]]
    assert block.force_reject.tolist() == [[False, False], [False, True]]
    assert block.fuzzy.threshold.tolist() == [0.0, 0.2]


# -- configuration ------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 0.3, 2])
def test_request_threshold_valid(value) -> None:
    assert request_fsd_threshold({"fsd_threshold": value}, 0.1) == float(value)


def test_request_threshold_default() -> None:
    assert request_fsd_threshold(None, 0.1) == 0.1
    assert request_fsd_threshold({"other": 1}, 0.1) == 0.1


@pytest.mark.parametrize("value", [-0.1, "0.1", True, None, float("nan"), float("inf"), [0.1], 10**400])
def test_request_threshold_invalid(value) -> None:
    with pytest.raises(ValueError, match=r"extra_args\['fsd_threshold'\] must be a finite number >= 0"):
        request_fsd_threshold({"fsd_threshold": value}, 0.1)


@pytest.fixture()
def draft_folder(tmp_path) -> str:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return str(tmp_path)


def test_fsd_settings(draft_folder: str) -> None:
    spec = {"method": "hetero", "model": draft_folder, "num_speculative_tokens": 3, "algorithm": "fsd",
            "fsd_threshold": 0.25, "fsd_divergence": "tv_topk", "fsd_topk": 5}
    settings, vllm_spec = parse_settings(spec)
    got = (settings.algorithm, settings.fsd_threshold, settings.fsd_divergence, settings.fsd_topk)
    assert got == ("fsd", 0.25, "tv_topk", 5)
    assert not {"fsd_threshold", "fsd_divergence", "fsd_topk"} & set(vllm_spec)
    union, _ = parse_settings({**spec, "algorithm": "union"})
    assert union.algorithm == "union"


@pytest.mark.parametrize(
    "override,key,fix",
    [
        ({"fsd_threshold": -1}, "'fsd_threshold'", "e.g. 0.1"),
        ({"fsd_threshold": "0.1"}, "'fsd_threshold'", "e.g. 0.1"),
        ({"fsd_threshold": float("nan")}, "'fsd_threshold'", "e.g. 0.1"),
        ({"fsd_divergence": "hellinger"}, "'fsd_divergence'", "choose one of"),
        ({"fsd_topk": 0}, "'fsd_topk'", "must be an integer >= 1"),
    ],
)
def test_bad_fsd_config_names_key_and_fix(draft_folder: str, override: dict, key: str, fix: str) -> None:
    spec = {"method": "hetero", "model": draft_folder, "num_speculative_tokens": 3, "algorithm": "fsd", **override}
    with pytest.raises(HeteroConfigError) as err:
        parse_settings(spec)
    assert key in str(err.value) and fix in str(err.value)


# -- the sampler's plumbing ---------------------------------------------------------------


def test_sampler_applies_the_proposers_plan() -> None:
    """Through vLLM's sampler path: row 0's forced rejection and row 2's threshold reach
    the rule for the right rows (the plan is keyed by request id, the batch reordered);
    the plan is used once."""
    from vllm.v1.sample.sampler import Sampler

    from vllm_hetero_spec.verify.draft_probs import DraftProbs
    from vllm_hetero_spec.verify.sampler import HeteroRejectionSampler

    vllm_hetero_spec.register()  # the CPU build needs the patched expand kernel
    v = 4
    drafts = [[1, 2], [1, 2], [3, 3]]
    logits = torch.full((9, v), -30.0)
    for r in range(2):  # rows 0 and 1: the target is sure of 1, then 2, then 3
        logits[3 * r, 1] = logits[3 * r + 1, 2] = logits[3 * r + 2, 3] = 30.0
    logits[6:, 0] = 30.0  # row 2: the target is sure of 0; the drafts (3) have p ~ 0
    logits[6:, 3] = 20.0  # ... but p(3) > 0, so a fuzzy acceptance is allowed
    q = DraftProbs(torch.tensor([[0.25] * 4] * 4 + [[0.0, 0.0, 0.0, 1.0]] * 2), torch.arange(v))
    plan = VerifyPlan(
        q, {"c": [4, 5], "a": [0, 1], "b": [2, 3]}, set(), {"a": [False, True]}, {"c": 10.0, "a": 0.0}, "js"
    )
    batch = ["a", "b", "c"]
    sampler = HeteroRejectionSampler(Sampler(), None, torch.device("cpu"), batch_rows=lambda: batch_rows(batch))
    sampler.plan = plan
    out = sampler(spec_metadata(drafts), None, logits, sampling_metadata(3)).sampled_token_ids
    assert out.tolist() == [[1, 2, PLACEHOLDER], [1, 2, 3], [3, 3, 0]]
    assert sampler.plan is None
    out = sampler(spec_metadata(drafts), None, logits, sampling_metadata(3)).sampled_token_ids
    assert out.tolist()[0] == [1, 2, 3] and out.tolist()[2][0] == 0  # no plan: plain one-hot verification
