"""The proposer's side of union and fsd, on the real SmolLM2 -> Qwen tokenizer pair.

The draft model is replaced by a scripted one (each draft step puts all the mass on one
chosen draft token), so the test needs no weights and no vLLM engine, yet runs the
proposer's own sync, drafting loop, proposal mapping and verification plan.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm import SamplingParams
from vllm.config import CompilationConfig

from vllm_hetero_spec.vllm_integration import proposer as proposer_module
from vllm_hetero_spec.drafter import batch_drafter as engine_module
from vllm_hetero_spec.config import HeteroSettings
from vllm_hetero_spec.drafter.messages import RequestParams
from vllm_hetero_spec.policy.budget import sampled_label
from vllm_hetero_spec.drafter.runtime.paged_kv import BlockPool, PagedCache
from vllm_hetero_spec.drafter.rules.mapped_sampling import ABSENT_PLACEHOLDER
from vllm_hetero_spec.vocab.bridge import VocabBridge, load_tokenizer

K = 4


class ScriptedRuntime:
    """Stands in for ``DraftModel``: draft step i always samples ``script[i]``,
    with probability ``confidence.get(i)`` when given (else all but 1); the rest of the
    mass is spread evenly."""

    script: list[int] = []
    confidence: dict[int, float] = {}

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.vocab_size = 49152
        self.calls = 0
        self.fed: list[list[int]] = []
        self.device = torch.device("cpu")
        self.pool = BlockPool(1 << 16, 32, 0)
        self.max_len = 1 << 20

    def new_cache(self) -> PagedCache:
        return PagedCache(self.pool)

    def forward(self, caches: list[PagedCache], new_tokens: list[list[int]]) -> torch.Tensor:
        for cache, toks in zip(caches, new_tokens):
            assert toks, "the real runtime needs at least one new token per request"
            cache.advance(len(toks))
        logits = torch.zeros(len(caches), self.vocab_size)
        c = self.confidence.get(self.calls)
        top = 60.0 if c is None else math.log(c * (self.vocab_size - 1) / (1 - c))
        logits[:, self.script[min(self.calls, len(self.script) - 1)]] = top
        self.calls += 1
        return logits

    def forward_next(self, caches: list[PagedCache], ids: torch.Tensor, draft_index: int) -> torch.Tensor:
        """As the real runtime: one token per cache, the ids already on the device."""
        assert ids.shape == (len(caches),) and draft_index > 0
        self.fed.append(ids.tolist())
        return self.forward(caches, [[t] for t in ids.tolist()])

    def grow_trees(self, caches, trees, parents, tokens) -> list[torch.Tensor]:
        """slrs's psi tree: every node puts its mass on the same scripted token."""
        out = []
        for toks in tokens:
            logits = torch.zeros(len(toks), self.vocab_size)
            logits[:, self.script[min(self.calls, len(self.script) - 1)]] = 60.0
            out.append(logits)
        return out


def target_config(settings: HeteroSettings, target: str) -> SimpleNamespace:
    """The parts of a CPU engine's ``VllmConfig`` the proposer reads, for ``target``."""
    return SimpleNamespace(
        additional_config={"hetero_spec": settings.to_dict()},
        model_config=SimpleNamespace(get_vocab_size=lambda: 151936, tokenizer=target, model=target, seed=0,
                                     enforce_eager=False, dtype=torch.float32),
        compilation_config=CompilationConfig(), device_config=SimpleNamespace(device=torch.device("cpu")),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=8192, max_num_seqs=64),
    )


@pytest.fixture(scope="module")
def bridge(smollm2: str, qwen05: str) -> VocabBridge:
    return VocabBridge.build(smollm2, qwen05, 49152, 151936)


