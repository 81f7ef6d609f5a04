"""Drafting step n+1 while the target verifies step n (PEARL/DuoDecoding pipelining).

vLLM asks for drafts synchronously, once per step, right after verification. A drafter
in its own process can use the target's forward to prepare the next answer: assume the
target accepts every draft token of this step, guess its bonus token, and draft from
there. When the assumption holds, the next :meth:`PipelinedDrafter.step` returns at
once; otherwise the guess is thrown away and the request drafts as usual.

The bonus token is where DuoDecoding's dynamic multi-sequence drafting fits: when the
drafter is unsure of it (some of its top-ranked candidates are more likely than its
top-1 two-token path, :func:`branch_count`), several short continuations are drafted,
one per candidate, instead of one. The target's own sampled bonus token then picks the
branch -- the target decides it, not a rejection test -- so every draft handed to the
verifier is an ordinary draft from the request's true context, drawn with the request's
own random stream (forked), and every verification rule stays exactly as lossless as
without pipelining.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from vllm_hetero_spec.drafter.batch_drafter import BatchDrafter
from vllm_hetero_spec.drafter.messages import RequestParams, StepBatch, StepDrafts
from vllm_hetero_spec.drafter.runtime.paged_kv import TokenTree
from vllm_hetero_spec.vocab.retokenize import propose_continuations

_BRANCH = "\x00branch"  # engine state keys of speculative branches: f"{req_id}{_BRANCH}{j}"


def branch_count(first_probs: torch.Tensor, second_top: float, max_branches: int) -> int:
    """DuoDecoding's rule for how many sequences to draft from one position.

    ``first_probs`` are the drafter's top candidates for the first token, descending;
    ``second_top`` is its top probability for the next token after the top-1 candidate.
    theta = p(top-1) * p(top-1 of the next token) is the likeliest two-token path's
    probability; every other candidate more likely than that path on its own gets its
    own sequence.
    """
    theta = float(first_probs[0]) * second_top
    extra = int((first_probs[1:max_branches] > theta).sum())
    return 1 + extra


@dataclass
class Branch:
    """One speculative continuation of a request: the committed tokens it assumed, its
    draft state's key in the engine, and the drafts it produced."""

    assumed: np.ndarray
    key: str
    drafts: StepDrafts


