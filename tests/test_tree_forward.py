"""The drafter's token-tree forward: every node's logits equal those of running its
path as a plain sequence, across levels and requests, and the caches stay committed
where they were (the tree is scratch). Gemma runs past its 512-token sliding window."""

from __future__ import annotations

import pytest
import torch

from vllm_hetero_spec.drafter.runtime import DraftModelRuntime
from vllm_hetero_spec.drafter.varlen_attention import TokenTree


def _sequential(runtime: DraftModelRuntime, path: list[int]) -> torch.Tensor:
    return runtime.forward([runtime.new_cache()], [path])[0]


@pytest.mark.parametrize("model,context_len", [("smollm2", 9), ("gemma", 530)])
def test_tree_nodes_match_their_paths(model: str, context_len: int, request: pytest.FixtureRequest) -> None:
    runtime = DraftModelRuntime(request.getfixturevalue(model))
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(100, 5000, (context_len,), generator=g).tolist()
    short = ctx[:5]
    caches = [runtime.new_cache(), runtime.new_cache()]
    runtime.forward(caches, [ctx, short])
    trees = [TokenTree(len(ctx)), TokenTree(len(short))]
    level1 = runtime.grow_trees(caches, trees, [[0, 0], [0]], [[300, 200], [77]])
    level2 = runtime.grow_trees(caches, trees, [[1, 2, 1], [1]], [[400, 500, 600], [88]])
    level3 = runtime.grow_trees(caches[:1], trees[:1], [[3]], [[700]])
    assert [c.length for c in caches] == [len(ctx), len(short)]
    checks = [
        (level1[0][0], ctx + [300]), (level1[0][1], ctx + [200]), (level1[1][0], short + [77]),
        (level2[0][0], ctx + [300, 400]), (level2[0][1], ctx + [200, 500]), (level2[0][2], ctx + [300, 600]),
        (level2[1][0], short + [77, 88]), (level3[0][0], ctx + [300, 400, 700]),
    ]
    for got, path in checks:
        assert torch.allclose(got, _sequential(runtime, path), atol=2e-3), path[len(ctx) - 1 :]
    # The tree left nothing behind: drafting on from the context is unaffected.
    assert torch.allclose(runtime.forward(caches[:1], [[999]])[0], _sequential(runtime, ctx + [999]), atol=2e-3)