def _proposer(
    monkeypatch, bridge: VocabBridge, smollm2: str, qwen05: str, algorithm: str, script: list[int],
    confidence: dict[int, float] | None = None, defer: bool = False, **extra
):
    monkeypatch.setattr(engine_module, "DraftModel", ScriptedRuntime)
    monkeypatch.setattr(engine_module.VocabBridge, "build", lambda *a: bridge)
    ScriptedRuntime.script = script
    ScriptedRuntime.confidence = confidence or {}
    settings = HeteroSettings(algorithm=algorithm, draft_model=smollm2, draft_tokenizer=smollm2, num_speculative_tokens=K,
                              max_draft_tokens=K, fsd_threshold=0.05, draft_budget="fixed", draft_kv_pool_mb=64,
                              **extra)
    proposer = proposer_module.HeteroProposer(target_config(settings, qwen05))
    proposer.load_model(None)
    # How an accelerator runs the loop (read back once per step, stop rules applied
    # afterwards) rather than the CPU's read per position: the drafts must not differ.
    proposer.host.drafter.defer_reads = defer
    return proposer


def _attach(prop, requests: dict[str, SamplingParams], order: list[str]) -> None:
    prop.attach_runner(SimpleNamespace(
        input_batch=SimpleNamespace(req_ids=order),
        requests={r: SimpleNamespace(sampling_params=p, output_token_ids=[]) for r, p in requests.items()},
    ))


def _propose(prop, qwen05: str, n_reqs: int) -> list[list[int]]:
    prompt = load_tokenizer(qwen05).encode("The quick brown fox jumps over the")
    tokens = np.array([prompt] * n_reqs)
    out = prop.propose([[prompt[-1]]] * n_reqs, np.array([len(prompt)] * n_reqs), tokens)
    assert prop.stats.fallbacks == 0, "propose() failed internally (see the logged traceback)"
    return out


def _ids(bridge: VocabBridge) -> tuple[int, int, int]:
    """Two shared draft ids and one ordinary (not special) draft token whose text the
    target has no single token for (an ordinary BPE token, past the added ones)."""
    inter = bridge.intersection
    shared = inter.shared_draft_ids.tolist()
    specials = set(bridge.draft_tokenizer.all_special_ids)
    absent = next(
        d for d, b in enumerate(bridge.draft_encoder.token_bytes)
        if b and inter.draft_to_target[d] < 0 and d not in specials and d > 1000
    )
    return shared[500], shared[600], absent


def _q_rows(plan, req_id: str, proposals: list[int]) -> torch.Tensor:
    """``[n, V]`` the q the plan gives each of a request's proposals (one-hot where it
    has no row), expanded from the compact form the way verification reads it."""
    rows = []
    for j, tok in zip(plan.q_index.get(req_id, [-1] * len(proposals)), proposals):
        if j < 0:
            rows.append(torch.nn.functional.one_hot(torch.tensor(tok), 151936).float())
        else:
            rows.append(plan.q.dense(torch.tensor([j]), 151936)[0])
    return torch.stack(rows)


@pytest.mark.parametrize("defer", [False, True], ids=["read-each-position", "read-once"])
def test_union_proposes_a_placeholder_and_stops(monkeypatch, bridge, smollm2, qwen05, defer) -> None:
    a, b, absent = _ids(bridge)
    prop = _proposer(monkeypatch, bridge, smollm2, qwen05, "union", [a, absent, b, b], defer=defer)
    params = SamplingParams(temperature=1.0, seed=1)
    _attach(prop, {"r0": params, "r1": params}, ["r0", "r1"])
    out = _propose(prop, qwen05, 2)
    t_a = int(bridge.intersection.draft_to_target[a])
    assert out == [[t_a, ABSENT_PLACEHOLDER]] * 2  # nothing drafted after the absent token
    plan = prop.take_verify_plan()
    probs = _q_rows(plan, "r0", out[0])
    assert plan.q.support.dim() == 1 and plan.q.probs.shape[1] < 151936 / 2  # compact, not [B, K, V]
    assert float(probs[0, t_a]) > 0.99
    assert float(probs[1].sum()) < 1e-6  # q_in: the absent token's mass is not renormalized away
    # reordered and grown by verification time
    block = plan.layout(["r1", "r0", "r2"], [2, 2, 0], 2, torch.device("cpu"))
    assert block.force_reject.tolist() == [[False, True], [False, True], [False, False]] and block.fuzzy is None
    assert prop.take_verify_plan() is None  # the plan is handed over once


