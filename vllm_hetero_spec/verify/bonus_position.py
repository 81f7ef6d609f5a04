"""The bonus row's logits processors, at the bonus row's position.

The bonus token of a row with n drafts is output token ``committed + n``: it is emitted
only when every draft was accepted, so every transformation whose input is the output
so far must see the committed outputs plus all n drafts there. vLLM's sampler, called
with ``predict_bonus_token=True``, already gives penalties and ``bad_words`` that
sequence (``Sampler._combine_outputs_with_spec_tokens``), but runs the other logits
processors with the state they keep: ``MinTokensLogitsProcessor`` counts committed
outputs only, so a stop token stayed masked at a bonus position that had reached
``min_tokens`` (T = 0 ran past the stop plain decoding takes; T > 0 never stopped there).
At the drafted rows vLLM's rejection sampler already counts the drafts before each row
(``MinTokensLogitsProcessor.apply_with_spec_decode``).

:func:`bonus_logits_processors` hands the sampler the same processors in the same order,
the min-tokens one replaced for this call by a view that counts the row's drafts. Its
masking is vLLM's own (``_mask_stop_token_logits``, structured outputs' restore of a row
left all ``-inf`` included). Checked against vLLM 0.32.0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.logits_processor.builtin import MinTokensLogitsProcessor

from vllm_hetero_spec.host_to_device import to_device


class BonusMinTokens:
    """``inner``'s min-tokens rule for the bonus rows of a step with ``num_draft[r]``
    drafts in row r: a stop token is masked while ``committed + num_draft[r] <
    min_tokens``. Reads ``inner``'s state, changes none of it."""

    def __init__(self, inner: MinTokensLogitsProcessor, num_draft: Sequence[int]) -> None:
        self.inner = inner
        self.num_draft = num_draft

    def is_argmax_invariant(self) -> bool:
        return False

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits``: ``[B, V]``, one bonus row per request in batch order."""
        rows: list[int] = []
        tokens: list[int] = []
        restore_rows: list[int] = []
        restore_tokens: list[int] = []
        for row, (min_tokens, outputs, stop_ids, structured) in self.inner.min_toks.items():
            if len(outputs) + self.num_draft[row] >= min_tokens or not stop_ids:
                continue
            stops = sorted(stop_ids)
            rows += [row] * len(stops)
            tokens += stops
            if structured:
                restore_rows += [row] * len(stops)
                restore_tokens += stops
        if not rows:
            return logits
        device = logits.device
        where = (to_device(rows, torch.long, device), to_device(tokens, torch.long, device))
        if restore_rows:
            restore = (to_device(restore_rows, torch.long, device), to_device(restore_tokens, torch.long, device))
            self.inner._mask_stop_token_logits(logits, where, restore)
        else:
            logits.index_put_(where, self.inner.neg_inf_tensor)
        return logits


def bonus_logits_processors(procs: LogitsProcessors, num_draft: Sequence[int]) -> LogitsProcessors:
    """``procs`` for the bonus rows of a step whose row r drafted ``num_draft[r]`` tokens:
    the same processors in the same order, the min-tokens one counting the drafts.
    Unchanged where nothing drafted or no request is short of its ``min_tokens``."""
    if not any(num_draft) or not any(isinstance(p, MinTokensLogitsProcessor) and p.min_toks
                                     for p in procs.non_argmax_invariant):
        return procs
    out = LogitsProcessors()
    out.argmax_invariant = list(procs.argmax_invariant)
    out.non_argmax_invariant = [BonusMinTokens(p, num_draft) if isinstance(p, MinTokensLogitsProcessor) else p
                                for p in procs.non_argmax_invariant]
    return out
