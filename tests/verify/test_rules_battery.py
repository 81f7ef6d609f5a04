"""Losslessness battery: every lossless rule, whole draft blocks, two real vocabularies.

The draft and target vocabularies are different sets of strings over the alphabet
``abcde``: shared strings, draft-only strings (union must reject them), target-only
strings, and a draft special token with no text. Both models are first-order Markov
chains over their own tokens (the target conditioned on the previous *target* token).
Drafting runs through the engine's own code -- ``drafter.rules.mapped_sampling.draft_step`` for
``tli``, ``fsd`` and ``union`` (with the proposer's rule that union stops after an absent
token), and for ``slem`` / ``dtw`` (lossless) the draft text re-tokenized into target
tokens and verified one-hot (both verify exactly that way; dtw only aligns differently).

``slrs`` proposes its first target token from psi on C, computed by the engine's own
``FirstTokenSampler`` (with a work cap and pruning small enough to bite) over the
drafter's tree of segmentations, then the re-tokenized text the drafter writes after it,
verified one-hot.

Each case verifies N independent blocks of K = 3 drafts in one batched call. Losslessness
means: the first emitted token follows the target's first distribution, and at every
later position i (bonus token included), given that the block reached i and the token
before was t, the emitted token follows p(. | t). Pooled chi-square tests check both.
The controls show the same tests fail for a q that is not the one the drafts came from.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from vllm_hetero_spec.drafter.runtime.paged_kv import BlockPool, PagedCache
from vllm_hetero_spec.drafter.sampling import SamplingRows, processed_probs, sample
from vllm_hetero_spec.drafter.runtime.config import RuntimeConfig
from vllm_hetero_spec.drafter.rules.slrs.first_token import FirstTokenSampler
from vllm_hetero_spec.drafter.rules.mapped_sampling import draft_step
from vllm_hetero_spec.verify.divergence import DIVERGENCE_NAMES, divergence
from vllm_hetero_spec.verify.rules import PLACEHOLDER, FuzzyAcceptance, verify_block
from vllm_hetero_spec.vocab.intersection import VocabIntersection

from _stats import ALPHA, assert_follows, conditional_pvalue, follows_pvalue, tv_from

N = 100_000
K = 3
ALPHABET = "abcde"
# Shared: a b c d e ab. Draft only: bc ca abc and a special. Target only: cab bb de.
DRAFT = ["a", "b", "c", "d", "ab", "bc", "ca", "abc", "e", None]
TARGET = ["a", "b", "c", "d", "e", "ab", "cab", "bb", "de"]
# Nothing shared; the target still spells every draft text character by character.
DISJOINT_DRAFT = ["ab", "bc", "ca", "abc", "dd", "ee", None]
DISJOINT_TARGET = ["a", "b", "c", "d", "e", "bb"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The tensors here are small ([N, <= 10]): intra-op threads only add overhead, and
    much of it on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def rows(self, n: int) -> SamplingRows:
        return SamplingRows.build([self.temperature] * n, [self.top_k] * n, [self.top_p] * n, [None] * n, torch.device("cpu"))


@dataclass
class Pair:
    """A synthetic draft/target pair. Row ``-1`` of each logits table is the prompt."""

    draft: list[str | None]
    target: list[str]
    inter: VocabIntersection
    draft_logits: torch.Tensor  # [Vd + 1, Vd]
    target_probs: torch.Tensor  # [Vt + 1, Vt], processed with the request's sampling

    @property
    def start_t(self) -> int:
        return len(self.target)

    @property
    def start_d(self) -> int:
        return len(self.draft)


def _encode(strings: list[str | None]) -> list[bytes | None]:
    return [None if s is None else s.encode() for s in strings]


def _leading_target_token(text: str | None, target: list[str]) -> int:
    """The longest target token ``text`` starts with, -1 if none (or no text)."""
    starts = [t for t in range(len(target)) if text and text.startswith(target[t])]
    return max(starts, key=lambda t: len(target[t]), default=-1)


def make_pair(case: str, sampling: Sampling, seed: int = 0) -> Pair:
    draft, target = (DISJOINT_DRAFT, DISJOINT_TARGET) if case == "disjoint" else (DRAFT, TARGET)
    inter = VocabIntersection.build(_encode(draft), _encode(target))
    g = torch.Generator().manual_seed(seed)
    vd, vt = len(draft), len(target)
    target_logits = torch.randn(vt + 1, vt, generator=g) * 2
    draft_logits = torch.randn(vd + 1, vd, generator=g) * 1.5
    # A useful drafter: each token's logit resembles the target's for the longest target
    # token its text starts with (exactly that token when the string is shared).
    d2t = inter.draft_to_target
    lead = torch.tensor([_leading_target_token(s, target) for s in draft])
    spelled = lead >= 0
    for c in range(vd + 1):
        ctx = int(d2t[c]) if c < vd and d2t[c] >= 0 else vt
        noise = 0.5 * torch.randn(int(spelled.sum()), generator=g)
        draft_logits[c, spelled] = target_logits[ctx, lead[spelled]] - 1.0 * (d2t[spelled] < 0) + noise
    if case == "zeros":
        target_logits[:, TARGET.index("bb")] = float("-inf")
        target_logits[vt, TARGET.index("a")] = float("-inf")
        draft_logits[:, DRAFT.index("ca")] = float("-inf")
        draft_logits[vd, DRAFT.index("b")] = float("-inf")
    target_probs = processed_probs(target_logits, sampling.rows(vt + 1))
    return Pair(draft, target, inter, draft_logits, target_probs)


@dataclass
class Block:
    """What the sampler receives for N rows of one step."""

    ids: torch.Tensor  # [N, K] target ids
    num_draft: torch.Tensor  # [N]
    draft_probs: torch.Tensor | None  # [N, K, Vt]
    force_reject: torch.Tensor | None  # [N, K]


def draft_token_level(pair: Pair, algorithm: str, sampling: Sampling) -> Block:
    """K draft steps through ``draft_step``, as the proposer runs them."""
    rows = sampling.rows(N)
    ctx = torch.full((N,), pair.start_d)
    ids, absent, q = [], [], []
    for _ in range(K):
        step = draft_step(pair.draft_logits[ctx], rows, pair.inter, algorithm)
        ids.append(step.target_ids)
        absent.append(step.absent)
        q.append(step.target_q(pair.inter.target_vocab_size))
        ctx = step.ids
    absent_t = torch.stack(absent, 1)
    # The proposer stops drafting a request after its first absent token.
    after_absent = (absent_t.int().cumsum(1) - absent_t.int()) > 0
    force = absent_t if algorithm == "union" else None
    return Block(torch.stack(ids, 1), K - after_absent.sum(1), torch.stack(q, 1), force)


def _retokenize(chars: torch.Tensor, lengths: torch.Tensor, target: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy longest-match tokenization of each row's text into at most K target ids,
    vectorized over rows (merges freely across draft-token boundaries)."""
    base = len(ALPHABET)
    max_len = max(len(s) for s in target)
    tables = [torch.full((base**n,), -1) for n in range(max_len + 1)]
    for tid, s in enumerate(target):
        tables[len(s)][sum(ALPHABET.index(ch) * base**j for j, ch in enumerate(s))] = tid
    n = chars.shape[0]
    padded = torch.cat([chars, torch.zeros(n, max_len, dtype=chars.dtype)], 1).clamp(min=0)
    cursor = torch.zeros(n, dtype=torch.long)
    out = torch.full((n, K), PLACEHOLDER)
    for pos in range(K):
        best, best_len = torch.full((n,), -1), torch.zeros(n, dtype=torch.long)
        for m in range(1, max_len + 1):
            window = padded.gather(1, cursor.unsqueeze(1) + torch.arange(m).unsqueeze(0))
            code = (window * base ** torch.arange(m)).sum(1)
            tid = tables[m][code]
            ok = (tid >= 0) & (cursor + m <= lengths)
            best, best_len = torch.where(ok, tid, best), torch.where(ok, m, best_len)
        more = cursor < lengths
        out[:, pos] = torch.where(more, best, PLACEHOLDER)
        cursor = cursor + torch.where(more, best_len, 0)
    return out, (out != PLACEHOLDER).sum(1)