@pytest.mark.parametrize("algorithm", ["slem", "union"])
def test_reading_once_drafts_what_reading_each_position_drafts(monkeypatch, bridge, smollm2, qwen05, algorithm) -> None:
    """The loop as it runs on an accelerator (every position fed by the previous one's
    samples on the device, read back once, the stop rules applied afterwards) proposes
    what the CPU's read-per-position loop proposes, and rolls the KV back to the kept
    draft: slem stops after a text-less token, union after an absent one."""
    a, b, absent = _ids(bridge)
    script = [a, b, bridge.draft_tokenizer.eos_token_id, a] if algorithm == "slem" else [a, absent, b, b]
    outs = {}
    for defer in (False, True):
        prop = _proposer(monkeypatch, bridge, smollm2, qwen05, algorithm, script, defer=defer)
        _attach(prop, {"r0": SamplingParams(temperature=0.0)}, ["r0"])
        outs[defer] = _propose(prop, qwen05, 1)
        engine = prop.host.drafter
        state = engine.states["r0"]
        assert state.cache.length <= len(state.draft)
        fed = engine.runtime.fed  # the samples fed back; reading once, also past a stop
        assert fed[0] == [script[0]] and (not defer or fed[1] == [script[1]])
    assert outs[True] == outs[False]
    if algorithm == "slem":
        assert outs[False][0][-1] == bridge.target_tokenizer.eos_token_id
    else:
        assert outs[False][0] == [int(bridge.intersection.draft_to_target[a]), ABSENT_PLACEHOLDER]


@pytest.mark.parametrize("defer", [False, True], ids=["read-each-position", "read-once"])
@pytest.mark.parametrize("algorithm", ["tli", "slem"])
def test_draft_stop_prob_stops_after_the_unsure_token(monkeypatch, bridge, smollm2, qwen05, algorithm, defer) -> None:
    """With ``draft_stop_prob`` 0.5, the drafter stops after its first token below that
    confidence, and that token is still proposed (drafted for, so worth verifying)."""
    a, b, _ = _ids(bridge)
    prop = _proposer(monkeypatch, bridge, smollm2, qwen05, algorithm, [a, b, a, b], {1: 0.3}, defer=defer,
                     draft_stop_prob=0.5)
    _attach(prop, {"r0": SamplingParams(temperature=0.0)}, ["r0"])
    out = _propose(prop, qwen05, 1)
    to_target = bridge.intersection.draft_to_target
    assert out == [[int(to_target[a]), int(to_target[b])]]


@pytest.mark.parametrize("defer", [False, True], ids=["read-each-position", "read-once"])
@pytest.mark.parametrize("algorithm", ["tli", "slem"])
def test_a_seeded_request_draws_for_its_own_length(monkeypatch, bridge, smollm2, qwen05, algorithm, defer) -> None:
    """A request capped at 2 proposals beside one capped at 4 drafts only its own 2, so
    its seeded stream advances as it does alone: its next step's drafts are the same."""
    from vllm_hetero_spec.drafter.messages import StepBatch

    a, _, _ = _ids(bridge)
    prompt = load_tokenizer(qwen05).encode("The quick brown fox jumps over the")

    def next_drafts(rows: list[str], caps: list[int]) -> list[int]:
        # Nearly uniform drafts: which tokens come out depends on the stream's state.
        prop = _proposer(monkeypatch, bridge, smollm2, qwen05, algorithm, [a] * 64, {i: 0.01 for i in range(64)},
                         defer=defer)
        engine = prop.host.drafter
        params = [RequestParams(temperature=1.0, seed=5 if r == "s" else None) for r in rows]
        engine.step(StepBatch(rows, [np.array(prompt)] * len(rows), params, max(caps), caps))
        grown = [np.array(prompt + [prompt[-1]])] * len(rows)
        return engine.step(StepBatch(rows, grown, params, 2, [2] * len(rows))).ids[rows.index("s")]

    alone = next_drafts(["s"], [2])
    assert alone and alone == next_drafts(["o", "s"], [4, 2])


