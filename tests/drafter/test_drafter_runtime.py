"""The vLLM-native drafter (``drafter/runtime/model.py``) on real models.

- Its logits equal the transformers reference (float32: 1e-4, or 1e-5 of the logits'
  range where that is larger) for packed, chunked and decode forwards over several
  requests at once, on SmolLM2 and on Gemma-3 past its 512-token sliding window.
- Token trees (slrs's psi nodes, the pipeline's branches): every node's logits equal
  those of running its path as a plain sequence, and the contexts stay where they were.
- Forks share blocks copy-on-write: two continuations of one fork are both exact.
- The pool is bounded: a forward that does not fit raises before running and takes
  nothing; released blocks are reusable.
- An output layer over a subset of the vocabulary (``draft_head_tokens``) gives the
  whole head's logits on the tokens it keeps and -inf elsewhere.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from vllm_hetero_spec.drafter.runtime.paged_kv import PoolExhausted, TokenTree
from vllm_hetero_spec.drafter.runtime.model import DraftModel, RuntimeConfig

TOL = 1e-4


@pytest.fixture(scope="module")
def smollm2_runtime(smollm2: str) -> DraftModel:
    return DraftModel(RuntimeConfig(smollm2, torch.float32, kv_pool_mb=96))


@pytest.fixture(scope="module")
def gemma_runtime(gemma: str) -> DraftModel:
    return DraftModel(RuntimeConfig(gemma, torch.float32, kv_pool_mb=160))


def _reference(path: str, ids: list[int]) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def _ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, 5000, (n,), generator=g).tolist()


def _sequential(runtime: DraftModel, path: list[int]) -> torch.Tensor:
    cache = runtime.new_cache()
    try:
        return runtime.forward([cache], [path])[0]
    finally:
        cache.release()


@pytest.mark.parametrize("model,long_len", [("smollm2", 70), ("gemma", 560)])
def test_logits_match_transformers(model: str, long_len: int, request: pytest.FixtureRequest) -> None:
    runtime = request.getfixturevalue(f"{model}_runtime")
    path = request.getfixturevalue(model)
    ids = _ids(long_len, 0)
    ref = _reference(path, ids)
    a, b = runtime.new_cache(), runtime.new_cache()
    # Two requests in one packed forward (a long prefill chunk and a short one), then a
    # mixed step (a chunk and a decode token), then decode tokens for both.
    cut = long_len - 3
    first = runtime.forward([a, b], [ids[:cut], ids[:7]])
    second = runtime.forward([a, b], [ids[cut : cut + 2], ids[7:8]])
    third = runtime.forward([a, b], [ids[cut + 2 :], ids[8:9]])
    got = {cut - 1: first[0], cut + 1: second[0], long_len - 1: third[0], 6: first[1], 7: second[1], 8: third[1]}
    # 1e-4 absolute; Gemma's logits reach ~100, where float32 summation order alone
    # moves them by a few 1e-4 (transformers' own eager and sdpa paths differ by 2.5e-4),
    # so the bound there is 1e-5 of the logits' range.
    bound = max(TOL, 1e-5 * float(ref.abs().max()))
    for pos, logits in got.items():
        err = float((logits - ref[pos]).abs().max())
        assert err < bound, f"position {pos}: max |diff| = {err:.2e} (bound {bound:.1e})"
        assert int(logits.argmax()) == int(ref[pos].argmax())
    assert (a.length, b.length) == (long_len, 9)
    a.release()
    b.release()


@pytest.mark.parametrize("model,context_len", [("smollm2", 9), ("gemma", 530)])
def test_tree_nodes_match_their_paths(model: str, context_len: int, request: pytest.FixtureRequest) -> None:
    runtime = request.getfixturevalue(f"{model}_runtime")
    ctx = _ids(context_len, 1)
    short = ctx[:5]
    caches = [runtime.new_cache(), runtime.new_cache()]
    runtime.forward(caches, [ctx, short])
    trees = [TokenTree(caches[0]), TokenTree(caches[1])]
    level1 = runtime.grow_trees(caches, trees, [[0, 0], [0]], [[300, 200], [77]])
    level2 = runtime.grow_trees(caches, trees, [[1, 2, 1], [1]], [[400, 500, 600], [88]])
    level3 = runtime.grow_trees(caches[:1], trees[:1], [[3]], [[700]])
    for tree in trees:
        tree.release()
    assert [c.length for c in caches] == [len(ctx), len(short)]
    # Each node against its path run as a plain continuation of a fork of its context
    # (forks are exact: test_forks_are_copy_on_write), not as a fresh prefill: nine
    # prefills of Gemma's 530-token context took most of this test's time.
    checks = [
        (level1[0][0], 0, [300]), (level1[0][1], 0, [200]), (level1[1][0], 1, [77]),
        (level2[0][0], 0, [300, 400]), (level2[0][1], 0, [200, 500]), (level2[0][2], 0, [300, 600]),
        (level2[1][0], 1, [77, 88]), (level3[0][0], 0, [300, 400, 700]),
    ]
    for got, row, suffix in checks:
        fork = caches[row].fork()
        try:
            want = runtime.forward([fork], [suffix])[0]
        finally:
            fork.release()
        err = float((got - want).abs().max())
        assert err < TOL, (row, suffix, err)
    # The trees left nothing behind: drafting on from the context is unaffected.
    after = runtime.forward(caches[:1], [[999]])[0]
    assert float((after - _sequential(runtime, ctx + [999])).abs().max()) < TOL
    for cache in caches:
        cache.release()


def test_forks_are_copy_on_write(smollm2_runtime: DraftModel) -> None:
    runtime = smollm2_runtime
    ctx = _ids(45, 2)  # ends inside a block, so both continuations write a shared block
    base = runtime.new_cache()
    runtime.forward([base], [ctx])
    fork = base.fork()
    assert fork.blocks == base.blocks
    a = runtime.forward([base], [[11, 12]])[0]
    b = runtime.forward([fork], [[21, 22, 23]])[0]
    assert fork.blocks[0] == base.blocks[0] and fork.blocks[-1] != base.blocks[-1]
    assert float((a - _sequential(runtime, ctx + [11, 12])).abs().max()) < TOL
    assert float((b - _sequential(runtime, ctx + [21, 22, 23])).abs().max()) < TOL
    # Rolling the original back and rewriting it leaves the fork intact.
    base.truncate(len(ctx) - 3)
    runtime.forward([base], [[31]])
    c = runtime.forward([fork], [[24]])[0]
    assert float((c - _sequential(runtime, ctx + [21, 22, 23, 24])).abs().max()) < TOL
    base.release()
    fork.release()


def test_pool_is_bounded(smollm2: str) -> None:
    # A pool of a few blocks: filling the 96 MiB one took a 2,000-token prefill (15 s).
    runtime = DraftModel(RuntimeConfig(smollm2, torch.float32, kv_pool_mb=8))
    pool = runtime.pool
    free = pool.num_free
    capacity = free * pool.block_size
    cache = runtime.new_cache()
    with pytest.raises(PoolExhausted):
        runtime.forward([cache], [[7] * (capacity + 1)])
    assert pool.num_free == free and cache.blocks == [] and cache.length == 0
    hog = runtime.new_cache()
    runtime.forward([hog], [[7] * (capacity - pool.block_size)])
    assert pool.num_free == 1
    with pytest.raises(PoolExhausted):
        runtime.forward([cache], [[8] * (pool.block_size + 1)])
    assert pool.num_free == 1
    hog.release()
    assert pool.num_free == free
    runtime.forward([cache], [[8] * (pool.block_size + 1)])
    cache.release()
    assert pool.num_free == free


def test_the_pool_sizing_counts_what_the_runtime_allocates(smollm2: str, smollm2_runtime) -> None:
    """``draft_kv_pool_mb: auto`` sizes from the draft config's bytes per token: the
    same bytes the runtime's vLLM KV specs give a block."""
    from transformers import AutoConfig

    from vllm_hetero_spec.drafter.runtime.pool_size import draft_bytes_per_token

    pool = smollm2_runtime.pool
    assert pool.bytes_per_block == draft_bytes_per_token(AutoConfig.from_pretrained(smollm2), torch.float32) * (
        pool.block_size)