def draft_retokenized(pair: Pair, sampling: Sampling, ctx: torch.Tensor | None = None) -> Block:
    """slem / dtw (lossless): K draft tokens (after the prompt, or after the draft token
    ``ctx`` per row), their text up to the first special, re-tokenized with the target
    vocabulary, verified one-hot."""
    rows = sampling.rows(N)
    ctx = torch.full((N,), pair.start_d) if ctx is None else ctx
    draws = []
    for _ in range(K):
        ctx = sample(processed_probs(pair.draft_logits[ctx], rows), rows)
        draws.append(ctx)
    draws_t = torch.stack(draws, 1)
    width = max(len(s) for s in pair.draft if s is not None)
    tok_chars = torch.full((len(pair.draft), width), -1)
    for tid, s in enumerate(pair.draft):
        for j, ch in enumerate(s or ""):
            tok_chars[tid, j] = ALPHABET.index(ch)
    special = torch.tensor([s is None for s in pair.draft])[draws_t]
    keep = (special.int().cumsum(1) == 0).unsqueeze(2)
    chars = torch.where(keep, tok_chars[draws_t], -1).flatten(1)
    valid = chars >= 0
    order = torch.sort((~valid).int(), dim=1, stable=True).indices
    ids, num = _retokenize(chars.gather(1, order), valid.sum(1), pair.target)
    return Block(ids, num, None, None)