def test_structured_output_requests_are_verified_one_hot(monkeypatch, bridge, smollm2, qwen05) -> None:
    """vLLM cuts a structured-output request's draft at its first grammar-invalid token,
    whatever the kind of constraint (JSON schema, regex, choice, grammar), so its
    proposals must be verified one-hot (``verify/plan.py``); the free request in the
    same batch keeps its q rows."""
    from vllm.sampling_params import StructuredOutputsParams

    a, b, _ = _ids(bridge)
    prop = _proposer(monkeypatch, bridge, smollm2, qwen05, "tli", [a, b])
    constraints = {"json": dict(json={"type": "string"}), "regex": dict(regex="[a-z ]+"),
                   "choice": dict(choice=["yes", "no"]), "grammar": dict(grammar='root ::= "a" | "b"')}
    requests = {name: SamplingParams(temperature=1.0, structured_outputs=StructuredOutputsParams(**kw))
                for name, kw in constraints.items()}
    requests["free"] = SamplingParams(temperature=1.0)
    _attach(prop, requests, list(requests))
    _propose(prop, qwen05, len(requests))
    plan = prop.take_verify_plan()
    assert plan.one_hot == set(constraints)
    block = plan.layout(["free", *constraints], [K] * len(requests), K, torch.device("cpu"))
    assert block.q.index.tolist() == [plan.q_index["free"]] + [[-1] * K] * len(constraints)


def test_tli_never_drafts_the_absent_token(monkeypatch, bridge, smollm2, qwen05) -> None:
    a, b, absent = _ids(bridge)
    prop = _proposer(monkeypatch, bridge, smollm2, qwen05, "tli", [a, absent, b, b])
    _attach(prop, {"r0": SamplingParams(temperature=1.0, seed=1)}, ["r0"])
    out = _propose(prop, qwen05, 1)
    assert len(out[0]) == K  # the absent token is masked out, drafting goes on
    assert set(out[0]) <= set(bridge.intersection.shared_target_ids.tolist())
    block = prop.take_verify_plan().layout(["r0"], [K], K, torch.device("cpu"))
    assert block.force_reject is None and block.fuzzy is None and block.q.index.tolist() == [list(range(K))]


def test_fsd_threshold_per_request(monkeypatch, bridge, smollm2, qwen05) -> None:
    a, b, _ = _ids(bridge)
    prop = _proposer(monkeypatch, bridge, smollm2, qwen05, "fsd", [a, b])
    requests = {
        "default": SamplingParams(temperature=1.0),
        "loose": SamplingParams(temperature=1.0, extra_args={"fsd_threshold": 0.4}),
    }
    _attach(prop, requests, ["default", "loose"])
    _propose(prop, qwen05, 2)
    block = prop.take_verify_plan().layout(["default", "loose"], [K, K], K, torch.device("cpu"))
    assert block.force_reject is None
    fuzzy = block.fuzzy
    assert fuzzy.threshold.tolist() == pytest.approx([0.05, 0.4])
    assert (fuzzy.divergence, fuzzy.topk) == ("js", 10)


def test_fsd_bad_request_threshold_keeps_the_engine_alive(monkeypatch, bridge, smollm2, qwen05) -> None:
    """The front end rejects a bad tau with HTTP 400 (test_request_validation); one that
    reaches the engine anyway must not raise there (it would kill the engine): the
    configured tau is used instead."""
    a, b, _ = _ids(bridge)
    prop = _proposer(monkeypatch, bridge, smollm2, qwen05, "fsd", [a, b])
    _attach(prop, {"bad": SamplingParams(temperature=1.0, extra_args={"fsd_threshold": -1})}, ["bad"])
    _propose(prop, qwen05, 1)
    assert prop.states["bad"].params.fsd_threshold == prop.settings.fsd_threshold


def _with_extensions(bridge: VocabBridge) -> int:
    """A shared draft id whose text is a target token that longer target tokens extend
    (so its psi needs a drafter evaluation beyond the context)."""
    target = set(b for b in bridge.target_bytes if b)
    for d in bridge.intersection.shared_draft_ids.tolist()[400:]:
        text = bridge.draft_bytes[d]
        if len(text) >= 3 and any(text + bytes([c]) in target for c in range(97, 123)):
            return d
    raise AssertionError("no such token")


