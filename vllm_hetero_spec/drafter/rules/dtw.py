"""``dtw`` with ``dtw_verify: faithful`` (TokenTiming): draft and proxy tokens are
aligned by DTW and the matched draft token's probability becomes the proxy token's
proposal probability (a one-entry q row). Lossless ``dtw`` is the base draft rule."""

from __future__ import annotations

import torch

from vllm_hetero_spec.drafter.messages import DraftOutput, FirstToken, StepBatch, StepDrafts
from vllm_hetero_spec.drafter.sampling import GREEDY_EPS
from vllm_hetero_spec.drafter.rules.base import DraftRule
from vllm_hetero_spec.host_to_device import to_device
from vllm_hetero_spec.verify.draft_probs import DraftProbs
from vllm_hetero_spec.vocab.alignment import dtw_align_batch
from vllm_hetero_spec.vocab.dtw import transfer_probs


class DtwFaithful(DraftRule):
    """Re-tokenized like ``slem``, with TokenTiming's transferred probabilities as q."""

    def add_q(
        self, out: StepDrafts, batch: StepBatch, active: list[int], draft: DraftOutput, proposals: list[list[int]],
        first: dict[str, FirstToken],
    ) -> None:
        ctx = self.ctx
        bodies = [[t for t in ids if t not in ctx.draft_specials] for ids in draft.ids]
        proxies = [[t for t in ids if t != ctx.target_eos] for ids in proposals]
        results = dtw_align_batch(
            bodies, proxies, ctx.bridge.draft_encoder.packed, ctx.bridge.target_encoder.packed,
            ctx.settings.dtw_window,
        )
        out.q_index = [[-1] * len(ids) for ids in out.ids]
        support, probs = [], []
        for n, (i, ids) in enumerate(zip(active, proposals)):
            if batch.params[i].temperature < GREEDY_EPS:
                continue  # verified by argmax: q is never read
            q = transfer_probs(results[n].path, draft.token_q[n], len(ids))
            out.q_index[i] = list(range(len(probs), len(probs) + len(ids)))
            support += ids
            probs += list(q)
        if probs:
            out.q = DraftProbs(to_device(probs, torch.float32, ctx.device).unsqueeze(1),
                               to_device(support, torch.long, ctx.device).unsqueeze(1))
