"""The rejection sampler as vLLM calls it: ``HeteroRejectionSampler.forward`` with vLLM's
spec-decode layout, vLLM's sampling constraints (temperature, top-k, top-p) applied to
the target, vLLM's bonus sampler, and a batch mixing greedy, seeded and unseeded rows.

These reach the wiring the rule-level battery does not: a sampler that skipped vLLM's
temperature/top-k/top-p on p, or drew a seeded request's randomness from anything but
its own generator and its own draft count, fails here.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from _sampler_inputs import batch_rows, sampling_metadata, spec_metadata
from _stats import assert_follows
from vllm.v1.sample.sampler import Sampler

import vllm_hetero_spec
from vllm_hetero_spec.verify.draft_probs import DraftProbs
from vllm_hetero_spec.verify.plan import VerifyPlan
from vllm_hetero_spec.verify.sampler import HeteroRejectionSampler
from vllm_hetero_spec.verify.seeded import position_generators, position_seed

V = 8
LOGITS = torch.tensor([2.0, 1.4, 1.1, 0.6, 0.3, 0.0, -0.4, -1.0])  # distinct: no ties at the cut-offs
Q = torch.tensor([0.05, 0.3, 0.1, 0.2, 0.05, 0.1, 0.1, 0.1])  # the drafter's law: far from p


@pytest.fixture(autouse=True)
def _plugin() -> None:
    vllm_hetero_spec.register()  # the CPU build needs the patched expand kernel


def processed(temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The target law vLLM samples from: softmax(logits / T), cut to the top k, then to
    the smallest head of mass >= top_p (computed here independently of vLLM)."""
    probs = (LOGITS / temperature).softmax(-1).double()
    order = probs.argsort(descending=True)
    probs[order[top_k:]] = 0.0
    probs /= probs.sum()
    head = probs[order].cumsum(0) - probs[order] < top_p  # the mass before each token < top_p
    probs[order[~head]] = 0.0
    return probs / probs.sum()


def _verify(rows: list[dict], k: int, seed: int = 0) -> torch.Tensor:
    """One forward over ``rows`` (each: temperature, top_k, top_p, seed or None, drafts
    as target ids), every position scored with LOGITS, q rows = Q; returns the emitted
    tokens ``[B, k + 1]``."""
    torch.manual_seed(seed)
    drafts = [r["drafts"] for r in rows]
    n_pos = sum(len(d) + 1 for d in drafts)
    logits = LOGITS.expand(n_pos, V).clone()
    n_q = sum(len(d) for d in drafts)
    plan = VerifyPlan(DraftProbs(Q.expand(n_q, V).clone(), torch.arange(V)))
    req_ids, start = [], 0
    for i, r in enumerate(rows):
        req_ids.append(f"r{i}")
        plan.q_index[f"r{i}"] = list(range(start, start + len(r["drafts"])))
        start += len(r["drafts"])
    gens = {i: torch.Generator().manual_seed(r["seed"]) for i, r in enumerate(rows) if r["seed"] is not None}
    meta = sampling_metadata(
        len(rows), [r["temperature"] for r in rows], top_k=[r["top_k"] for r in rows],
        top_p=[r["top_p"] for r in rows], generators=gens,
    )
    rows_now = batch_rows(req_ids, [r["temperature"] for r in rows])
    sampler = HeteroRejectionSampler(Sampler(), None, torch.device("cpu"), batch_rows=lambda: rows_now)
    sampler.plan = plan
    return sampler(spec_metadata(drafts), None, logits, meta).sampled_token_ids


KINDS = {
    "greedy": dict(temperature=0.0, top_k=V, top_p=1.0),
    "seeded T=0.7 top-k 4": dict(temperature=0.7, top_k=4, top_p=1.0),
    "unseeded T=1.3 top-p 0.8": dict(temperature=1.3, top_k=V, top_p=0.8),
    "unseeded T=1 top-k 5 top-p 0.9": dict(temperature=1.0, top_k=5, top_p=0.9),
}


