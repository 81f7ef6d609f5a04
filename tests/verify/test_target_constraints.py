"""min_p and logit_bias at every verified position, as plain decoding applies them.

vLLM 0.32 refuses both with speculative decoding; ``method: hetero`` accepts them and
the sampler applies them to every drafted row (``verify/target_constraints.py``), the
bonus token and undrafted steps getting vLLM's own sampler. One batch mixes requests
with min_p, with logit_bias, with both and top-k/top-p at T = 0.8, and with neither;
seeded and unseeded; every row sees the vocabulary through a permutation of its own, so
its bias sits on other ids than its neighbours' and a row that read another row's
bias or min_p would follow another law. Mapped back, every position's emitted token
must follow the law computed here, independently of vLLM: bias, then temperature, then
min_p, then top-k and top-p.
"""

from __future__ import annotations

import pytest
import torch
from _sampler_inputs import batch_rows, logits_processors, sampling_metadata, spec_metadata
from _stats import conditional_pvalue
from vllm import SamplingParams
from vllm.v1.sample.sampler import Sampler

import vllm_hetero_spec
from vllm_hetero_spec.verify.draft_probs import DraftProbs
from vllm_hetero_spec.verify.plan import VerifyPlan
from vllm_hetero_spec.verify.sampler import HeteroRejectionSampler

V, K = 32, 2
ROWS_PER_KIND = 6000
ALPHA = 1e-4
BASE = torch.randn(K + 1, V, generator=torch.Generator().manual_seed(3)) * 2  # per position, shared by every kind
TOP = [int(BASE[j].argmax()) for j in range(K + 1)]
KINDS = {
    "min_p 0.05": dict(temperature=1.0, min_p=0.05, bias={}),
    "logit_bias": dict(temperature=1.0, min_p=0.0, bias={TOP[0]: -100.0, 5: 3.0, 9: 1.5}),
    "both, T 0.8, top-k 12, top-p 0.8": dict(temperature=0.8, min_p=0.1, bias={TOP[1]: -2.0, 7: 2.5},
                                             top_k=12, top_p=0.8),
    "neither": dict(temperature=1.0, min_p=0.0, bias={}),
}


def law(kind: dict, pos: int) -> torch.Tensor:
    """The target's law at ``pos`` for ``kind``, in the base ids."""
    x = BASE[pos].double().clone()
    for token, value in kind["bias"].items():
        x[token] += value
    x /= kind["temperature"]
    p = x.softmax(-1)
    x[p < kind["min_p"] * p.max()] = float("-inf")
    order = x.argsort(descending=True)
    x[order[kind.get("top_k", V):]] = float("-inf")
    p = x.softmax(-1)
    head = p[order].cumsum(0) - p[order] < kind.get("top_p", 1.0)
    x[order[~head]] = float("-inf")
    return x.softmax(-1)