def test_padded_forwards_are_exact(smollm2_runtime: DraftModel) -> None:
    """What a CUDA graph replay computes, on the real model and vLLM's CPU attention:
    forwards padded to a bucket (``drafter/runtime/cuda_graphs.py``: padding tokens reuse
    earlier ids and positions, with KV slot -1) give the logits of the same forwards
    unpadded, and write no KV but their own tokens' (a padding write into a live
    sequence's slot would change every later step's logits)."""
    from _graph_config import graph_config

    from vllm_hetero_spec.drafter.runtime.cuda_graphs import DraftGraphs

    rt = smollm2_runtime
    ids = _ids(40, 3)

    def run(graphs: DraftGraphs) -> list[torch.Tensor]:
        saved, rt.graphs = rt.graphs, graphs
        a, b = rt.new_cache(), rt.new_cache()
        try:
            return [
                rt.forward([a, b], [ids[:9], ids[20:27]]),  # 16 tokens: bucket 16
                rt.forward([a, b], [ids[9:10], ids[27:28]]),  # 2 -> 4
                rt.forward_next([a, b], torch.tensor([ids[10], ids[28]]), 1),  # 2 -> 4
                rt.forward([a, b], [ids[11:14], ids[29:31]]),  # 5 -> 8
                rt.forward([a, b], [ids[14:31], ids[31:32]]),  # 18: past the buckets, eager
                rt.forward_next([a, b], torch.tensor([ids[31], ids[32]]), 1),
            ]
        finally:
            rt.graphs = saved
            a.release()
            b.release()

    padded = DraftGraphs(graph_config([4, 8, 16]), rt.device)
    assert [padded.dispatch(n)[1].num_tokens for n in (16, 2, 5, 18)] == [16, 4, 8, 18]
    for step, (want, got) in enumerate(zip(run(rt.graphs), run(padded))):
        err = float((want - got).abs().max())
        assert err < TOL, f"forward {step}: max |diff| = {err:.2e}"