def test_first_token_follows_the_processed_target_in_a_mixed_batch() -> None:
    """Drafts drawn from Q (seeded), verified in one mixed batch: every sampled row's
    first emitted token follows the target law after vLLM's temperature, top-k and top-p;
    every greedy row emits the argmax."""
    n = 3000
    gen = torch.Generator().manual_seed(11)
    rows = []
    for i in range(n):
        for name, kind in KINDS.items():
            drafts = torch.multinomial(Q, 2, replacement=True, generator=gen).tolist()
            seed = 1000 + i if name.startswith("seeded") else None
            rows.append(dict(kind, seed=seed, drafts=drafts, kind=name))
    out = _verify(rows, 2, seed=5)
    first = out[:, 0]
    for name, kind in KINDS.items():
        tokens = first[[j for j, r in enumerate(rows) if r["kind"] == name]]
        if kind["temperature"] == 0:
            assert bool((tokens == int(LOGITS.argmax())).all())
        else:
            assert_follows(tokens, processed(kind["temperature"], kind["top_k"], kind["top_p"]))


N_TOKENS = 24
LOGITS_AT = torch.randn(N_TOKENS + 8, V, generator=torch.Generator().manual_seed(21)) * 1.5  # per position
SEEDED = KINDS["seeded T=0.7 top-k 4"]


def _metadata(kinds: list[dict], generators: dict[int, torch.Generator]):
    return sampling_metadata(len(kinds), [r["temperature"] for r in kinds], top_k=[r["top_k"] for r in kinds],
                             top_p=[r["top_p"] for r in kinds], generators=generators)


def _plain_decode(seed: int, start: int) -> list[int]:
    """The seeded request decoded without speculation, one token per step by vLLM's
    sampler, each with the generator of its position."""
    out = []
    for t in range(start, start + N_TOKENS):
        gens = position_generators([0], [seed], [t], torch.device("cpu"))
        out.append(int(Sampler()(logits=LOGITS_AT[t - start][None].clone(),
                                 sampling_metadata=_metadata([SEEDED], gens)).sampled_token_ids[0, 0]))
    return out


def _speculative_decode(seed: int, start: int, draft, companions: int, rng: torch.Generator) -> list[int]:
    """The same request through the rejection sampler, step by step: ``draft(emitted)``
    gives its proposals, and ``companions`` other rows (unseeded sampled and greedy, with
    random drafts) share each step's batch, the request's row placed at random."""
    emitted: list[int] = []
    while len(emitted) < N_TOKENS:
        mine = draft(emitted)
        others = [dict(KINDS["unseeded T=1.3 top-p 0.8"] if i % 2 else KINDS["greedy"],
                       drafts=torch.randint(0, V, (int(torch.randint(0, 4, (1,), generator=rng)),),
                                            generator=rng).tolist())
                  for i in range(companions)]
        at = int(torch.randint(0, companions + 1, (1,), generator=rng))
        kinds = others[:at] + [dict(SEEDED, drafts=mine)] + others[at:]
        logits = torch.cat([
            LOGITS_AT[len(emitted): len(emitted) + len(mine) + 1] if i == at else torch.randn(len(r["drafts"]) + 1, V)
            for i, r in enumerate(kinds)
        ])
        req_ids = [f"r{i}" for i in range(len(kinds))]
        positions = [start + len(emitted) if i == at else 7 for i in range(len(kinds))]
        rows = batch_rows(req_ids, [r["temperature"] for r in kinds], positions)
        sampler = HeteroRejectionSampler(Sampler(), None, torch.device("cpu"), batch_rows=lambda: rows)
        n_q = sum(len(r["drafts"]) for r in kinds)
        sampler.plan = VerifyPlan(DraftProbs(Q.expand(n_q, V).clone(), torch.arange(V)))
        offsets = list(itertools.accumulate([len(r["drafts"]) for r in kinds], initial=0))
        sampler.plan.q_index = {req: list(range(offsets[i], offsets[i + 1])) for i, req in enumerate(req_ids)}
        gens = {i: torch.Generator().manual_seed(seed if i == at else 99) for i, r in enumerate(kinds)
                if r["temperature"] > 0 and (i == at or i % 3 == 0)}
        out = sampler(spec_metadata([r["drafts"] for r in kinds]), None, logits, _metadata(kinds, gens))
        emitted += [t for t in out.sampled_token_ids[at].tolist() if t >= 0]
    return emitted[:N_TOKENS]


