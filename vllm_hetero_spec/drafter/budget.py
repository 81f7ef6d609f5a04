"""How many tokens to draft this step, per request, 0 included: a cost model fitted online.

Speculation pays only when the tokens it adds per step outweigh what it costs per step,
and both sides move with the batch size, the prompt mix and the machine: verifying
8 x 5 positions is compute-bound on a CPU where verifying 1 x 5 is nearly free, and a
request whose drafts keep being rejected only adds verification work. So each step
:class:`AdaptiveBudget` picks the k (0..``num_speculative_tokens``) that maximises
expected tokens per second,

    rate(k) = sum_r E_r(k) / cost(k),     E_r(k) = 1 + sum_{j<=k} P_r(j),

from three models it keeps current from what each step shows:

- **acceptance**: per draft position j, the probability a_j that the j-th proposal is
  accepted given the ones before it were, over all requests and per request (a
  request's own counts shrunk towards the overall ones), so P_r(j) = a_r1 ... a_rj;
- **verification**: the target's step time as a function of the tokens it verifies
  (rows + proposals) for speculative steps -- measured per size, a line through them
  for sizes not seen yet -- and the plain step time, per batch-size bucket (1, 2, 3-4,
  5-8, ...);
- **drafting**: the proposer's time as a linear function of k, per bucket.

Then, per request, a proposal at position j (past the first) is kept only where it
pays at the margin: its expected gain P_r(j) must exceed the tokens the step's rate
would buy in the time one more verified token costs (the verification slope times the
rate), so a request that is rarely accepted drafts one token while the others draft on.

Only *steady* steps (nobody joined since the step before, nobody is prefilling)
feed the cost models, so a prefill never passes for the cost of verification. Costs
are exponentially weighted, acceptance counts decay, so the models follow change; and
the policy keeps exploring: a new bucket first tries k = 1, 0 and 2 (the cost line
needs two verification sizes and the plain cost), then every ``explore_every`` steps
it tries a neighbour of the chosen k (alternately above and below, 0 included), which
refreshes the cost line and the acceptance of the next position. A bucket not yet
ready borrows the nearest ready bucket's costs instead of warming up from scratch. A
probe the model expects to cost more than a fifth of the step's rate is made only every
third turn.
``fixed`` always drafts ``num_speculative_tokens``. The choice never touches
verification, so every rule stays exactly as lossless as it is at any fixed k.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

# k for a new bucket's first steps: small, because a long draft verified at a large batch
# can cost several plain steps, and a short run (32 tokens at batch 8 is ~30 steps) cannot
# pay that back; longer drafts are reached by the probes, one step up at a time.
_WARMUP = (1, 0, 2)


class LinearFit:
    """y = a + b x by exponentially weighted least squares, with a weak ridge towards
    ``prior`` so that one distinct x still gives an answer (the prior's slope)."""

    def __init__(self, memory: float, prior: tuple[float, float] = (0.0, 0.0), ridge: float = 1e-6):
        self.memory = memory
        self.prior = np.asarray(prior, dtype=np.float64)
        self.ridge = ridge
        self.xtx = np.zeros((2, 2))
        self.xty = np.zeros(2)
        self.n = 0.0

    def add(self, x: float, y: float) -> None:
        v = np.array([1.0, x])
        self.xtx = self.memory * self.xtx + np.outer(v, v)
        self.xty = self.memory * self.xty + v * y
        self.n = self.memory * self.n + 1.0

    @property
    def coef(self) -> np.ndarray:
        """(a, b)."""
        scale = max(self.xtx[1, 1], 1.0)
        reg = self.ridge * np.diag([1.0, scale])
        return np.linalg.solve(self.xtx + reg, self.xty + reg @ self.prior)

    def predict(self, x: float) -> float:
        a, b = self.coef
        return float(a + b * x)


class Ema:
    """An exponentially weighted mean (``None`` until the first sample). A sample above
    twice the mean counts as twice the mean: one stall (a collection, a neighbour's
    burst) must not make a choice look bad for the next dozen steps."""

    def __init__(self, memory: float):
        self.memory = memory
        self.value: float | None = None

    def add(self, y: float) -> None:
        if self.value is None:
            self.value = y
        else:
            self.value = self.memory * self.value + (1 - self.memory) * min(y, 2 * self.value)


class VerifyCost:
    """The target's speculative step time as a function of the tokens it verifies.

    Measured per size where it has been seen, because the curve is not linear at small
    sizes: on a CPU, verifying 2 tokens took longer than verifying 3 (1.5B target, batch
    1: 289 ms against 240 ms; the matmul kernels change paths with the row count). Sizes
    never seen come from a weighted line through all the samples."""

    def __init__(self, memory: float):
        self.memory = memory
        self.by_size: dict[int, Ema] = {}
        self.line = LinearFit(memory)

    def add(self, tokens: int, seconds: float) -> None:
        ema = self.by_size.setdefault(tokens, Ema(self.memory))
        ema.add(seconds)
        self.line.add(tokens, ema.value)

    def predict(self, tokens: int, plain: tuple[int, float] | None = None) -> float:
        """Measured where seen; elsewhere the line. Beyond the largest size seen: that
        size's cost plus the steeper of the line's slope and the secant from the plain
        step (``plain``: its tokens and seconds), never decreasing. Two noisy sizes can
        give a flat line, which once sent a batch of 32 to verify k = 8."""
        if tokens in self.by_size:
            return float(self.by_size[tokens].value)
        largest = max(self.by_size)
        if tokens > largest:
            top = float(self.by_size[largest].value)
            slope = self.slope
            if plain is not None and largest > plain[0]:
                slope = max(slope, (top - plain[1]) / (largest - plain[0]))
            return top + slope * (tokens - largest)
        return max(self.line.predict(tokens), 0.0)

    @property
    def slope(self) -> float:
        """Seconds per extra verified token (>= 0), from the line."""
        return max(float(self.line.coef[1]), 0.0)


@dataclass
class _Bucket:
    """The cost models of one batch-size bucket."""

    plain: Ema
    verify: VerifyCost
    draft: LinearFit
    steps: int = 0
    probes: int = 0
    explore_turns: int = 0
    rows: int = 0  # the batch size last planned here


@dataclass
class _Step:
    """The last step as planned, for what the next call learns from it."""

    req_ids: list[str]
    proposed: dict[str, int]
    bucket: int
    tokens: int
    k: int
    propose_s: float
    end: float


def bucket_of(batch: int) -> int:
    """1, 2, 3-4, 5-8, ... -> 0, 1, 2, 3, ..."""
    return max(0, int(batch - 1).bit_length())


class AdaptiveBudget:
    """Chooses each step's draft length per request (see the module docstring).

    Per step the proposer calls :meth:`observe` first (what the last step showed),
    then :meth:`plan` (the k per request), then :meth:`record` (what was proposed)."""

    def __init__(
        self,
        max_tokens: int,
        min_tokens: int = 0,
        *,
        explore_every: int = 10,
        cost_memory: float = 0.9,
        accept_memory: float = 0.97,
        request_weight: float = 4.0,
        prior_accept: float = 0.5,
    ):
        if not 0 <= min_tokens <= max_tokens or max_tokens < 1:
            raise ValueError(f"need 0 <= min_tokens <= max_tokens and max_tokens >= 1, got {min_tokens}, {max_tokens}")
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.explore_every = explore_every
        self.cost_memory = cost_memory
        self.accept_memory = accept_memory
        self.request_weight = request_weight
        self.prior_accept = prior_accept
        self.accepted = np.zeros(max_tokens)
        self.tried = np.zeros(max_tokens)
        # per request: (accepted, tried, the step its counts were last decayed to)
        self.per_request: dict[str, tuple[np.ndarray, np.ndarray, int]] = {}
        self.step_index = 0
        self.buckets: dict[int, _Bucket] = {}
        self.chosen = Counter()  # steps per chosen k (the step's largest)
        self.last_k = max_tokens
        self._last: _Step | None = None

    # -- learning ---------------------------------------------------------------------

    def _bucket(self, b: int) -> _Bucket:
        if b not in self.buckets:
            m = self.cost_memory
            self.buckets[b] = _Bucket(Ema(m), VerifyCost(m), LinearFit(m))
        return self.buckets[b]

    def observe(self, now: float, req_ids: list[str], sampled: list[int]) -> None:
        """Learn from the step that just ran: ``sampled[i]`` tokens came out for row
        ``req_ids[i]`` (accepted drafts + 1; 0 while it is still prefilling)."""
        last, self._last = self._last, None
        if last is None:
            return
        n_sampled = dict(zip(req_ids, sampled))
        self.step_index += 1
        self.accepted *= self.accept_memory
        self.tried *= self.accept_memory
        for req_id, k in last.proposed.items():
            if k <= 0 or n_sampled.get(req_id, 0) <= 0:
                continue
            accepted = min(n_sampled[req_id] - 1, k)
            reached = min(accepted + 1, k)  # positions whose verdict we saw
            won = np.zeros(self.max_tokens)
            won[:accepted] = 1.0
            seen = np.zeros(self.max_tokens)
            seen[:reached] = 1.0
            self.accepted += won
            self.tried += seen
            acc, tri = self._request_counts(req_id)
            self.per_request[req_id] = (acc + won, tri + seen, self.step_index)
        # A step is steady when nobody joined it (a newcomer's prefill would pass for
        # verification cost) and nobody is prefilling; a request may have finished in it.
        steady = set(req_ids) <= set(last.req_ids) and all(s > 0 for s in sampled)
        target_s = now - last.end
        if steady and target_s > 0:
            bucket = self._bucket(last.bucket)
            if last.k == 0:
                bucket.plain.add(target_s)
            else:
                bucket.verify.add(last.tokens, target_s)
                bucket.draft.add(last.k, last.propose_s)

    def record(self, req_ids: list[str], proposed: list[int], propose_s: float, end: float) -> None:
        """What this step proposed per row (every row of the batch, 0 for none), how
        long proposing took, and when it ended."""
        k = max(proposed, default=0)
        self._last = _Step(
            list(req_ids), dict(zip(req_ids, proposed)), bucket_of(len(req_ids)), len(req_ids) + sum(proposed), k,
            propose_s, end,
        )
        self.chosen[k] += 1
        self.last_k = k

    def forget(self, req_id: str) -> None:
        """A finished, aborted or preempted request."""
        self.per_request.pop(req_id, None)

    def _request_counts(self, req_id: str) -> tuple[np.ndarray, np.ndarray]:
        """A request's counts, decayed to now: they age by steps, like the overall ones,
        also while the request drafts nothing (else old verdicts would never fade)."""
        if req_id not in self.per_request:
            return np.zeros(self.max_tokens), np.zeros(self.max_tokens)
        acc, tri, at = self.per_request[req_id]
        age = self.accept_memory ** (self.step_index - at)
        return acc * age, tri * age

    # -- deciding ---------------------------------------------------------------------

    def acceptance(self, req_id: str | None = None) -> np.ndarray:
        """a_j per position (conditional on the earlier ones accepted), overall or for
        one request (its counts shrunk towards the overall estimate). A position with
        few verdicts leans on the one before it (conditional acceptance rarely drops
        with depth: measured 0.59, 0.63, 0.65, 0.71), so a position the policy has not
        tried lately is not written off at the prior."""
        overall = np.empty(self.max_tokens)
        prior = self.prior_accept
        for j in range(self.max_tokens):
            overall[j] = prior = (self.accepted[j] + prior) / (self.tried[j] + 1.0)
        if req_id is None or req_id not in self.per_request:
            return overall
        acc, tri = self._request_counts(req_id)
        return (acc + self.request_weight * overall) / (tri + self.request_weight)

    def _cost(self, bucket: _Bucket, rows: int, k: int, proposals: int) -> float:
        if k == 0:
            return float(bucket.plain.value)
        verify = bucket.verify.predict(rows + proposals, (rows, float(bucket.plain.value)))
        return max(verify, 1e-6) + max(bucket.draft.predict(k), 0.0)

    def _ready(self, bucket: _Bucket) -> bool:
        return bucket.plain.value is not None and len(bucket.verify.by_size) >= min(2, self.max_tokens) \
            and bucket.draft.n > 0

    def _model_for(self, b: int) -> _Bucket | None:
        """The bucket whose costs decide for bucket ``b``: its own once it is ready,
        else the nearest ready one (a server's batch size wanders across buckets, and a
        batch that shrinks as its requests finish passes through several; each would
        otherwise start from the warm-up again), else none."""
        if self._ready(self._bucket(b)):
            return self.buckets[b]
        ready = [other for other in self.buckets if self._ready(self.buckets[other])]
        return self.buckets[min(ready, key=lambda other: abs(other - b))] if ready else None

    def plan(self, req_ids: list[str], drafting: list[bool]) -> list[int]:
        """The draft length per row of the batch (0 for rows not ``drafting``)."""
        b = bucket_of(len(req_ids))
        bucket = self._bucket(b)
        step = bucket.steps
        bucket.steps += 1
        model = self._model_for(b)
        if model is None:
            k = min(_WARMUP[step % len(_WARMUP)], self.max_tokens)
            return self._clamp([k] * len(req_ids), drafting)
        gains = np.stack([np.cumprod(self.acceptance(r)) for r in req_ids]) * np.asarray(drafting)[:, None]
        rows = len(req_ids)
        bucket.rows = rows
        if model is bucket:
            n_rows, n_drafting, gain = rows, int(sum(drafting)), gains.sum(0)
        else:
            # Borrowed costs are only valid at the batch size they were measured at: decide
            # as that batch would, with this batch's mean acceptance.
            n_rows = n_drafting = model.rows
            gain = gains.mean(0) * model.rows
        rates = [
            (n_rows + gain[:k].sum()) / self._cost(model, n_rows, k, k * n_drafting)
            for k in range(self.max_tokens + 1)
        ]
        best = int(np.argmax(rates[self.min_tokens :])) + self.min_tokens
        k = best
        if model is not bucket and bucket.plain.value is None and step % 2 == 1:
            # Borrowed costs: measure this bucket's plain step early, so it gets its own.
            return [0] * rows
        if self.explore_every and step % self.explore_every == self.explore_every // 2:
            up = (bucket.probes + 1) % 2 == 1
            probe = best + 1 if (up and best < self.max_tokens) or best == self.min_tokens else best - 1
            probe = max(self.min_tokens, min(self.max_tokens, probe))
            # A probe the model expects to cost much (drafting at a large batch that is
            # compute-bound) is made one time in three: it still notices change, later.
            bucket.explore_turns += 1
            if rates[probe] >= 0.8 * rates[best] or bucket.explore_turns % 3 == 0:
                bucket.probes += 1
                return self._clamp([probe] * rows, drafting)
        if k == 0:
            return [0] * rows
        # Trimmed per request, but never to nothing while the step drafts: a request at
        # 0 shows no new verdicts, so one run of rejections (common at T > 0) would
        # silence it for dozens of steps; one proposal is cheap beside the others' k.
        bar = model.verify.slope * rates[k]
        return self._clamp([max(1, int((g[:k] > bar).sum())) for g in gains], drafting)

    def _clamp(self, ks: list[int], drafting: list[bool]) -> list[int]:
        """Each drafting row's k within [min_tokens, max_tokens]; 0 for the others."""
        return [max(self.min_tokens, min(self.max_tokens, k)) if d else 0 for k, d in zip(ks, drafting)]


class FixedBudget:
    """``draft_budget: fixed``: always ``num_speculative_tokens`` for every row."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.chosen = Counter()
        self.last_k = max_tokens

    def observe(self, now: float, req_ids: list[str], sampled: list[int]) -> None:
        """Nothing to learn."""

    def plan(self, req_ids: list[str], drafting: list[bool]) -> list[int]:
        return [self.max_tokens if d else 0 for d in drafting]

    def record(self, req_ids: list[str], proposed: list[int], propose_s: float, end: float) -> None:
        k = max(proposed, default=0)
        self.chosen[k] += 1
        self.last_k = k

    def forget(self, req_id: str) -> None:
        """No per-request state."""


def make_budget(mode: str, max_tokens: int, min_tokens: int = 0) -> AdaptiveBudget | FixedBudget:
    """The budget policy ``draft_budget`` names."""
    return AdaptiveBudget(max_tokens, min_tokens) if mode == "adaptive" else FixedBudget(max_tokens)
