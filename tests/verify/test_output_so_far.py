"""Every transformation whose input is the output so far sees, at each verified position,
the sequence plain decoding would see there: the committed outputs plus the drafts
accepted before it. The bonus row of a row with n drafts is output token committed + n
(it is emitted only when all n were accepted), so it must count all n.

One request at a time, sampled as vLLM's runner hands it to the sampler: one committed
output token, two drafts the target accepts (their logits dwarf the rest), and a bonus row
whose law the test computes by hand. At T = 0 the bonus token must be plain decoding's; at
T = 1, over 20,000 rows, it must follow plain decoding's law (chi-square), with controls
where the rule must still bite.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.sampler import Sampler

from _sampler_inputs import batch_rows, logits_processors, penalties, sampling_metadata, spec_metadata
from _stats import assert_follows
import vllm_hetero_spec
from vllm_hetero_spec.verify.sampler import HeteroRejectionSampler

V = 12
COMMITTED = [5]
DRAFTS = [1, 2]  # accepted: their logits are 40 above every other token's
STOP = 7
PROMPT = [11]
# The bonus row: the stop token leads, then token 9, then token 2 (the second draft).
BONUS = torch.tensor([0.0, 0.3, 1.0, 0.1, 0.2, 0.0, 0.4, 2.5, 0.0, 1.6, 0.0, 0.0])
N = 20_000


def _logits(n: int, bonus: torch.Tensor) -> torch.Tensor:
    """``[n * 3, V]``: per row its two drafted rows (each peaked on its draft) and the bonus."""
    rows = []
    for _ in range(n):
        for draft in DRAFTS:
            row = torch.zeros(V)
            row[draft] = 40.0
            rows.append(row)
        rows.append(bonus.clone())
    return torch.stack(rows)


def _sample(n: int, temperature: float, params: SamplingParams | None = None, bonus: torch.Tensor = BONUS,
            **fields) -> torch.Tensor:
    """``[n, 3]``: the tokens the sampler emits for ``n`` copies of the request."""
    vllm_hetero_spec.register()  # the CPU build's expand_batch_to_tokens fix among the patches
    outputs = [list(COMMITTED) for _ in range(n)]
    procs = logits_processors([params] * n, outputs=outputs) if params is not None else LogitsProcessors()
    meta = replace(sampling_metadata(n, [temperature] * n, logitsprocs=procs), output_token_ids=outputs,
                   spec_token_ids=[list(DRAFTS) for _ in range(n)], **fields)
    rows = batch_rows([f"r{i}" for i in range(n)], [temperature] * n, [len(PROMPT) + len(COMMITTED)] * n)
    sampler = HeteroRejectionSampler(Sampler(), None, torch.device("cpu"), batch_rows=lambda: rows)
    out = sampler(spec_metadata([list(DRAFTS)] * n), None, _logits(n, bonus), meta).sampled_token_ids
    assert (out[:, :2] == torch.tensor(DRAFTS)).all(), "the drafts were not accepted: the bonus row was never reached"
    return out[:, 2].long()


def _law(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits, dim=-1)


def _masked(logits: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    out = logits.clone()
    out[tokens] = float("-inf")
    return out


@pytest.mark.parametrize("min_tokens,masked", [(3, False), (4, True)], ids=["reached-at-bonus", "not-yet-at-bonus"])
def test_min_tokens_at_the_bonus_row_counts_the_accepted_drafts(min_tokens: int, masked: bool) -> None:
    """1 committed + 2 accepted drafts: the bonus is output token 3 (0-based), where
    ``min_tokens = 3`` no longer masks the stop token and ``min_tokens = 4`` still does."""
    params = SamplingParams(min_tokens=min_tokens, stop_token_ids=[STOP])
    want = _masked(BONUS, [STOP]) if masked else BONUS
    greedy = _sample(1, 0.0, params)
    assert int(greedy[0]) == int(want.argmax()), (greedy.tolist(), min_tokens)
    tokens = _sample(N, 1.0, params)
    assert_follows(tokens, _law(want))


@pytest.mark.parametrize("bad", [[2, 9], [1, 2, 9]], ids=["last-draft-then-bonus", "both-drafts-then-bonus"])
def test_a_bad_word_completed_at_the_bonus_row_by_accepted_drafts_is_banned(bad: list[int]) -> None:
    """A bad word whose prefix ends in the accepted drafts: its last token is banned at
    the bonus row, as plain decoding bans it after those outputs."""
    want = _masked(BONUS, [9])
    bad_words = {0: [bad]}
    assert int(_sample(1, 0.0, bad_words_token_ids=bad_words)[0]) == int(want.argmax())
    tokens = _sample(N, 1.0, bad_words_token_ids={i: [bad] for i in range(N)})
    assert_follows(tokens, _law(want))


def _repetition(logits: torch.Tensor, seen: set[int], penalty: float) -> torch.Tensor:
    """vLLM's repetition penalty: seen tokens' positive logits divided, negative multiplied."""
    out = logits.clone()
    for t in seen:
        out[t] = out[t] / penalty if out[t] > 0 else out[t] * penalty
    return out


def _penalties(n: int, **values: float) -> dict:
    return penalties(n, PROMPT, **values)


def test_penalties_at_the_bonus_row_count_the_accepted_drafts() -> None:
    """Repetition, presence and frequency penalties at the bonus row count the drafts it
    follows: the second draft (token 2) is penalised there, the stop token is not."""
    seen = set(PROMPT) | set(COMMITTED) | set(DRAFTS)
    want = _repetition(BONUS, seen, 4.0)
    leading = BONUS.clone()
    leading[2] = 3.0  # the second draft leads the bonus row until it is penalised
    greedy = _sample(1, 0.0, bonus=leading, **_penalties(1, repetition=4.0))
    assert int(greedy[0]) == int(_repetition(leading, seen, 4.0).argmax()) == STOP
    assert_follows(_sample(N, 1.0, **_penalties(N, repetition=4.0)), _law(want))
    # Presence and frequency count outputs only (the prompt is not penalised by them).
    counted = BONUS.clone()
    for t in COMMITTED + DRAFTS:
        counted[t] -= 1.5 + 0.5
    assert_follows(_sample(N, 1.0, **_penalties(N, presence=1.5, frequency=0.5)), _law(counted))
