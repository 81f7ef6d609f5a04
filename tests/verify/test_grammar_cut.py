"""Structured outputs cut drafts by value: the sampler stays lossless for those requests.

vLLM's scheduler keeps only the grammar-valid prefix of a draft, so a position is
verified only when the token drafted there is valid: the verified proposal's law is q
restricted to the valid tokens. These tests draft from q, apply that cut, and verify
through the sampler as vLLM calls it. The plan marks the requests one-hot (as the
proposer does for structured-output requests): the emitted token follows p. Verified
with the real q instead, ``tli`` emits (.549, .451) for p = (.5, .5, 0) and
q = (.9, 0, .1), which the same test rejects.
"""

from __future__ import annotations

import pytest
import torch
from _sampler_inputs import batch_rows, sampling_metadata, spec_metadata
from _stats import assert_follows, follows_pvalue
from vllm.v1.sample.sampler import Sampler

import vllm_hetero_spec
from vllm_hetero_spec.drafter.rules.mapped_sampling import ABSENT_PLACEHOLDER
from vllm_hetero_spec.verify.draft_probs import DraftProbs
from vllm_hetero_spec.verify.plan import VerifyPlan
from vllm_hetero_spec.verify.sampler import HeteroRejectionSampler

N = 20_000
P = torch.tensor([0.5, 0.5, 0.0])  # the grammar allows tokens 0 and 1 only
VALID = P > 0


@pytest.fixture(autouse=True)
def _plugin() -> None:
    vllm_hetero_spec.register()  # the CPU build needs the patched expand kernel


def _emitted(algorithm: str, one_hot: bool) -> torch.Tensor:
    """N single-token drafts drawn from the drafter, cut by the grammar as vLLM's
    scheduler cuts them, verified in one batch; the first emitted token per request.

    ``tli``: the drafter's law q on the target vocabulary is (.9, 0, .1). ``union``: the
    drafter samples target token 2 with .6, token 1 with .1 and a token the target lacks
    with .3 (proposed as the placeholder, token 0, and forced to be rejected); q_in is
    (0, .1, .6), not renormalized (with q, it emits token 1 with .533). The placeholder is grammar-valid here, so absent
    drafts survive the cut."""
    gen = torch.Generator().manual_seed(7)
    if algorithm == "tli":
        q = torch.tensor([0.9, 0.0, 0.1])
        drafted = torch.multinomial(q, N, replacement=True, generator=gen)
        absent = torch.zeros(N, dtype=torch.bool)
    else:
        q = torch.tensor([0.0, 0.1, 0.6])
        law = torch.tensor([0.3, 0.1, 0.6])  # absent, token 1, token 2
        pick = torch.multinomial(law, N, replacement=True, generator=gen)
        absent = pick == 0
        drafted = torch.where(absent, torch.full_like(pick, ABSENT_PLACEHOLDER), pick)
    kept = VALID[drafted]
    drafts = [[int(t)] if keep else [] for t, keep in zip(drafted, kept)]
    req_ids = [f"r{i}" for i in range(N)]
    plan = VerifyPlan(DraftProbs(q.expand(N, 3).clone(), torch.arange(3)), {r: [i] for i, r in enumerate(req_ids)})
    plan.force_reject = {r: [True] for r, a in zip(req_ids, absent.tolist()) if a}
    if one_hot:
        plan.one_hot = set(req_ids)
    n_pos = sum(len(d) + 1 for d in drafts)
    logits = P.log().expand(n_pos, 3).clone()  # -inf where the grammar forbids, as vLLM masks it
    sampler = HeteroRejectionSampler(Sampler(), None, torch.device("cpu"), batch_rows=lambda: batch_rows(req_ids))
    sampler.plan = plan
    torch.manual_seed(3)
    out = sampler(spec_metadata(drafts), None, logits, sampling_metadata(N)).sampled_token_ids
    return out[:, 0].long()


@pytest.mark.parametrize("algorithm", ["tli", "union"])
def test_grammar_cut_drafts_verified_one_hot_follow_the_target(algorithm: str) -> None:
    assert_follows(_emitted(algorithm, one_hot=True), P)


@pytest.mark.parametrize("algorithm", ["tli", "union"])
def test_grammar_cut_drafts_verified_with_q_are_biased(algorithm: str) -> None:
    """The control: the same cut verified with the real q is detected."""
    assert follows_pvalue(_emitted(algorithm, one_hot=False), P) < 1e-6
