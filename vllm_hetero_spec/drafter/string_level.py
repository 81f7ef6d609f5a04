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
of two cumulative sums). A candidate's nodes and terms depend only on the two
vocabularies, so they are built once per target token (:func:`plan_token`) and cached;
per step the drafter evaluates the union of the nodes of the chosen candidates in one
tree-masked forward, and :func:`evaluate` turns those q rows into psi.

Draft tokens without text end the string: at the context they propose the target's EOS.

Losslessness does not rest on psi being exact: the first target token is *sampled from
the computed table* (restricted to the candidates C whose psi fit in the step's budget,
renormalized) and verified against that same table, so verification sees exactly the law
the proposal came from, whatever the budget cut. Exactness makes that table the
drafter's true string-level law on C (tested against brute force).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from vllm_hetero_spec.vocab.sorted_strings import SortedStrings


@dataclass(frozen=True)
class TokenPlan:
    """What psi(y) needs, for one target token y, relative to any context.

    Attributes:
        paths: draft-token paths from the context (``()`` is the context itself), each
            after its parent.
        term_node / term_lo / term_hi / term_sign: one term per (node, word): the node's
            probability times its q mass on draft tokens ``order[lo:hi]``, signed.
    """

    paths: tuple[tuple[int, ...], ...]
    term_node: np.ndarray
    term_lo: np.ndarray
    term_hi: np.ndarray
    term_sign: np.ndarray

    @property
    def num_nodes(self) -> int:
        """Drafter evaluations beyond the context."""
        return len(self.paths) - 1


class PsiPlanner:
    """Builds and caches :class:`TokenPlan`\\ s for one draft/target vocabulary pair."""

    def __init__(self, draft: SortedStrings, target: SortedStrings, max_nodes: int, cache_size: int = 1 << 16):
        self.draft = draft
        self.target = target
        self.max_nodes = max_nodes
        self.plan = lru_cache(maxsize=cache_size)(self._plan)

    def _plan(self, token: bytes) -> TokenPlan | None:
        """The plan for the target token ``token``; ``None`` when it needs more than
        ``max_nodes`` drafter evaluations (its psi is then never computed)."""
        words = [token, *self.target.minimal_extensions(token)]
        signs = [1.0] + [-1.0] * (len(words) - 1)
        word_sign = dict(zip(words, signs))
        sorted_words = SortedStrings([w for w in words])
        prefixes = SortedStrings([w[:j] for w in words for j in range(1, len(w))])
        paths: list[tuple[int, ...]] = [()]
        texts = [b""]
        i = 0
        while i < len(paths):
            for longer in prefixes.extending(texts[i]):
                for v in self.draft.ids.get(longer[len(texts[i]) :], ()):
                    paths.append(paths[i] + (v,))
                    texts.append(longer)
            if len(paths) - 1 > self.max_nodes:
                return None
            i += 1
        nodes, los, his, sgn = [], [], [], []
        for n, text in enumerate(texts):
            for word in sorted_words.extending(text):
                lo, hi = self.draft.prefix_range(word[len(text) :])
                if hi > lo:
                    nodes.append(n)
                    los.append(lo)
                    his.append(hi)
                    sgn.append(word_sign[word])
        return TokenPlan(
            tuple(paths), np.array(nodes, dtype=np.int64), np.array(los, dtype=np.int64),
            np.array(his, dtype=np.int64), np.array(sgn, dtype=np.float64),
        )


@dataclass
class StepTree:
    """The union of some candidates' plans for one request: the nodes to evaluate.

    Attributes:
        candidates: target ids whose psi is computed, in priority order.
        plans: their plans.
        paths: every node's draft-token path (``paths[0] == ()``, parents first).
        index: path -> node index.
    """

    candidates: list[int]
    plans: list[TokenPlan]
    paths: list[tuple[int, ...]]
    index: dict[tuple[int, ...], int]

    @property
    def parents(self) -> list[int]:
        """Parent node of each node beyond the context (node ``i + 1``)."""
        return [self.index[p[:-1]] for p in self.paths[1:]]

    @property
    def tokens(self) -> list[int]:
        """The draft token each node beyond the context adds to its parent."""
        return [p[-1] for p in self.paths[1:]]


def build_tree(planner: PsiPlanner, candidates: list[tuple[int, bytes]], budget: int) -> tuple[StepTree, int]:
    """Take candidates ``(target id, bytes)`` in order while the union of their nodes
    stays within ``budget`` drafter evaluations. Depends only on the candidates and the
    vocabularies, never on the draft's sample, so the resulting C is a fixed set.
    Returns the tree and how many candidates were left out by the budget."""
    tree = StepTree([], [], [()], {(): 0})
    skipped = 0
    for tid, text in candidates:
        plan = planner.plan(text)
        new = [] if plan is None else [p for p in plan.paths if p not in tree.index]
        if plan is None or len(tree.paths) - 1 + len(new) > budget:
            skipped += 1
            continue
        for path in new:
            tree.index[path] = len(tree.paths)
            tree.paths.append(path)
        tree.candidates.append(tid)
        tree.plans.append(plan)
    return tree, skipped


def path_probs(tree: StepTree, q: torch.Tensor) -> torch.Tensor:
    """``[n_nodes]`` float64 probability of each node's path given the q rows ``[n_nodes,
    draft_vocab]`` of the drafter at every node (row 0: the context)."""
    prob = torch.ones(len(tree.paths), dtype=torch.float64)
    q64 = q.double()
    for i, (parent, token) in enumerate(zip(tree.parents, tree.tokens), start=1):
        prob[i] = prob[parent] * q64[parent, token]
    return prob


def evaluate(tree: StepTree, q: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """psi of each candidate ``[len(tree.candidates)]`` (float64, clamped at 0 against
    rounding) from the drafter's q rows at every node; ``order`` is the draft
    vocabulary's byte order (:attr:`SortedStrings.order`)."""
    prob = path_probs(tree, q)
    cum = torch.zeros(q.shape[0], order.numel() + 1, dtype=torch.float64)
    cum[:, 1:] = q.double()[:, order].cumsum(dim=1)
    psi = torch.zeros(len(tree.candidates), dtype=torch.float64)
    for c, plan in enumerate(tree.plans):
        if plan.term_node.size == 0:
            continue
        nodes = torch.tensor([tree.index[plan.paths[n]] for n in plan.term_node], dtype=torch.long)
        lo, hi = torch.from_numpy(plan.term_lo), torch.from_numpy(plan.term_hi)
        mass = cum[nodes, hi] - cum[nodes, lo]
        psi[c] = (torch.from_numpy(plan.term_sign) * prob[nodes] * mass).sum()
    return psi.clamp(min=0.0)