def test_slrs_mixed_batch(monkeypatch, bridge, smollm2, qwen05) -> None:
    """A sampling request proposes its first token from the psi table it hands to the
    verifier (one-hot after it); a greedy request in the same batch drafts as slem."""
    a = _with_extensions(bridge)
    prop = _proposer(monkeypatch, bridge, smollm2, qwen05, "slrs", [a] * 12)
    _attach(prop, {"s": SamplingParams(temperature=1.0, seed=3), "g": SamplingParams(temperature=0.0)}, ["s", "g"])
    out = _propose(prop, qwen05, 2)
    plan = prop.take_verify_plan()
    assert prop.stats.slrs_nodes > 0 and prop.stats.slrs_uncovered == 0
    first = out[0][0]
    assert plan.q_index["s"][0] == 0 and set(plan.q_index["s"][1:]) <= {-1}  # one row: the first token's
    probs = _q_rows(plan, "s", out[0])
    assert abs(float(probs[0].sum()) - 1) < 1e-5 and float(probs[0, first]) > 0
    assert bridge.target_bytes[first] == bridge.draft_bytes[a]  # the drafter's string starts with it
    assert len(out[1]) > 0 and set(plan.q_index.get("g", [-1])) == {-1}


def test_slrs_without_budget_drafts_as_slem(monkeypatch, bridge, smollm2, qwen05) -> None:
    """A work cap that fits no candidate leaves C without mass: the request drafts as
    slem (counted), its proposals one-hot, and nothing fails."""
    a = _with_extensions(bridge)
    prop = _proposer(monkeypatch, bridge, smollm2, qwen05, "slrs", [a] * 12, slrs_max_nodes=0)
    _attach(prop, {"s": SamplingParams(temperature=1.0, seed=3)}, ["s"])
    out = _propose(prop, qwen05, 1)
    assert prop.stats.slrs_uncovered == 1 and prop.stats.slrs_capped >= 1
    assert len(out[0]) > 0
    plan = prop.take_verify_plan()
    assert plan.q is None  # every proposal one-hot


def test_drafting_never_touches_the_global_rng(monkeypatch, bridge, smollm2, qwen05) -> None:
    """vLLM samples the target from the global RNG on every TP rank; sampled drafting
    (seeded and unseeded rows) must neither draw from it nor depend on it."""
    a, b, _ = _ids(bridge)
    prop = _proposer(monkeypatch, bridge, smollm2, qwen05, "tli", [a, b, a, b])
    _attach(prop, {"r0": SamplingParams(temperature=1.0, seed=3), "r1": SamplingParams(temperature=0.8)},
            ["r0", "r1"])
    before = torch.random.get_rng_state()
    _propose(prop, qwen05, 2)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_rebuilt_requests_draw_fresh_randomness(monkeypatch, bridge, smollm2, qwen05) -> None:
    """A seeded request's draft stream depends on its seed and on where its state was
    built: a state rebuilt after preemption or a failure continues with new draws
    instead of replaying the ones its committed tokens saw. Unseeded requests share the
    engine's stream (drawn in one launch), seeded from the engine's seed alone, so every
    TP rank starts it alike."""
    prop = _proposer(monkeypatch, bridge, smollm2, qwen05, "tli", [1])
    engine = prop.host.drafter
    seeded = RequestParams(1.0, 0, 1.0, seed=5)
    assert engine._stream_seed(seeded, 10) != engine._stream_seed(seeded, 11)  # rebuilt later: new draws
    assert engine._stream_seed(seeded, 10) != engine._stream_seed(RequestParams(1.0, 0, 1.0, seed=6), 10)
    assert engine._new_state("r0", RequestParams(1.0), 10).generator is None
    assert engine._new_state("r1", seeded, 10).generator is not None
    assert torch.equal(engine.generator.get_state(),
                       torch.Generator().manual_seed(engine_module._engine_seed(engine.seed)).get_state())


