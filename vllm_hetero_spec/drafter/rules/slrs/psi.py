"""psi, the drafter's law over the target's first token, for string-level rejection
sampling (``slrs``, Theorem 3.2 of the heterogeneous-vocabularies paper).

The drafter writes a string token by token. Its *first target token* is the longest
target token the string starts with (maximal munch): a function of the string alone,
decided as soon as the string is no longer a proper prefix of any target token, which
is what makes psi computable. (A BPE tokenizer's first token is not a function of a
prefix of the string, so it cannot define a law we can sum; maximal munch agrees with it
on most text.) For a target token y, with ``P_pre(w)`` the probability that the string
starts with the bytes w, and ``ext(y)`` the shortest target tokens strictly extending y
(no target token lies between; their events are disjoint and cover every longer match):

    psi(y) = P_pre(y) - sum_{u in ext(y)} P_pre(u)

``P_pre(w)`` sums over the *segmentations*: every draft-token path from the context
whose bytes are exactly a proper prefix w[:i] of w (a "node", probability = product of
the drafter's q along it), times the drafter's mass at that node on the tokens whose
bytes start with w[i:] (one range of the byte-sorted draft vocabulary, so a difference
of two cumulative sums). Which nodes and terms a token needs depends only on the two
vocabularies (:class:`TokenPlan`, cached per token); the drafter evaluates them level by
level (:class:`TreeBuilder`), one batched tree-masked forward per level for all requests.

Exact psi needs about 2^(len - 1) nodes for a token of len bytes that every substring
spells, so a node is only evaluated when its path probability is at least ``min_prob``
(known once its parent is evaluated); what the skipped paths would add to psi(y) is
below ``min_prob`` per path. ``min_prob = 0`` computes psi exactly. A work cap
(``budget`` nodes per request per step) leaves out whole candidates whose next level
does not fit.

Losslessness does not rest on psi being exact: the first target token is *sampled from
the computed table* (the candidates C that fit the budget, renormalized) and verified
against that same table, so verification sees exactly the law the proposal came from,
whatever was pruned or capped. Exactness makes that table the drafter's true
string-level law on C (tested against brute force).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch

from vllm_hetero_spec.host_to_device import to_device
from vllm_hetero_spec.vocab.sorted_strings import SortedStrings


class TokenPlan:
    """What psi(y) needs for one target token y, relative to any context: its words
    (y with sign +1, its minimal extensions with sign -1) and their proper prefixes."""

    def __init__(self, token: bytes, draft: SortedStrings, target: SortedStrings):
        words = [token, *target.minimal_extensions(token)]
        self._sign = {w: (1.0 if w == token else -1.0) for w in words}
        self._words = SortedStrings(words)
        self._prefixes = SortedStrings([w[:j] for w in words for j in range(1, len(w))])
        self._draft = draft
        self._terms: dict[bytes, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._children: dict[bytes, list[tuple[int, bytes]]] = {}

    def children(self, text: bytes) -> list[tuple[int, bytes]]:
        """``(draft id, new text)`` of the nodes below a node spelling ``text``."""
        out = self._children.get(text)
        if out is None:
            out = []
            for longer in self._prefixes.extending(text):
                out.extend((v, longer) for v in self._draft.ids.get(longer[len(text) :], ()))
            self._children[text] = out
        return out

    def terms(self, text: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``lo``, ``hi``, ``sign`` of this token's terms at a node spelling ``text``:
        for each word strictly extending ``text``, the draft tokens that complete it."""
        cached = self._terms.get(text)
        if cached is None:
            lo, hi, sign = [], [], []
            for word in self._words.extending(text):
                a, b = self._draft.prefix_range(word[len(text) :])
                if b > a:
                    lo.append(a)
                    hi.append(b)
                    sign.append(self._sign[word])
            cached = (np.array(lo, dtype=np.int64), np.array(hi, dtype=np.int64), np.array(sign))
            self._terms[text] = cached
        return cached


class PsiPlanner:
    """Caches :class:`TokenPlan`\\ s for one draft/target vocabulary pair."""

    def __init__(self, draft: SortedStrings, target: SortedStrings, cache_size: int = 1 << 14):
        self.draft = draft
        self.target = target
        self.plan = lru_cache(maxsize=cache_size)(self._plan)

    def _plan(self, token: bytes) -> TokenPlan:
        return TokenPlan(token, self.draft, self.target)