def test_a_seeded_request_emits_the_same_tokens_whatever_was_drafted() -> None:
    """Same seed, same tokens: a seeded request's output is the plain decoding of its
    positions' generators, whether it was never drafted for, drafted for with
    random proposals of random lengths, with its own next tokens, or beside other rows
    in varying batches, at any row."""
    rng = torch.Generator().manual_seed(4)
    outputs = set()
    for seed in range(6):
        reference = _plain_decode(seed, start=11)
        outputs.add(tuple(reference))
        policies = {
            "never": lambda e: [],
            "random": lambda e: torch.multinomial(Q, int(torch.randint(1, 4, (1,), generator=rng)), replacement=True,
                                                  generator=rng).tolist(),
            "its own tokens, one wrong": lambda e, ref=reference: ref[len(e): len(e) + 2] + [(ref[len(e)] + 1) % V],
        }
        for name, policy in policies.items():
            for companions in (0, 3):
                got = _speculative_decode(seed, 11, policy, companions, rng)
                assert got == reference, (seed, name, companions)
    assert len(outputs) == 6, "seeds gave equal outputs: the test would prove nothing"


def test_greedy_rows_take_the_argmax_of_the_logits() -> None:
    """Two logits 2^-25 apart tie after a float32 softmax; vLLM's greedy token is the
    larger logit, and so is ours, also when a sampled row makes the sampler compute p."""
    logits = torch.tensor([0.25, 0.25 + 2**-25, -3.0])
    assert bool(logits.softmax(-1)[0] == logits.softmax(-1)[1]), "no tie: the test would prove nothing"
    drafts = [[1], [0]]
    meta = sampling_metadata(2, [0.0, 1.0])
    sampler = HeteroRejectionSampler(Sampler(), None, torch.device("cpu"),
                                     batch_rows=lambda: batch_rows(["g", "s"], [0.0, 1.0]))
    padded = torch.cat([logits, torch.full((V - 3,), -30.0)])
    out = sampler(spec_metadata(drafts), None, padded.expand(4, V).clone(), meta).sampled_token_ids
    assert out[0].tolist() == [1, 1]


def test_a_sampled_row_never_accepts_a_token_the_target_rules_out() -> None:
    """Temperature 1e-5 is sampled, not greedy, for vLLM (greedy is below 1e-5): the row
    gets its uniforms, and a draft the target gives p = 0 (top-k 1) is never accepted."""
    rows = [dict(temperature=1e-5, top_k=1, top_p=1.0, seed=None, drafts=[5, 5]) for _ in range(64)]
    out = _verify(rows, 2)
    assert bool((out[:, 0] == 0).all()), out[:, 0]


def test_an_undrafted_step_samples_as_plain_decoding(monkeypatch) -> None:
    """vLLM sends every step of a speculative engine to the rejection sampler, also one
    where the budget drafted nothing (most steps on a target too cheap for the drafter).
    Such a step emits exactly what vLLM's plain sampler emits for the batch (greedy,
    seeded and unseeded rows, the same random draws; seeded rows with the generators of
    their positions), one token per row, and runs no
    verification at all (its cost was about 1 ms a step on Gemma-3's vocabulary)."""
    from vllm_hetero_spec.verify import sampler as sampler_module

    def no_verification(*args, **kwargs):
        raise AssertionError("an undrafted step ran verification")

    monkeypatch.setattr(sampler_module, "verify_tokens", no_verification)
    kinds = [KINDS["greedy"], KINDS["seeded T=0.7 top-k 4"], KINDS["unseeded T=1.3 top-p 0.8"]]
    rows = [kinds[i % 3] for i in range(60)]
    req_ids = [f"r{i}" for i in range(len(rows))]
    logits = torch.randn(len(rows), V, generator=torch.Generator().manual_seed(3))

    seeded = list(range(1, len(rows), 3))
    positions = [5 + 2 * i for i in range(len(rows))]

    def metadata(gens):
        return sampling_metadata(len(rows), [r["temperature"] for r in rows], top_k=[r["top_k"] for r in rows],
                                 top_p=[r["top_p"] for r in rows], generators=gens)

    torch.manual_seed(8)
    keyed = position_generators(seeded, [50 + i for i in seeded], [positions[i] for i in seeded], torch.device("cpu"))
    plain = Sampler()(logits=logits.clone(), sampling_metadata=metadata(keyed)).sampled_token_ids
    sampler = HeteroRejectionSampler(
        Sampler(), None, torch.device("cpu"),
        batch_rows=lambda: batch_rows(req_ids, [r["temperature"] for r in rows], positions))
    torch.manual_seed(8)
    own = {i: torch.Generator().manual_seed(50 + i) for i in seeded}
    ours = sampler(spec_metadata([[] for _ in rows]), None, logits.clone(), metadata(own)).sampled_token_ids
    assert ours.shape == (len(rows), 1) and ours.dtype == torch.int32
    assert ours.tolist() == plain.tolist()
    assert len(set(ours[2::3].flatten().tolist())) > 1, "the sampled rows never varied: the test would prove nothing"