class SpreadRuntime(ScriptedRuntime):
    """Every evaluation spreads its mass over the same few draft tokens (``weights``):
    psi then has several candidates with distinct masses."""

    weights: dict[int, float] = {}

    def _logits(self, n: int) -> torch.Tensor:
        logits = torch.full((n, self.vocab_size), -30.0)
        for tok, w in self.weights.items():
            logits[:, tok] = w
        return logits

    def forward(self, caches: list[PagedCache], new_tokens: list[list[int]]) -> torch.Tensor:
        for cache, toks in zip(caches, new_tokens):
            cache.advance(len(toks))
        return self._logits(len(caches))

    def grow_trees(self, caches, trees, parents, tokens) -> list[torch.Tensor]:
        return [self._logits(len(toks)) for toks in tokens]


def test_slrs_first_token_is_drawn_from_the_q_it_hands_over(monkeypatch, bridge, smollm2, qwen05) -> None:
    """Through the engine's own draw and q construction (not a re-draw here): over many
    seeded requests in one step, the first proposals follow the q row each request's
    plan carries for it, and that row has several candidates."""
    from _stats import assert_follows

    shared = bridge.intersection.shared_draft_ids.tolist()
    spread = {shared[700]: 2.0, shared[900]: 1.4, shared[1100]: 1.0, _with_extensions(bridge): 1.7}
    monkeypatch.setattr(SpreadRuntime, "weights", spread)
    prop = _proposer(monkeypatch, bridge, smollm2, qwen05, "slrs", [0], slrs_max_nodes=8)
    monkeypatch.setattr(prop.host.drafter, "runtime", SpreadRuntime(None))
    n = 800
    requests = {f"r{i}": SamplingParams(temperature=1.0, seed=i) for i in range(n)}
    _attach(prop, requests, list(requests))
    out = _propose(prop, qwen05, n)
    plan = prop.take_verify_plan()
    first_rows = torch.tensor([plan.q_index[f"r{i}"][0] for i in range(n)])
    probs, support = plan.q.probs[first_rows], plan.q.support[first_rows]
    assert torch.equal(support, support[:1].expand(n, -1)) and torch.allclose(probs, probs[:1].expand(n, -1))
    law, ids = probs[0][probs[0] > 0], support[0][probs[0] > 0]  # one context: one law
    assert len(ids) >= 3
    index = {int(t): j for j, t in enumerate(ids)}
    assert_follows(torch.tensor([index[o[0]] for o in out]), law.double())


def test_budget_lengths_reach_the_drafts_and_the_plan(monkeypatch, bridge, smollm2, qwen05) -> None:
    """The budget's per-row lengths: a row at 0 gets no draft (and is not drafted), a
    row at 2 gets the first two of its proposals, and the plan (q rows, forced
    rejections) is cut to match, so verification reads exactly what was proposed."""
    a, b, absent = _ids(bridge)
    prop = _proposer(monkeypatch, bridge, smollm2, qwen05, "union", [a, b, b, absent])
    seen: list[tuple[list[int], list[int | None]]] = []
    monkeypatch.setattr(prop.policy.budget, "plan",
                        lambda req_ids, drafting, lengths, rules, left: seen.append((lengths, left)) or [0, 2, K])
    _attach(prop, {r: SamplingParams(temperature=1.0, seed=3, max_tokens=n)
                   for r, n in (("r0", 50), ("r1", 20), ("r2", None))}, ["r0", "r1", "r2"])
    prop.runner.requests["r1"].output_token_ids = [7] * 5
    out = _propose(prop, qwen05, 3)
    assert [len(o) for o in out] == [0, 2, K]
    lengths, left = seen[0]
    assert len(lengths) == 3 and min(lengths) > 0  # each row's length, to price its catch-up
    assert left == [50, 15, None]  # what each may still emit: max_tokens less its output
    assert out[1] == out[2][:2]
    assert "r0" not in prop.states  # never sent to the drafter: it syncs when it next drafts
    plan = prop.take_verify_plan()
    assert len(plan.q_index["r1"]) == 2 and len(plan.q_index["r2"]) == K
    assert plan.force_reject.get("r1", [False, False]) == [False, False]
    assert plan.force_reject["r2"] == [False, False, False, True]
    block = plan.layout(["r0", "r1", "r2"], [0, 2, K], K, torch.device("cpu"))
    assert block.force_reject.tolist()[1] == [False, False, False, False]


