"""``slrs``'s first proposal of a step, for every sampling request of the batch at once.

Per request: the drafter's distribution at the context ranks the likely first target
tokens (candidates); their psi nodes are evaluated level by level, one tree-masked
drafter forward per level for the whole batch (:mod:`drafter.rules.slrs.psi`); psi on the
candidates that fit the work cap (C), plus the drafter's chance of ending the text at
once (the target's EOS), is renormalized, the first target token is sampled from it,
and that same row is what the verifier gets as q. The drafter then continues from that
token's text (the caller's ordinary draft loop), and the later positions are verified
one-hot (exact for any proposal), so the step stays lossless. A request whose C holds
less than :data:`MIN_COVERAGE` of the drafter's mass drafts as ``slem`` this step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vllm_hetero_spec.drafter.runtime.paged_kv import PagedCache, PoolExhausted, TokenTree
from vllm_hetero_spec.drafter.runtime.model import DraftModel
from vllm_hetero_spec.drafter.sampling import SamplingRows, processed_probs
from vllm_hetero_spec.drafter.rules.slrs.psi import PsiPlanner, TreeBuilder
from vllm_hetero_spec.host_to_device import to_device
from vllm_hetero_spec.verify.draft_probs import DraftProbs
from vllm_hetero_spec.vocab.retokenize import TokenEncoder
from vllm_hetero_spec.vocab.sorted_strings import SortedStrings


@dataclass
class FirstTokens:
    """The step's first proposals (``None`` where the request falls back to ``slem``).

    Attributes:
        target_ids: the sampled first target token per request.
        draft_ids: the draft tokens spelling it (empty for EOS), to continue from.
        q_rows: the distribution it was sampled from, one compact row on its support.
        nodes: drafter evaluations spent beyond the contexts.
        capped: candidates left out by the budget.
        coverage: per request with a proposal, the drafter's mass on C.
    """

    target_ids: list[int | None]
    draft_ids: list[list[int]]
    q_rows: list[DraftProbs | None]
    nodes: int = 0
    capped: int = 0
    coverage: list[float] = field(default_factory=list)


# Below this drafter mass on C the renormalized table would propose what the drafter
# itself finds unlikely; the request drafts as slem instead (decided before sampling).
MIN_COVERAGE = 0.05


class FirstTokenSampler:
    """Holds the vocabulary structures of one pair and proposes first tokens."""

    def __init__(
        self,
        draft_bytes: list[bytes | None],
        target_bytes: list[bytes | None],
        target_encoder: TokenEncoder | None,
        target_eos: int | None,
        target_vocab: int,
        max_nodes: int,
        num_candidates: int,
        min_prob: float = 0.0,
        device: torch.device | str = "cpu",
    ):
        self.draft = SortedStrings(draft_bytes)
        self.target = SortedStrings(target_bytes)
        self.planner = PsiPlanner(self.draft, self.target)
        # On the drafter's device, where the q rows they index live.
        self.order = torch.tensor(self.draft.order.tolist(), dtype=torch.long, device=device)
        self.draft_bytes = draft_bytes
        self.target_bytes = target_bytes
        self.textless = torch.tensor([not b for b in draft_bytes], dtype=torch.bool, device=device)
        self.target_encoder = target_encoder
        self.target_eos = target_eos
        self.target_vocab = target_vocab
        self.max_nodes = max_nodes
        self.num_candidates = num_candidates
        self.min_prob = min_prob
        self._canonical: dict[bytes, int] = {}

    def canonical_id(self, text: bytes) -> int:
        """The target id for a string several ids spell (e.g. a byte-fallback token and a
        normal one): the one the target tokenizer itself produces for it."""
        tid = self._canonical.get(text)
        if tid is None:
            ids = self.target.ids[text]
            tid = ids[0]
            if len(ids) > 1 and self.target_encoder is not None:
                enc = self.target_encoder.encode(text)
                tid = enc[0] if len(enc) == 1 and enc[0] in ids else ids[-1]
            self._canonical[text] = tid
        return tid

    def candidates(self, q_root: torch.Tensor) -> list[tuple[int, bytes]]:
        """Likely first target tokens, most likely first: the longest target token each
        of the drafter's most probable tokens starts with, ranked by their summed mass.
        A function of the drafter's distribution at the context, never of its sample."""
        top = torch.topk(q_root, min(4 * self.num_candidates, q_root.numel()))
        mass: dict[bytes, float] = {}
        for v, m in zip(top.indices.tolist(), top.values.tolist()):
            text = self.draft_bytes[v]
            if m <= 0 or not text:
                continue
            lead = self.target.longest_prefix(text)
            if lead is not None:
                mass[lead] = mass.get(lead, 0.0) + m
        ranked = sorted(mass, key=lambda b: -mass[b])[: self.num_candidates]
        return [(self.canonical_id(b), b) for b in ranked]

    def propose(
        self, runtime: DraftModel, caches: list[PagedCache], root_logits: torch.Tensor, rows: SamplingRows
    ) -> FirstTokens:
        """First proposals for requests whose drafter has just evaluated its context
        (``root_logits`` ``[n, draft_vocab]``, caches committed up to the context).
        When the draft KV pool cannot hold the trees, every request falls back to
        ``slem`` this step (no proposal, decided before anything is sampled)."""
        n = len(caches)
        q_dev = processed_probs(root_logits, rows)
        # The mass of text-less draft tokens (EOS and other specials) becomes the target
        # EOS's, on the drafter's device where psi is built; the tree works on the host.
        eos_mass = (q_dev * self.textless).sum(dim=1, dtype=torch.float64)
        q_root = q_dev.cpu()
        builders = [
            TreeBuilder(self.planner, self.candidates(q_root[i]), self.max_nodes, self.min_prob, q_root[i])
            for i in range(n)
        ]
        trees = [TokenTree(c) for c in caches]
        try:
            self._evaluate(runtime, caches, trees, builders, rows)
        except PoolExhausted:
            return FirstTokens([None] * n, [[] for _ in range(n)], [None] * n)
        finally:
            for tree in trees:
                tree.release()
        return self._draw_first(builders, eos_mass, rows)

    def profile(self, root_logits: torch.Tensor, rows: SamplingRows) -> None:
        """What :meth:`propose` holds on the device at its widest, for vLLM's memory
        profile: the contexts' q and EOS mass, then a tree level as wide as the contexts
        (a level is sliced to ``max_rows`` rows, which ``root_logits`` has): its forward
        logits, their gathered copy and its probabilities."""
        q_dev = processed_probs(root_logits, rows)
        held = [q_dev, (q_dev * self.textless).sum(dim=1, dtype=torch.float64)]
        level = root_logits.clone()
        owners = rows.select(list(range(level.shape[0])))
        processed_probs(torch.cat([level]), owners).cpu()
        held.clear()

    def _evaluate(
        self, runtime: DraftModel, caches: list[PagedCache], trees: list[TokenTree],
        builders: list[TreeBuilder], rows: SamplingRows,
    ) -> None:
        """Grow every request's psi tree level by level: per level one forward and one
        read-back for the whole batch, or per slice of at most ``runtime.cfg.max_rows``
        nodes when a level is wider (each request's nodes stay in one slice), so a
        level's logits and probabilities never outgrow the drafter's profiled peak."""
        n = len(caches)
        while True:
            fronts = [b.frontier() for b in builders]
            grow = [i for i in range(n) if fronts[i]]
            if not grow:
                break
            for part in _slices(grow, [len(fronts[i]) for i in grow], runtime.cfg.max_rows):
                levels = runtime.grow_trees(
                    [caches[i] for i in part], [trees[i] for i in part],
                    [[node for node, _ in fronts[i]] for i in part], [[v for _, v in fronts[i]] for i in part],
                )
                sizes = [level.shape[0] for level in levels]
                owners = [i for i, size in zip(part, sizes) for _ in range(size)]
                # The planner reads these rows entry by entry: it works on the host.
                probs = processed_probs(torch.cat(levels), rows.select(owners)).cpu()
                for i, level in zip(part, probs.split(sizes)):
                    builders[i].add(level)

    def _draw_first(self, builders: list[TreeBuilder], eos_mass: torch.Tensor, rows: SamplingRows) -> FirstTokens:
        """psi on C per request, renormalized, and the first target token drawn from it
        (``eos_mass`` ``[n]``: each request's draft mass on text-less tokens)."""
        n = len(builders)
        out = FirstTokens(
            [None] * n, [[] for _ in range(n)], [None] * n,
            sum(b.num_nodes for b in builders), sum(b.capped for b in builders),
        )
        tables = []
        for i, builder in enumerate(builders):
            ids, psi = builder.psi(self.order)
            if self.target_eos is not None:
                ids.append(self.target_eos)
                psi = torch.cat([psi, eos_mass.narrow(0, i, 1).to(psi.device)])
            tables.append((ids, psi))
        if not tables:
            return out
        # Every request's total in one read-back, then every draw's in one more.
        totals = torch.stack([psi.sum() for _, psi in tables]).tolist()
        drawn, picks = [], []
        for i, ((ids, psi), total) in enumerate(zip(tables, totals)):
            if total < MIN_COVERAGE:
                continue
            ids_t = to_device(ids, torch.long, psi.device)
            support, col = torch.unique(ids_t, sorted=True, return_inverse=True)
            law = torch.zeros(len(support), dtype=torch.float64, device=psi.device).index_add_(0, col, psi / total).float()
            gen = rows.generator(i)
            # Sampled from and verified against the very same tensor.
            picks.append(support.select(0, _draw(law if gen is None else law.to(gen.device), gen).to(support.device)))
            drawn.append(i)
            out.q_rows[i] = DraftProbs(law.unsqueeze(0), support.unsqueeze(0))
            out.coverage.append(total)
        for i, pick in zip(drawn, torch.stack(picks).tolist() if picks else []):
            out.target_ids[i] = pick
            text = self.target_bytes[pick]
            out.draft_ids[i] = (self.draft.segment(text) or []) if text else []
        return out


def _slices(items: list[int], sizes: list[int], cap: int) -> list[list[int]]:
    """``items`` in order, cut into runs whose ``sizes`` sum to at most ``cap`` (an item
    larger than ``cap`` runs alone)."""
    out: list[list[int]] = []
    total = cap
    for item, size in zip(items, sizes):
        if total + size > cap:
            out.append([])
            total = 0
        out[-1].append(item)
        total += size
    return out


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """The index of one sample of ``probs`` (exponential race, the request's generator
    if seeded), left on the device."""
    noise = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / noise).argmax()