class MarkovDrafter:
    """Stands in for the draft model's tree forward: this drafter's next-token logits
    depend only on the last draft token."""

    def __init__(self, logits: torch.Tensor):
        self.logits = logits
        self.cfg = RuntimeConfig("markov")

    def grow_trees(self, caches, trees, parents, tokens) -> list[torch.Tensor]:
        return [self.logits[torch.tensor(t)] for t in tokens]


def draft_slrs(pair: Pair, sampling: Sampling) -> Block:
    """slrs: the first target token drawn from the psi table the engine computes (one
    context, so one table for all N rows), then the drafter's re-tokenized text after it."""
    proposer = FirstTokenSampler(
        _encode(pair.draft), _encode(pair.target), None, None, len(pair.target), max_nodes=6, num_candidates=4,
        min_prob=0.01,
    )
    first = proposer.propose(
        MarkovDrafter(pair.draft_logits), [PagedCache(BlockPool(64, 32, 0))],
        pair.draft_logits[pair.start_d].unsqueeze(0), sampling.rows(1),
    )
    q0 = first.q_rows[0].dense(torch.tensor([0]), len(pair.target))[0]
    assert q0 is not None and 0 < int((q0 > 0).sum()) < len(pair.target), "psi covers a strict subset here"
    t1 = torch.multinomial(q0, N, replacement=True)
    spelled = [proposer.draft.segment(s.encode()) for s in pair.target]
    last = torch.tensor([ids[-1] if ids else pair.start_d for ids in spelled])[t1]
    rest = draft_retokenized(pair, sampling, ctx=last)
    ids = torch.cat([t1.unsqueeze(1), rest.ids[:, : K - 1]], 1)
    num = 1 + rest.num_draft.clamp(max=K - 1)
    probs = torch.zeros(N, K, len(pair.target))
    probs[:, 0] = q0
    valid = torch.arange(K).unsqueeze(0) < num.unsqueeze(1)
    probs.scatter_(2, ids.clamp(min=0).unsqueeze(2), valid.unsqueeze(2).float())
    probs[:, 0] = q0
    return Block(ids, num, probs, None)


def draft_block(pair: Pair, algorithm: str, sampling: Sampling) -> Block:
    if algorithm == "slem":
        return draft_retokenized(pair, sampling)
    if algorithm == "slrs":
        return draft_slrs(pair, sampling)
    return draft_token_level(pair, algorithm, sampling)


