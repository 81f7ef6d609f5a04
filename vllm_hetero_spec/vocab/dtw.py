"""TokenTiming's probability transfer from draft tokens to proxy target tokens.

The draft text is re-tokenized by the target tokenizer into proxy tokens; a DTW path
(draft index, proxy index) says which draft tokens produced which proxy token. The paper
carries the matched draft token's probability over as the proxy token's proposal
probability. That is an approximation -- the true probability of proposing a proxy token
sums over every draft tokenization of its text -- so verifying with it is only
approximately lossless; ``dtw_verify: lossless`` verifies against a one-hot proposal
instead (exact); benchmarks/results/dtw_bias.md records the faithful mode's bias.
"""

from __future__ import annotations

import numpy as np


def transfer_probs(path: np.ndarray, draft_q: list[float], n_proxy: int) -> list[float]:
    """Proposal probability of each of ``n_proxy`` proxy tokens.

    Proxy j takes the probability of the first draft token the path aligns with it
    (deterministic; several draft tokens merged into one proxy token contribute their
    first). Proxy tokens past the path (an appended end-of-sequence for a drafted
    special token) take the last draft token's probability.
    """
    out: list[float | None] = [None] * n_proxy
    for i, j in path.tolist():
        if j < n_proxy and out[j] is None:
            out[j] = draft_q[i]
    fallback = draft_q[-1] if draft_q else 1.0
    return [fallback if q is None else q for q in out]
