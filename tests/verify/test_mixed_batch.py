"""Every lossless rule in one verify call: no mix-up between rows, positions and q columns.

A single batch, verified through the sampler as vLLM calls it, mixes ``slem`` and ``dtw``
(one-hot), ``tli`` (a wide shared support), ``union`` (forced rejections of absent
drafts), ``fsd`` at tau = 0, ``slrs`` (a 3-wide support per row at the first position,
one-hot after), greedy rows, rows verified one-hot for a grammar, seeded and unseeded
rows, rows with no drafts, and temperatures 1 and 0.8. Their q rows are joined as the
proposer joins a step's rules (``DraftProbs.cat``: narrow supports padded next to wide
ones).

p and q differ per row and per position: each row sees the vocabulary through a
permutation of its own (its logits and its q at a token are those of the permuted id
in its rule's law for that position), and each (rule, position) has its own law. Mapped
back through its row's permutation, every emitted token at position j must follow its
rule's p at j (bonus included), one chi-square test per (rule, position); greedy rows
must emit the argmax. A sampler that read another row's q, another position's, or the
column next to the token's, would bias some of these.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from _sampler_inputs import batch_rows, sampling_metadata, spec_metadata
from _stats import conditional_pvalue
from vllm.v1.sample.sampler import Sampler

import vllm_hetero_spec
from vllm_hetero_spec.drafter.rules.mapped_sampling import ABSENT_PLACEHOLDER
from vllm_hetero_spec.verify.draft_probs import DraftProbs
from vllm_hetero_spec.verify.plan import VerifyPlan
from vllm_hetero_spec.verify.sampler import HeteroRejectionSampler

V, K = 48, 3
ROWS_PER_RULE = 8000
ALPHA = 1e-4  # per test; about 30 tests
RULES = ("slem", "dtw", "tli", "union", "fsd", "slrs", "greedy", "grammar")
TLI_SUPPORT = 40  # the shared support of tli, fsd and the greedy and grammar rows
SLRS_SUPPORT = 3


@dataclass
class Batch:
    rule: list[str]
    perm: torch.Tensor  # [B, V]: row r's token t stands for its rule's token perm[r, t]
    temperature: list[float]
    drafts: list[list[int]]
    base: dict[str, torch.Tensor]  # rule -> [K + 1, V] logits per position (before the permutation)


def _normalized(x: torch.Tensor) -> torch.Tensor:
    return x / x.sum(-1, keepdim=True)


def _rule_rows(rule: str, n: int, base: torch.Tensor, tli_in: torch.Tensor, gen: torch.Generator) -> dict:
    """``n`` rows of one rule, vectorized: permutations [n, V], draft counts [n], drafts
    [n, K] (row-own ids), q rows [n, K, V] over row-own ids (zero where one-hot) and
    union's absent flags [n, K]. Draft laws lean towards p (so later positions are
    reached often) without being p."""
    perm = torch.rand(n, V, generator=gen).argsort(dim=1)
    num_draft = torch.multinomial(torch.tensor([0.1, 0.05, 0.05, 0.8]), n, replacement=True, generator=gen)
    lean = 0.9 * base[:K].softmax(-1) + 0.1 * _normalized(torch.rand(K, V, generator=gen) ** 3)  # [K, V]
    law = lean[:, perm].transpose(0, 1)  # [n, K, V]: row r's token t has its rule's token perm[r, t]
    q = torch.zeros(n, K, V)
    if rule in ("tli", "fsd", "greedy", "grammar"):
        q = _normalized(law * tli_in)
    elif rule == "union":
        q = law * (1 - ABSENT.view(1, K, 1))  # q_in: the drafter's mass on target ids
    elif rule == "slrs":
        support = law[:, 0].topk(SLRS_SUPPORT, dim=1).indices  # its likeliest candidates, as slrs's tree keeps
        first = torch.zeros(n, V).scatter_(1, support, law[:, 0].gather(1, support))
        q[:, 0] = _normalized(first)
    one_hot = q.sum(-1) == 0  # [n, K]: drafted from the leaning law itself
    drafts = torch.multinomial(torch.where(one_hot.unsqueeze(-1), law, q).reshape(n * K, V), 1,
                               generator=gen).view(n, K)
    absent = torch.rand(n, K, generator=gen) < ABSENT if rule == "union" else torch.zeros(n, K, dtype=torch.bool)
    return dict(perm=perm, num_draft=num_draft, drafts=drafts, q=q, absent=absent)


ABSENT = torch.tensor([0.3, 0.2, 0.4])  # union: the drafter's mass outside the target, per position


def _build(seed: int) -> tuple[Batch, VerifyPlan, dict[int, torch.Generator]]:
    """The batch, its plan (q rows joined across rules as the proposer joins them) and
    the seeded rows' generators."""
    gen = torch.Generator().manual_seed(seed)
    base = {rule: torch.randn(K + 1, V, generator=gen) * 4 for rule in RULES}
    tli_support = torch.randperm(V, generator=gen)[:TLI_SUPPORT].sort().values
    tli_in = torch.zeros(V, dtype=torch.bool)
    tli_in[tli_support] = True
    made = {rule: _rule_rows(rule, ROWS_PER_RULE, base[rule], tli_in, gen) for rule in RULES}
    order = torch.randperm(len(RULES) * ROWS_PER_RULE, generator=gen).tolist()  # the rules interleaved
    where = [(RULES[i // ROWS_PER_RULE], i % ROWS_PER_RULE) for i in order]
    rules = [rule for rule, _ in where]
    perm = torch.stack([made[rule]["perm"][i] for rule, i in where])
    temperature = [0.0 if rule == "greedy" else (0.8 if r % 3 == 0 else 1.0) for r, rule in enumerate(rules)]

    # Per group, the (rule, row, position) of each q row, in the order the batch meets them.
    entries: dict[str, list[tuple[str, int, int]]] = {"shared": [], "union": [], "slrs": []}
    q_index: dict[str, list[tuple[str, int]]] = {}
    force_reject: dict[str, list[bool]] = {}
    drafts: list[list[int]] = []
    host = {rule: {"num_draft": m["num_draft"].tolist(), "has_q": (m["q"].sum(-1) > 0).tolist(),
                   "absent": m["absent"].tolist(), "drafts": m["drafts"].tolist()} for rule, m in made.items()}
    for r, (rule, i) in enumerate(where):
        h, req, row = host[rule], f"r{r}", []
        group = "union" if rule == "union" else "slrs" if rule == "slrs" else "shared"
        for j in range(h["num_draft"][i]):
            if h["has_q"][i][j]:
                q_index.setdefault(req, []).append((group, len(entries[group])))
                entries[group].append((rule, i, j))
            elif req in q_index:
                q_index[req].append(("", -1))
            if h["absent"][i][j]:
                row.append(ABSENT_PLACEHOLDER)
                force_reject[req] = [False] * j + [True]
                break  # an absent draft ends union's block
            row.append(h["drafts"][i][j])
        drafts.append(row)

    parts, offsets = [], {}
    for name, rows in entries.items():
        offsets[name] = sum(p.num_rows for p in parts)
        if not rows:
            continue
        q = torch.empty(len(rows), V)
        for rule in {e[0] for e in rows}:
            at = [n for n, e in enumerate(rows) if e[0] == rule]
            q[at] = made[rule]["q"][[rows[n][1] for n in at], [rows[n][2] for n in at]]
        if name == "shared":
            parts.append(DraftProbs(q[:, tli_support], tli_support))
        elif name == "union":
            parts.append(DraftProbs(q, torch.arange(V)))
        else:
            support = (q > 0).nonzero()[:, 1].view(len(rows), SLRS_SUPPORT)  # ascending per row
            parts.append(DraftProbs(q.gather(1, support), support))
    plan = VerifyPlan(DraftProbs.cat(parts))  # narrow supports padded next to wide ones, as in a mixed step
    for req, entries in q_index.items():
        plan.q_index[req] = [offsets[g] + i if i >= 0 else -1 for g, i in entries]
    plan.one_hot = {f"r{r}" for r, rule in enumerate(rules) if rule == "grammar"}
    plan.force_reject = {req: (flags + [False] * K)[:K] for req, flags in force_reject.items()}
    plan.fsd_threshold = {f"r{r}": 0.0 for r, rule in enumerate(rules) if rule == "fsd"}
    gens = {r: torch.Generator().manual_seed(10_000 + r) for r in range(len(rules)) if r % 4 == 0}
    return Batch(rules, perm, temperature, drafts, base), plan, gens


def _verify(batch: Batch, plan: VerifyPlan, gens: dict[int, torch.Generator]) -> torch.Tensor:
    """``[B, K + 1]`` emitted tokens: position j of row r scored with its rule's logits
    at j, seen through the row's permutation."""
    logits = []
    for r, (rule, row) in enumerate(zip(batch.rule, batch.drafts)):
        logits.append(batch.base[rule][: len(row) + 1][:, batch.perm[r]])
    req_ids = [f"r{r}" for r in range(len(batch.rule))]
    meta = sampling_metadata(len(req_ids), batch.temperature, generators=gens)
    rows = batch_rows(req_ids, batch.temperature)
    sampler = HeteroRejectionSampler(Sampler(), None, torch.device("cpu"), batch_rows=lambda: rows)
    sampler.plan = plan
    torch.manual_seed(5)
    return sampler(spec_metadata(batch.drafts), None, torch.cat(logits), meta).sampled_token_ids.long()


@pytest.fixture(scope="module")
def verified() -> tuple[Batch, torch.Tensor]:
    vllm_hetero_spec.register()  # the CPU build needs the patched expand kernel
    batch, plan, gens = _build(seed=1)
    return batch, _verify(batch, plan, gens)


def _at(batch: Batch, out: torch.Tensor, rule: str, pos: int, temperature: float | None = None) -> torch.Tensor:
    """The tokens emitted at ``pos`` by ``rule``'s rows (of ``temperature``), each mapped
    to its rule's own id through the row's permutation."""
    rows = [r for r, name in enumerate(batch.rule)
            if name == rule and (temperature is None or batch.temperature[r] == temperature)]
    index = torch.tensor(rows)
    tokens = out[index, pos]
    emitted = tokens >= 0
    return batch.perm[index[emitted], tokens[emitted]]


@pytest.mark.parametrize("pos", range(K + 1))
@pytest.mark.parametrize("rule", [r for r in RULES if r != "greedy"])
def test_every_rule_and_position_follows_its_target(verified, rule: str, pos: int) -> None:
    batch, out = verified
    for temperature in (1.0, 0.8):
        tokens = _at(batch, out, rule, pos, temperature)
        assert tokens.numel() > 100, "too few rows reached this position: the test would prove little"
        p = (batch.base[rule][pos] / temperature).softmax(-1)
        pvalue = conditional_pvalue(torch.zeros_like(tokens), tokens, p.unsqueeze(0))
        assert pvalue > ALPHA, f"{rule} at position {pos}, T = {temperature}: p = {pvalue:.1e}"


@pytest.mark.parametrize("pos", range(K + 1))
def test_greedy_rows_emit_the_argmax(verified, pos: int) -> None:
    batch, out = verified
    tokens = _at(batch, out, "greedy", pos)
    assert tokens.numel() > 100 and bool((tokens == batch.base["greedy"][pos].argmax()).all())


def test_the_batch_mixes_what_it_claims(verified) -> None:
    """Rows with no drafts, full drafts, union's forced rejections and the rules' rows
    interleaved, seeded and not: so the tests above see every kind of row."""
    batch, out = verified
    lengths = torch.tensor([len(d) for d in batch.drafts])
    assert int((lengths == 0).sum()) > 500 and int((lengths == K).sum()) > 500
    union_absent = sum(ABSENT_PLACEHOLDER in d and rule == "union" for d, rule in zip(batch.drafts, batch.rule))
    assert union_absent > 500
    assert len(set(batch.rule[:50])) > 4
    # accepted drafts exist beyond the first position for the rules with a real q
    for rule in ("tli", "union", "fsd"):
        rows = [r for r, name in enumerate(batch.rule) if name == rule and len(batch.drafts[r]) == K]
        accepted = sum(out[r, :K].tolist() == batch.drafts[r] for r in rows)
        assert accepted > 20, rule