@pytest.fixture(scope="module")
def verified() -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """One verify call over every kind's rows, interleaved: the kinds, each row's
    permutation ``[B, V]`` and the emitted tokens mapped back to base ids ``[B, K + 1]``
    (-1 where nothing was emitted)."""
    vllm_hetero_spec.register()
    gen = torch.Generator().manual_seed(8)
    names = [name for name in KINDS for _ in range(ROWS_PER_KIND)]
    order = torch.randperm(len(names), generator=gen).tolist()
    names = [names[i] for i in order]
    b = len(names)
    perm = torch.rand(b, V, generator=gen).argsort(dim=1)  # row r's token t is base token perm[r, t]
    inverse = perm.argsort(dim=1)
    lean = 0.7 * (BASE[:K] * 0.8).softmax(-1) + 0.3 / V  # the drafter's law: near p, not p, no bias
    q = lean[:, perm].transpose(0, 1).contiguous()  # [B, K, V]
    num_draft = torch.multinomial(torch.tensor([0.1, 0.1, 0.8]), b, replacement=True, generator=gen).tolist()
    drafts = torch.multinomial(q.view(b * K, V), 1, generator=gen).view(b, K)
    params = []
    for r, name in enumerate(names):
        kind = KINDS[name]
        bias = {int(inverse[r, t]): v for t, v in kind["bias"].items()}
        params.append(SamplingParams(temperature=kind["temperature"], min_p=kind["min_p"], logit_bias=bias or None))
    draft_rows = [drafts[r, : num_draft[r]].tolist() for r in range(b)]
    logits = torch.cat([BASE[: num_draft[r] + 1][:, perm[r]] for r in range(b)])
    plan = VerifyPlan(DraftProbs(torch.cat([q[r, : num_draft[r]] for r in range(b)]), torch.arange(V)))
    start = 0
    for r in range(b):
        plan.q_index[f"r{r}"] = list(range(start, start + num_draft[r]))
        start += num_draft[r]
    gens = {r: torch.Generator().manual_seed(500 + r) for r in range(0, b, 2)}
    meta = sampling_metadata(
        b, [KINDS[n]["temperature"] for n in names], top_k=[KINDS[n].get("top_k", V) for n in names],
        top_p=[KINDS[n].get("top_p", 1.0) for n in names], generators=gens, logitsprocs=logits_processors(params),
    )
    rows = batch_rows([f"r{r}" for r in range(b)], [KINDS[n]["temperature"] for n in names], list(range(b)))
    sampler = HeteroRejectionSampler(Sampler(), None, torch.device("cpu"), batch_rows=lambda: rows)
    sampler.plan = plan
    torch.manual_seed(5)
    out = sampler(spec_metadata(draft_rows), None, logits, meta).sampled_token_ids.long()
    mapped = torch.where(out >= 0, perm.gather(1, out.clamp(min=0)), -1)
    return names, perm, mapped


@pytest.mark.parametrize("pos", range(K + 1))
@pytest.mark.parametrize("name", KINDS)
def test_every_position_follows_the_law_plain_decoding_samples(verified, name: str, pos: int) -> None:
    names, _, mapped = verified
    rows = torch.tensor([r for r, n in enumerate(names) if n == name])
    tokens = mapped[rows, pos]
    tokens = tokens[tokens >= 0]
    assert tokens.numel() > 300, "too few rows reached this position: the test would prove little"
    p = law(KINDS[name], pos)
    pvalue = conditional_pvalue(torch.zeros_like(tokens), tokens, p.unsqueeze(0).float())
    assert pvalue > ALPHA, f"{name} at position {pos}: p = {pvalue:.1e}"


def test_what_the_laws_rule_out_is_never_emitted(verified) -> None:
    """The bias of -100 and min_p's cut leave tokens with zero probability: none is
    emitted at any position (a chi-square alone reads them only through their counts)."""
    names, _, mapped = verified
    for name, kind in KINDS.items():
        rows = torch.tensor([r for r, n in enumerate(names) if n == name])
        for pos in range(K + 1):
            tokens = mapped[rows, pos]
            tokens = tokens[tokens >= 0]
            assert bool((law(kind, pos)[tokens] > 0).all()), (name, pos)
    assert float(law(KINDS["logit_bias"], 0)[TOP[0]]) == 0.0 and float(law(KINDS["min_p 0.05"], 0).eq(0).sum()) > 3, \
        "nothing is ruled out: the test would prove nothing"


def test_a_greedy_row_takes_the_argmax_after_its_bias() -> None:
    """At T = 0 a bias that moves the argmax moves the greedy token at every drafted
    position and the bonus, as in plain decoding."""
    vllm_hetero_spec.register()
    logits = BASE[: K + 1].clone()
    target = [int(BASE[j].argsort(descending=True)[3]) for j in range(K + 1)]
    bias = {t: 50.0 for t in set(target[:1])}
    params = [SamplingParams(temperature=0.0, logit_bias=bias)]
    meta = sampling_metadata(1, [0.0], logitsprocs=logits_processors(params))
    sampler = HeteroRejectionSampler(Sampler(), None, torch.device("cpu"), batch_rows=lambda: batch_rows(["g"], [0.0]))
    out = sampler(spec_metadata([[target[0], target[0]]]), None, logits, meta).sampled_token_ids[0].tolist()
    assert out == [target[0], target[0], target[0]], out