def test_a_step_at_zero_skips_the_drafter(monkeypatch, bridge, smollm2, qwen05) -> None:
    a, b, _ = _ids(bridge)
    prop = _proposer(monkeypatch, bridge, smollm2, qwen05, "tli", [a, b])
    monkeypatch.setattr(prop.policy.budget, "plan", lambda req_ids, drafting, lengths, rules, left: [0] * len(req_ids))
    _attach(prop, {"r0": SamplingParams(temperature=0.0)}, ["r0"])
    calls = prop.host.drafter.runtime.calls
    assert _propose(prop, qwen05, 1) == [[]]
    assert prop.host.drafter.runtime.calls == calls and prop.take_verify_plan() is None
    assert prop.policy.budget.chosen[0] == 1


def test_auto_gives_each_kind_of_request_its_rule(monkeypatch, bridge, smollm2, qwen05) -> None:
    """``algorithm: auto`` through the proposer: a greedy and a sampled row of one step
    draft with their kinds' rules (slem, tli), the budget and the chooser learn which
    rule each row used (the budget the sampled row's marked as sampled), and the plan
    carries q for the tli row only (slem is one-hot)."""
    a, b, _ = _ids(bridge)
    prop = _proposer(monkeypatch, bridge, smollm2, qwen05, "auto", [a, b, a, b])
    seen: list[list[str]] = []
    monkeypatch.setattr(prop.policy.budget, "plan",
                        lambda req_ids, drafting, lengths, rules, left: seen.append(rules) or [K] * 2)
    _attach(prop, {"g": SamplingParams(temperature=0.0), "s": SamplingParams(temperature=1.0, seed=3)}, ["g", "s"])
    out = _propose(prop, qwen05, 2)
    assert seen == [["slem", sampled_label("tli")]] and all(out)
    plan = prop.take_verify_plan()
    assert plan.q_index["s"] and all(j >= 0 for j in plan.q_index["s"])
    assert all(j < 0 for j in plan.q_index.get("g", []))
    assert prop.policy.rules.chosen == {"slem": 1, "tli": 1}
    assert prop.policy.rules._last.kinds == ["greedy", "sampled"]


def test_a_request_that_names_its_rule_drafts_with_it(monkeypatch, bridge, smollm2, qwen05) -> None:
    """``extra_args["algorithm"]``: a greedy row naming tli drafts with tli (q in the
    plan) beside one auto gives slem, the budget sees the rule each row uses, and the
    chooser counts the named row's drafts without measuring it as its own choice."""
    a, b, _ = _ids(bridge)
    prop = _proposer(monkeypatch, bridge, smollm2, qwen05, "auto", [a, b, a, b], auto_greedy=("slem", "tli"),
                     auto_sampled=("tli",))
    seen: list[list[str]] = []
    monkeypatch.setattr(prop.policy.budget, "plan",
                        lambda req_ids, drafting, lengths, rules, left: seen.append(rules) or [K] * 2)
    _attach(prop, {"g": SamplingParams(temperature=0.0),
                   "named": SamplingParams(temperature=0.0, extra_args={"algorithm": "tli"})}, ["g", "named"])
    out = _propose(prop, qwen05, 2)
    assert seen == [["slem", "tli"]] and all(out)
    assert prop.policy.rules.chosen == {"slem": 1, "tli": 1}
    assert prop.policy.rules._last.kinds == ["greedy", "pinned"]


def test_a_request_naming_a_rule_the_engine_lacks_keeps_the_engine_alive(monkeypatch, bridge, smollm2, qwen05) -> None:
    """The front end refuses it (request_validation.py); one that bypassed it drafts with
    auto's choice and the step does not fail."""
    a, b, _ = _ids(bridge)
    prop = _proposer(monkeypatch, bridge, smollm2, qwen05, "auto", [a, b, a, b])
    _attach(prop, {"r": SamplingParams(temperature=0.0, extra_args={"algorithm": "union"})}, ["r"])
    assert all(_propose(prop, qwen05, 1))
    assert prop.policy.rules.chosen == {"slem": 1}
