"""The order of the sampling transformations at a drafted row is plain decoding's:
``logit_bias``, then the penalties (repetition, then frequency and presence), then the
temperature, ``min_p`` on the tempered law, then top-k, then top-p.

One request setting all of them, 20,000 rows of it, each drafting two tokens: the token
emitted at the first drafted position follows the target's law there (a one-hot draft
accepted with p of it, else the residual: exactly p), so its frequencies must match the
law computed here in plain decoding's order. The logits, bias and penalties are chosen so
that exchanging any two neighbours changes that law by far more than 20,000 draws miss
(checked below against each exchanged law). Three pairs commute and need no test:
temperature and min_p with top-k (top-k keeps ranks, which neither a positive temperature
nor min_p's threshold relative to the largest moves), and the repetition penalty with the
temperature (both scale a logit, keeping its sign; frequency and presence, which add, do
not commute with it, and are set).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

import torch
from vllm import SamplingParams
from vllm.v1.sample.sampler import Sampler

import vllm_hetero_spec
from _sampler_inputs import batch_rows, logits_processors, penalties, sampling_metadata, spec_metadata
from _stats import follows_pvalue
from vllm_hetero_spec.verify.sampler import HeteroRejectionSampler

V = 16
N = 20_000
PROMPT = [13]
COMMITTED = [3, 3, 9]
BIAS = {3: 2.5, 11: -1.0, 6: 1.2}
REPETITION, FREQUENCY, PRESENCE = 1.6, 0.4, 0.3
TEMPERATURE = 0.6
DRAFTS = [0, 1]


@dataclass(frozen=True)
class Case:
    """The first drafted row's logits and the filters; each case makes some exchanges bite."""

    first: tuple[float, ...]
    top_k: int
    top_p: float
    min_p: float


CASES = {
    # min_p cuts inside the top-k: bias/penalties, penalties/temperature, temperature/min_p
    # and min_p/top-p (min_p after the filters) each move the law.
    "min_p bites": Case((-1.69, -1.73, -0.38, -0.65, 1.27, 1.04, -0.47, -3.17, 0.48, -1.9, 0.52, 0.46, 0.18, 1.86,
                         1.68, -0.37), 10, 0.89, 0.098),
    # no min_p, a small top-k and a low top-p: top-k/top-p move the law.
    "top-k bites": Case((-1.68, 0.64, 0.2, 1.48, 0.67, 1.11, -1.93, -0.72, 0.87, 0.18, -0.76, 0.51, 1.55, 2.58, -0.57,
                         2.15), 4, 0.68, 0.0),
}

Step = Callable[[torch.Tensor, Case], torch.Tensor]


def _bias(x: torch.Tensor, case: Case) -> torch.Tensor:
    x = x.clone()
    for t, b in BIAS.items():
        x[t] += b
    return x


def _penalties(x: torch.Tensor, case: Case) -> torch.Tensor:
    x = x.clone()
    for t in set(PROMPT) | set(COMMITTED):
        x[t] = x[t] / REPETITION if x[t] > 0 else x[t] * REPETITION
    for t in set(COMMITTED):
        x[t] -= FREQUENCY * COMMITTED.count(t) + PRESENCE
    return x


def _temperature(x: torch.Tensor, case: Case) -> torch.Tensor:
    return x / TEMPERATURE


def _min_p(x: torch.Tensor, case: Case) -> torch.Tensor:
    p = x.softmax(-1)
    return x.masked_fill(p < case.min_p * p.max(), float("-inf"))


def _top_k(x: torch.Tensor, case: Case) -> torch.Tensor:
    kth = x.topk(case.top_k).values[-1]
    return x.masked_fill(x < kth, float("-inf"))


def _top_p(x: torch.Tensor, case: Case) -> torch.Tensor:
    order = x.argsort()  # ascending: drop the smallest while the mass below is <= 1 - p
    below = x[order].softmax(-1).cumsum(-1)
    drop = below <= 1 - case.top_p
    drop[-1] = False
    return x.clone().index_fill_(0, order[drop], float("-inf"))


PLAIN: list[Step] = [_bias, _penalties, _temperature, _min_p, _top_k, _top_p]
# Exchanges that leave every law alone: top-k keeps ranks (which neither a positive
# temperature nor min_p's relative threshold moves).
COMMUTE = [{_temperature, _top_k}, {_min_p, _top_k}]


def _law(steps: list[Step], case: Case) -> torch.Tensor:
    x = torch.tensor(case.first)
    for step in steps:
        x = step(x, case)
    return x.softmax(-1)


def _exchanges() -> dict[str, list[Step]]:
    """Every neighbour exchange that does not commute, and min_p moved after the filters."""
    out = {}
    for i in range(len(PLAIN) - 1):
        if {PLAIN[i], PLAIN[i + 1]} not in COMMUTE:
            out[f"{PLAIN[i].__name__} <-> {PLAIN[i + 1].__name__}"] = PLAIN[:i] + [PLAIN[i + 1], PLAIN[i]] + PLAIN[i + 2:]
    out["_min_p after the filters"] = [_bias, _penalties, _temperature, _top_k, _top_p, _min_p]
    return out


def _first_tokens(case: Case) -> torch.Tensor:
    vllm_hetero_spec.register()
    params = SamplingParams(temperature=TEMPERATURE, top_k=case.top_k, top_p=case.top_p, min_p=case.min_p,
                            logit_bias=BIAS, repetition_penalty=REPETITION, frequency_penalty=FREQUENCY,
                            presence_penalty=PRESENCE)
    outputs = [list(COMMITTED) for _ in range(N)]
    meta = replace(
        sampling_metadata(N, [TEMPERATURE] * N, top_k=[case.top_k] * N, top_p=[case.top_p] * N,
                          logitsprocs=logits_processors([params] * N, outputs=outputs)),
        output_token_ids=outputs, spec_token_ids=[list(DRAFTS) for _ in range(N)],
        **penalties(N, PROMPT, repetition=REPETITION, presence=PRESENCE, frequency=FREQUENCY))
    first = torch.tensor(case.first)
    logits = torch.stack([first, first.roll(3), first.roll(5)] * N)  # per request: 2 drafted rows, the bonus
    rows = batch_rows([f"r{i}" for i in range(N)], [TEMPERATURE] * N, [len(PROMPT) + len(COMMITTED)] * N)
    sampler = HeteroRejectionSampler(Sampler(), None, torch.device("cpu"), batch_rows=lambda: rows)
    return sampler(spec_metadata([list(DRAFTS)] * N), None, logits, meta).sampled_token_ids[:, 0].long()


@pytest.mark.parametrize("name", list(CASES))
def test_the_first_drafted_position_applies_plain_decodings_order(name: str) -> None:
    case = CASES[name]
    tokens = _first_tokens(case)
    assert follows_pvalue(tokens, _law(PLAIN, case)) > 1e-4
    # Each exchange this case is built for moves the law far beyond the draws' noise.
    moved = {swap: float((_law(steps, case) - _law(PLAIN, case)).abs().sum()) for swap, steps in _exchanges().items()}
    assert sum(d > 0.1 for d in moved.values()) >= 2, moved


def test_every_exchange_that_does_not_commute_moves_a_tested_law() -> None:
    """So each exchange, made in the code, fails the test above for some case."""
    for swap, steps in _exchanges().items():
        assert max(float((_law(steps, c) - _law(PLAIN, c)).abs().sum()) for c in CASES.values()) > 0.1, swap