def verify(pair: Pair, block: Block, fuzzy: FuzzyAcceptance | None = None) -> torch.Tensor:
    """Target distributions for the drafted contexts, bonus sample, one verify_block call."""
    prev = torch.cat([torch.full((N, 1), pair.start_t), block.ids[:, :-1].clamp(min=0)], 1)
    target_probs = pair.target_probs[prev]
    last = block.ids.gather(1, (block.num_draft - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    bonus_ctx = torch.where(block.num_draft > 0, last, pair.start_t)
    bonus = torch.multinomial(pair.target_probs[bonus_ctx], 1).squeeze(1)
    return verify_block(
        block.ids.clamp(min=0),
        block.num_draft,
        target_probs,
        block.draft_probs,
        bonus,
        torch.zeros(N, dtype=torch.bool),
        torch.rand(N, K, dtype=torch.float64),
        torch.empty(N, len(pair.target)).exponential_(),
        block.force_reject,
        fuzzy,
    )


def position_pvalues(pair: Pair, out: torch.Tensor, min_count: int = 100) -> dict[int, float]:
    """p-values per emitted position: the first against the prompt's distribution, the
    later ones conditioned on the token before them, over the blocks that reach them.
    A position no context reaches ``min_count`` times is left out."""
    pvalues = {0: follows_pvalue(out[:, 0], pair.target_probs[pair.start_t])}
    for i in range(1, K + 1):
        reached = out[:, i] != PLACEHOLDER
        context, tokens = out[reached, i - 1], out[reached, i]
        if int(torch.bincount(context, minlength=1).max()) >= min_count:
            pvalues[i] = conditional_pvalue(context, tokens, pair.target_probs, min_count)
    return pvalues


CASES = {
    "plain": Sampling(),
    "temperature": Sampling(temperature=0.6),
    "truncation": Sampling(temperature=0.8, top_k=4, top_p=0.85),
    "zeros": Sampling(temperature=1.3),
    "disjoint": Sampling(),
}
LOSSLESS = ["slem", "tli", "union", "fsd", "slrs"]


# tli and fsd draft only shared tokens: a disjoint pair has none, and start-up refuses
# such pairs (min_shared_tokens), so that combination is not a case.
BLOCK_CASES = [(c, a) for c in CASES for a in LOSSLESS if not (c == "disjoint" and a in ("tli", "fsd"))]


@pytest.mark.parametrize("case,algorithm", BLOCK_CASES, ids=[f"{c}-{a}" for c, a in BLOCK_CASES])
def test_block_follows_target(case: str, algorithm: str) -> None:
    torch.manual_seed(100 * list(CASES).index(case) + LOSSLESS.index(algorithm))
    pair = make_pair(case, CASES[case], seed=list(CASES).index(case))
    block = draft_block(pair, algorithm, CASES[case])
    # fsd at tau = 0 must be exactly lossless.
    fuzzy = FuzzyAcceptance(torch.zeros(N), "js") if algorithm == "fsd" else None
    out = verify(pair, block, fuzzy)
    if case == "disjoint" and algorithm == "union":
        assert bool(block.force_reject[:, 0].all()) and bool((block.num_draft == 1).all())
        assert int((out[:, 1] != PLACEHOLDER).sum()) == 0, "an absent draft was accepted"
        assert_follows(out[:, 0], pair.target_probs[pair.start_t])
        return
    pvalues = position_pvalues(pair, out)
    # slem (and slrs after its first token) accepts rarely at T > 0, so few blocks reach
    # the position after K accepted drafts; their bonus tokens are still tested at
    # earlier positions (short proposals).
    tested = K if algorithm in ("slem", "slrs") else K + 1
    assert sorted(pvalues)[:tested] == list(range(tested)), f"positions with too little data: {pvalues}"
    assert min(pvalues.values()) > ALPHA, f"emitted tokens differ from the target at some position: {pvalues}"


def test_union_rejects_every_absent_draft() -> None:
    """Absent drafts exist in this pair, are force-rejected, and stop the block."""
    sampling = CASES["plain"]
    pair = make_pair("plain", sampling)
    torch.manual_seed(7)
    block = draft_token_level(pair, "union", sampling)
    assert 0.05 < float(block.force_reject.float().mean()) < 0.6
    out = verify(pair, block)
    first_absent = block.force_reject.int().argmax(1)
    has_absent = block.force_reject.any(1)
    emitted = (out != PLACEHOLDER).sum(1)
    assert bool((emitted[has_absent] <= first_absent[has_absent] + 1).all())


@pytest.mark.parametrize("control", ["union_renormalized_q", "temperature_mismatch"])
def test_wrong_q_is_detected(control: str) -> None:
    """A q that is not the law the drafts came from fails the same test."""
    torch.manual_seed(11)
    if control == "union_renormalized_q":
        sampling = CASES["plain"]
        pair = make_pair("plain", sampling)
        block = draft_token_level(pair, "union", sampling)
        q = block.draft_probs
        block.draft_probs = q / q.sum(-1, keepdim=True)  # the tli q, but drafted the union way
    else:
        pair = make_pair("temperature", CASES["temperature"])
        block = draft_token_level(pair, "tli", CASES["temperature"])
        block.draft_probs = draft_token_level(pair, "tli", CASES["plain"]).draft_probs  # q claimed at T = 1
    out = verify(pair, block)
    assert min(position_pvalues(pair, out).values()) < 1e-6


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_tli_accepts_at_least_as_often_as_union(temperature: float) -> None:
    """Theorem 4.1 of the heterogeneous-vocabulary paper: per position, TLI's acceptance
    probability sum_t min(p, q_tli) is at least union's sum_t min(p, q_in), since q_tli
    is q_in renormalized. Exactly over many random pairs, and as measured."""
    sampling = Sampling(temperature=temperature)
    pair = make_pair("plain", sampling)
    g = torch.Generator().manual_seed(3)
    m = 4000
    logits = torch.randn(m, len(DRAFT), generator=g) * 2
    p = torch.softmax(torch.randn(m, len(TARGET), generator=g) * 2, -1)
    rows = sampling.rows(m)
    alpha = {a: torch.minimum(p, draft_step(logits, rows, pair.inter, a).target_q(pair.inter.target_vocab_size)).sum(-1) for a in ("tli", "union")}
    assert bool((alpha["tli"] >= alpha["union"] - 1e-6).all())
    assert float((alpha["tli"] - alpha["union"]).mean()) > 0.01

    torch.manual_seed(5)
    p0 = pair.target_probs[pair.start_t]
    measured = {}
    for a in ("tli", "union"):
        block = draft_token_level(pair, a, sampling)
        out = verify(pair, block)
        measured[a] = float((out[:, 1] != PLACEHOLDER).float().mean())  # position 0 accepted
        expected = float(torch.minimum(p0, block.draft_probs[0, 0]).sum())
        assert abs(measured[a] - expected) < 0.01, (a, measured[a], expected)
    assert measured["tli"] >= measured["union"]


@pytest.mark.parametrize("name", DIVERGENCE_NAMES)
def test_fsd_bias_grows_with_threshold(name: str) -> None:
    """fsd: TV from the target is ~0 at tau = 0 (chi-square passes) and grows with tau,
    as predicted: rows with D(p, q) <= tau emit their draft, the others follow p."""
    g = torch.Generator().manual_seed(13)
    v = 10
    p = torch.softmax(torch.randn(v, generator=g), 0)
    r = torch.softmax(torch.randn(v, generator=g) * 2, 0)
    a = torch.linspace(0, 1, N).unsqueeze(1)
    q = (1 - a) * p + a * r
    d = divergence(name, p.expand(N, v), q, 3)
    taus = [0.0, *torch.quantile(d[torch.isfinite(d)], torch.tensor([0.3, 0.6, 0.9])).tolist()]
    torch.manual_seed(17)
    draft = torch.multinomial(q, 1)
    tvs = []
    for tau in taus:
        out = verify_block(
            draft, torch.ones(N, dtype=torch.long), p.expand(N, 1, v), q.unsqueeze(1),
            torch.multinomial(p, N, replacement=True), torch.zeros(N, dtype=torch.bool),
            torch.rand(N, 1, dtype=torch.float64), torch.empty(N, v).exponential_(),
            fuzzy=FuzzyAcceptance(torch.full((N,), tau), name, 3),
        )
        tvs.append(tv_from(out[:, 0], p))
        if tau == 0:
            assert_follows(out[:, 0], p)
        else:
            expected = float((a.squeeze(1) * (d <= tau)).mean()) * 0.5 * float((r - p).abs().sum())
            assert abs(tvs[-1] - expected) < 0.01, (tau, tvs[-1], expected)
    assert all(x < y for x, y in zip(tvs, tvs[1:])), tvs


def test_zero_uniform_never_accepts_a_token_the_target_rules_out() -> None:
    """A uniform draw of exactly 0 (float64: rare, not impossible) must not accept a
    draft whose target probability is 0: the test is u * q < p, strictly."""
    v = 4
    p = torch.tensor([[[0.0, 0.5, 0.5, 0.0]]])  # [B=1, K=1, V]
    q = torch.tensor([[[1.0, 0.0, 0.0, 0.0]]])
    out = verify_block(
        torch.tensor([[0]]), torch.tensor([1]), p, q, torch.tensor([1]), torch.tensor([False]),
        torch.zeros(1, 1, dtype=torch.float64), torch.ones(1, v),
    )
    assert int(out[0, 0]) != 0