@dataclass
class TreeBuilder:
    """One request's evaluated nodes and candidates during a step.

    The caller alternates :meth:`frontier` (the next level's nodes: ``(parent node,
    draft token)``, node 0 being the context) with :meth:`add` (the drafter's q rows at
    them) until the frontier is empty, then reads :meth:`psi`. Every decision depends
    only on the candidates, the vocabularies and the drafter's q at evaluated nodes,
    never on anything sampled, so C and psi are fixed before the proposal is drawn.
    """

    planner: PsiPlanner
    candidates: list[tuple[int, bytes]]
    budget: int
    min_prob: float
    q_root: torch.Tensor
    capped: int = 0
    paths: list[tuple[int, ...]] = field(default_factory=lambda: [()])
    texts: list[bytes] = field(default_factory=lambda: [b""])
    prob: list[float] = field(default_factory=lambda: [1.0])
    q_rows: list[torch.Tensor] = field(default_factory=list)
    _level: list[int] = field(default_factory=lambda: [0])
    _index: dict[tuple[int, ...], int] = field(default_factory=lambda: {(): 0})

    def __post_init__(self) -> None:
        self.q_rows = [self.q_root]
        self._active = [(tid, self.planner.plan(text)) for tid, text in self.candidates]
        self._pending: list[tuple[int, int, bytes, float]] = []

    @property
    def num_nodes(self) -> int:
        """Drafter evaluations beyond the context."""
        return len(self.paths) - 1

    def frontier(self) -> list[tuple[int, int]]:
        """Children of the last level's nodes that the candidates need, whose path
        probability reaches ``min_prob``; a candidate whose share does not fit in the
        budget is dropped (counted in :attr:`capped`)."""
        chosen: dict[tuple[int, ...], tuple[int, int, bytes, float]] = {}
        kept = []
        for tid, plan in self._active:
            mine = {}
            for node in self._level:
                q = self.q_rows[node]
                for v, text in plan.children(self.texts[node]):
                    path = self.paths[node] + (v,)
                    p = self.prob[node] * float(q[v])
                    if p > 0 and p >= self.min_prob and path not in self._index and path not in chosen:
                        mine[path] = (node, v, text, p)
            if self.num_nodes + len(chosen) + len(mine) > self.budget:
                self.capped += 1
                continue
            chosen.update(mine)
            kept.append((tid, plan))
        self._active = kept
        self._pending = list(chosen.items())
        return [(node, v) for _, (node, v, _, _) in self._pending]

    def add(self, q: torch.Tensor) -> None:
        """The drafter's q rows ``[len(frontier), draft_vocab]`` at the frontier's nodes."""
        self._level = []
        for (path, (_, _, text, p)), row in zip(self._pending, q):
            self._index[path] = len(self.paths)
            self._level.append(len(self.paths))
            self.paths.append(path)
            self.texts.append(text)
            self.prob.append(p)
            self.q_rows.append(row)
        self._pending = []

    def psi(self, order: torch.Tensor) -> tuple[list[int], torch.Tensor]:
        """The surviving candidates' target ids and psi (float64, clamped at 0 against
        rounding); ``order`` is the draft vocabulary's byte order, on the q rows' device
        (where psi is computed)."""
        ids = [tid for tid, _ in self._active]
        device = order.device
        if not ids:
            return ids, torch.zeros(0, dtype=torch.float64, device=device)
        q = torch.stack(self.q_rows).to(device=device, dtype=torch.float64)  # rows come from the host-side tree
        width = order.numel() + 1
        # cum[n * width + j]: node n's mass on the first j draft tokens in byte order.
        cum = torch.nn.functional.pad(q.index_select(1, order).cumsum(dim=1), (1, 0)).reshape(-1)
        parts: list[list[np.ndarray]] = [[], [], [], [], []]  # candidate, node, lo, hi, sign
        for c, (_, plan) in enumerate(self._active):
            for node, text in enumerate(self.texts):
                lo, hi, sign = plan.terms(text)
                for part, values in zip(parts, (np.full(lo.size, c), np.full(lo.size, node), lo, hi, sign)):
                    part.append(values)
        # Every candidate's terms are built on the host (per-string plans) and moved in one copy.
        terms = torch.from_numpy(np.stack([np.concatenate(p).astype(np.int64) for p in parts])).to(device)
        cand, node, lo, hi, sign = terms.unbind(0)
        prob = to_device(self.prob, torch.float64, device)
        mass = cum.index_select(0, node * width + hi) - cum.index_select(0, node * width + lo)
        value = sign.to(torch.float64) * prob.index_select(0, node) * mass
        psi = torch.zeros(len(ids), dtype=torch.float64, device=device).index_add_(0, cand, value)
        return ids, psi.clamp(min=0.0)