@pytest.mark.parametrize("fsd", [None, ("js", 10)], ids=["plain", "fsd"])
def test_dummy_batches_from_vllms_profile_run(monkeypatch, fsd) -> None:
    """vLLM's ``_dummy_sampler_run`` (the memory profile and warm-up of every engine
    built without enforce_eager) calls the rejection sampler with one dummy draft per
    row and no request in the batch, sampled and then all greedy: both verify. With
    ``fsd`` the dummy verification computes the divergence (its largest transient), so
    vLLM's memory profile covers it."""
    from types import SimpleNamespace

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_hetero_spec.verify import sampler as sampler_module
    from vllm_hetero_spec.verify.sampler import BatchRows

    fuzzy_seen = []
    verify = sampler_module.verify_tokens

    def recording_verify(*args, **kwargs):
        fuzzy_seen.append(args[11] is not None)
        return verify(*args, **kwargs)

    monkeypatch.setattr(sampler_module, "verify_tokens", recording_verify)
    calls = []
    sampler = HeteroRejectionSampler(Sampler(), None, torch.device("cpu"), batch_rows=lambda: BatchRows([], [], []),
                                     fsd=fsd)
    original = sampler.forward

    def forward(*args, **kwargs):
        out = original(*args, **kwargs)
        calls.append(out.sampled_token_ids)
        return out

    sampler.forward = forward
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda: None)  # no accelerator here
    b = 16
    runner = SimpleNamespace(
        vllm_config=SimpleNamespace(model_config=SimpleNamespace(multimodal_config=None)),
        model=SimpleNamespace(compute_logits=lambda h: h @ torch.randn(h.shape[1], V)),
        device=torch.device("cpu"), sampler=Sampler(), rejection_sampler=sampler,
        speculative_config=SimpleNamespace(rejection_sample_method="standard", draft_sample_method="greedy"),
    )
    GPUModelRunner._dummy_sampler_run(runner, torch.randn(b, 32))
    assert len(calls) == 2 and fuzzy_seen == [fsd is not None] * 2
    for out in calls:
        assert out.shape == (b, 2) and bool(((out[:, 0] >= 0) & (out[:, 0] < V)).all())
        assert bool(((out[:, 1] >= -1) & (out[:, 1] < V)).all())


def test_seeded_children_of_one_request_are_independent_samples() -> None:
    """``n > 1`` with a seed: vLLM gives child i the seed ``seed + i``
    (``ParentRequest.get_child_sampling_params``). Drawn per (seed, position), child 1's
    token at a position must not be child 0's at the next one: a seed mixed additively
    with the position would make every child a shifted copy of its sibling."""
    seed = 1234
    children = [[position_seed(seed + i, t) for t in range(11, 11 + N_TOKENS)] for i in range(4)]
    for a in range(4):
        for b in range(4):
            if a != b:
                assert not set(children[a]) & set(children[b]), (a, b)
    decoded = [_plain_decode(seed + i, start=11) for i in range(4)]
    for a in range(4):
        for b in range(4):
            if a != b:
                assert all(decoded[a][s:] != decoded[b][: N_TOKENS - s] for s in range(1, 4)), (a, b)
    assert len({tuple(d) for d in decoded}) == 4


def test_an_exact_tie_takes_the_token_vllms_greedy_op_takes() -> None:
    """Two tokens whose logits are exactly equal: at a drafted row and at the bonus row a
    greedy request takes the one ``Sampler.greedy_sample`` takes (the first), so a draft
    of the other is rejected and one of it accepted."""
    logits = torch.full((V,), -5.0)
    logits[[2, 5]] = 2.0
    want = int(Sampler.greedy_sample(logits[None].clone())[0])
    other = 5 if want == 2 else 2
    sampler = HeteroRejectionSampler(Sampler(), None, torch.device("cpu"),
                                     batch_rows=lambda: batch_rows(["rejects", "accepts"], [0.0, 0.0]))
    out = sampler(spec_metadata([[other], [want]]), None, logits.expand(4, V).clone(),
                  sampling_metadata(2, [0.0, 0.0])).sampled_token_ids
    assert out[0].tolist() == [want, -1] and out[1].tolist() == [want, want], out