def test_a_long_catch_up_runs_in_bounded_forwards(smollm2_runtime: DraftModel, monkeypatch) -> None:
    """A catch-up larger than ``max_forward_tokens`` (new requests' prompts) runs in
    forwards of at most that many tokens -- the bound vLLM's profile run measures, and
    the most a compiled drafter accepts -- and gives the logits of one unbounded forward;
    so do more sequences than a forward takes."""
    import dataclasses

    rt = smollm2_runtime
    ids = _ids(40, 5)
    want_a, want_b = rt.new_cache(), rt.new_cache()
    want = rt.forward([want_a, want_b], [ids[:23], ids[23:40]])
    sizes: list[int] = []
    run = rt._run
    monkeypatch.setattr(rt, "_run", lambda caches, lengths, *a: sizes.append(sum(lengths)) or run(caches, lengths, *a))
    monkeypatch.setattr(rt, "cfg", dataclasses.replace(rt.cfg, max_forward_tokens=8))
    a, b = rt.new_cache(), rt.new_cache()
    got = rt.forward([a, b], [ids[:23], ids[23:40]])
    assert max(sizes) <= 8 and sum(sizes) == 40 and len(sizes) == 5
    assert float((got - want).abs().max()) < TOL
    assert (a.length, b.length) == (23, 17)
    # The next forward continues from the chunked state exactly.
    assert float((rt.forward([a], [[7]]) - rt.forward([want_a], [[7]])).abs().max()) < TOL
    for cache in (a, b, want_a, want_b):
        cache.release()
    # More sequences than a forward takes (slrs's tree nodes, one token each): in groups.
    many = [rt.new_cache() for _ in range(11)]
    sizes.clear()
    got = rt.forward(many, [[t] for t in ids[:11]])
    assert sizes == [8, 3]
    for i, cache in enumerate(many):
        assert float((got[i] - _sequential(rt, [ids[i]])).abs().max()) < TOL
        cache.release()


def test_the_profile_forward_writes_nothing(smollm2_runtime: DraftModel, monkeypatch) -> None:
    """vLLM's profile run gets the drafter's largest forward (capped like every forward)
    and its logits rows, without touching the KV pool."""
    import dataclasses

    rt = smollm2_runtime
    monkeypatch.setattr(rt, "cfg", dataclasses.replace(rt.cfg, max_forward_tokens=32))
    used = rt.pool.used_bytes
    cache = rt.new_cache()
    before = rt.forward([cache], [_ids(9, 6)])
    logits = rt.dummy_logits(100, 8)
    assert logits.shape == (8, rt.vocab_size) and logits.dtype == torch.float32
    assert rt.pool.used_bytes == used + cache.nbytes
    cache.truncate(8)
    assert float((rt.forward([cache], [_ids(9, 6)[8:]]) - before).abs().max()) < TOL
    cache.release()


def test_a_subset_head_keeps_the_whole_heads_logits_on_its_tokens(smollm2: str, smollm2_runtime) -> None:
    subset = DraftModel(RuntimeConfig(smollm2, torch.float32, kv_pool_mb=16, head_tokens=1000))
    assert subset.head is not None and smollm2_runtime.head is None
    ids = _ids(12, 3)
    whole, part = _sequential(smollm2_runtime, ids), _sequential(subset, ids)
    kept = torch.zeros(whole.shape[-1], dtype=torch.bool)
    kept[:1000] = True  # SmolLM2's added tokens are among its first ids
    torch.testing.assert_close(part[kept], whole[kept], atol=TOL, rtol=0)
    assert torch.isneginf(part[~kept]).all()
    assert int(part.argmax()) == int(whole[kept].argmax())