class PipelinedDrafter:
    """A :class:`BatchDrafter` plus speculative drafting between steps."""

    def __init__(self, engine: BatchDrafter, max_branches: int):
        self.drafter = engine
        self.max_branches = max_branches
        self.branches: dict[str, list[Branch]] = {}
        self._last: tuple[StepBatch, StepDrafts] | None = None

    def step(self, batch: StepBatch) -> StepDrafts:
        """Drafts for ``batch``: from a branch whose assumption came true, else drafted now."""
        hits: dict[int, StepDrafts] = {}
        for i, (req_id, tokens) in enumerate(zip(batch.req_ids, batch.tokens)):
            for branch in self.branches.get(req_id, ()):
                if len(branch.assumed) == len(tokens) and np.array_equal(branch.assumed, tokens):
                    self.drafter.move(branch.key, req_id)
                    hits[i] = branch.drafts
                    break
        stats = self.drafter.stats
        stats.pipeline_hits += len(hits)
        stats.pipeline_misses += sum(1 for r in batch.req_ids if r in self.branches) - len(hits)
        stats.proposed += sum(len(d.ids[0]) for d in hits.values())
        self.discard()
        rest = [i for i in range(len(batch.req_ids)) if i not in hits]
        drafted = self.drafter.step(
            StepBatch([batch.req_ids[i] for i in rest], [batch.tokens[i] for i in rest],
                      [batch.params[i] for i in rest], batch.budget, [batch.cap(i) for i in rest])
        )
        if not hits:
            out = drafted
        else:
            parts = {i: drafted.select([j]) for j, i in enumerate(rest)}
            parts.update(hits)
            out = StepDrafts.concat([parts[i] for i in range(len(batch.req_ids))])
        self._last = (batch, out)
        return out

    def keep_only(self, live: set[str]) -> None:
        """Forget every request not in ``live``, with its branches."""
        for req_id in [r for r in self.branches if r not in live]:
            for branch in self.branches.pop(req_id):
                self.drafter.drop(branch.key)
        self.drafter.keep_only(live | self._branch_keys())

    def discard(self) -> None:
        """Drop every speculative branch."""
        for branches in self.branches.values():
            for branch in branches:
                self.drafter.drop(branch.key)
        self.branches.clear()

    def speculate(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Draft the next step of every request of the last step, assuming its drafts
        are all accepted, with one branch per likely bonus token. ``stop`` (checked
        between drafter forwards) cuts the work short when the next step is already
        asking: speculation must never make the target wait."""
        if self._last is None or stop():
            return
        t0 = time.perf_counter()
        batch, drafts = self._last
        self._last = None
        engine = self.drafter
        eos = engine.bridge.target_tokenizer.eos_token_id
        keys, bases, params, owners = [], [], [], []
        for i, req_id in enumerate(batch.req_ids):
            ids = drafts.ids[i]
            if not drafts.ready[i] or req_id not in engine.states or (ids and ids[-1] == eos):
                continue
            key = f"{req_id}{_BRANCH}0"
            engine.fork(req_id, key)
            keys.append(key)
            bases.append(np.concatenate([batch.tokens[i], np.asarray(ids, dtype=batch.tokens[i].dtype)]))
            params.append(batch.params[i])
            owners.append(req_id)
        ready = engine.sync(keys, bases, params)
        live = [j for j, ok in enumerate(ready) if ok]
        for j, ok in enumerate(ready):
            if not ok:
                engine.drop(keys[j])
        if live:
            self._branch([keys[j] for j in live], [bases[j] for j in live], [params[j] for j in live],
                         [owners[j] for j in live], batch.budget, stop)
        kept = self._branch_keys()
        for key in [k for k in engine.states if _BRANCH in k and k not in kept]:
            engine.drop(key)  # cut short, or no candidates
        engine.stats.pipeline_s += time.perf_counter() - t0

    def _branch_keys(self) -> set[str]:
        return {b.key for branches in self.branches.values() for b in branches}

    def _branch(
        self, keys: list[str], bases: list[np.ndarray], params: list[RequestParams], owners: list[str], budget: int,
        stop: Callable[[], bool],
    ) -> None:
        """Pick each request's bonus-token candidates and draft one branch per candidate."""
        engine = self.drafter
        n_draft = len(engine.bridge.draft_bytes)
        probs = engine.next_logits(keys)[:, :n_draft].softmax(dim=-1)
        top_p, top_ids = probs.topk(self.max_branches, dim=-1)
        if stop():
            return
        second = self._second_token_top(keys, top_ids[:, 0].tolist())
        draft_enc = engine.bridge.draft_encoder
        tails, texts, where = [], [], []
        for j, key in enumerate(keys):
            n = branch_count(top_p[j], second[j], self.max_branches)
            for d in top_ids[j, :n].tolist():
                text = draft_enc.bytes_of(d)
                if text:
                    tails.append(engine.states[key].target_tail)
                    texts.append(text)
                    where.append(j)
        firsts = propose_continuations(engine.bridge.target_encoder, tails, texts, 1)
        candidates: dict[int, list[int]] = {}
        for j, first in zip(where, firsts):
            if first and first[0] not in candidates.setdefault(j, []):
                candidates[j].append(first[0])
        b_keys, b_tokens, b_params, made = [], [], [], []
        for j, key in enumerate(keys):
            for n, bonus in enumerate(candidates.get(j, [])):
                b_key = key if n == 0 else f"{owners[j]}{_BRANCH}{n}"
                if n:
                    engine.fork(key, b_key)
                assumed = np.append(bases[j], bonus).astype(bases[j].dtype)
                b_keys.append(b_key)
                b_tokens.append(assumed)
                b_params.append(params[j])
                made.append((owners[j], assumed, b_key))
        if not b_keys or stop():
            return
        drafted = engine.step(StepBatch(b_keys, b_tokens, b_params, budget), speculative=True, stop=stop)
        engine.stats.pipeline_branches += len(b_keys)
        for n, (owner, assumed, b_key) in enumerate(made):
            if drafted.ids[n]:  # an empty branch would answer a hit with no drafts at all
                self.branches.setdefault(owner, []).append(Branch(assumed, b_key, drafted.select([n])))

    def _second_token_top(self, keys: list[str], top1: list[int]) -> list[float]:
        """The drafter's top probability for the token after each request's top-1
        candidate (one tree-masked forward past the cache, nothing committed)."""
        engine = self.drafter
        caches = [engine.states[k].cache for k in keys]
        trees = [TokenTree(c) for c in caches]
        try:
            logits = engine.runtime.grow_trees(caches, trees, [[0] for _ in keys], [[t] for t in top1])
        finally:
            for tree in trees:
                tree.release()
        engine.stats.draft_forwards += 1
        n_draft = len(engine.bridge.draft_bytes)
        return [float(lg[0, :n_draft].softmax(dim=-1).max()) for lg in logits]
