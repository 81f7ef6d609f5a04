"""A hetero engine's own sampler (bonus tokens, undrafted steps) filters top-k/top-p
without a sort and samples exactly what vLLM's sampler samples."""

import torch
from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

from vllm_hetero_spec.vllm_integration.cpu_fixes import filter_without_sort


class _Holder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.topk_topp_sampler = TopKTopPSampler()


def test_same_tokens_as_vllms_sampler_in_a_batch_with_greedy_rows() -> None:
    """Rows as vLLM passes them after temperature: greedy requests with k = vocab and
    p = 1 beside top-k/top-p ones, seeded and unseeded; the same tokens, draw after draw,
    and vLLM's sort never runs."""
    from vllm.platforms import current_platform

    # The CPU build's sampling kernels (fused_gumbel_argmax), loaded as vLLM loads them: its
    # library for this CPU's instruction set (`import vllm._C` is the AVX-512 bf16 build,
    # an illegal instruction on an AVX2-only CPU).
    current_platform.import_kernels()

    vocab, rows = 50_000, 12
    gen = torch.Generator().manual_seed(1)
    k = torch.tensor([vocab, 40, 40, vocab, 20, 40, vocab, 5, 40, 40, vocab, 40])
    p = torch.tensor([1.0, 0.95, 0.9, 1.0, 0.8, 1.0, 1.0, 0.5, 0.95, 0.99, 1.0, 0.7])
    ours, theirs = _Holder(), _Holder()
    filter_without_sort(ours)
    import vllm.v1.sample.ops.topk_topp_sampler as module

    sorts = []
    original = module.apply_top_k_top_p_pytorch

    def spy(*args, **kwargs):
        sorts.append(1)
        return original(*args, **kwargs)

    for draw in range(20):
        logits = torch.randn(rows, vocab, generator=gen) * 4
        got, want = [], []
        for holder, out in ((ours, got), (theirs, want)):
            torch.manual_seed(draw)  # unseeded rows draw from the global stream
            gens = {1: torch.Generator().manual_seed(draw), 4: torch.Generator().manual_seed(draw + 100)}
            if holder is ours:
                module.apply_top_k_top_p_pytorch = spy
            try:
                out.append(holder.topk_topp_sampler(logits.clone(), gens, k, p)[0])
            finally:
                module.apply_top_k_top_p_pytorch = original
        assert torch.equal(got[0], want[0]), draw
    assert not sorts


def test_on_cuda_the_filters_stay_vllms() -> None:
    """Off CPU (Triton there) the wrapper hands vLLM's sampler the filters untouched:
    under FakeTensorMode on a ``cuda`` device, no top-k slice runs and k, p pass on."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    seen = []

    class Inner(torch.nn.Module):
        def forward(self, logits, generators, k, p):
            seen.append((k is not None, p is not None, logits.device.type))
            return logits.argmax(dim=-1), None

    holder = torch.nn.Module()
    holder.topk_topp_sampler = Inner()
    filter_without_sort(holder)
    with FakeTensorMode(allow_non_fake_inputs=False):
        logits = torch.empty(4, 1000, device="cuda")
        k, p = torch.full((4,), 40, device="cuda"), torch.full((4,), 0.9, device="cuda")
        holder.topk_topp_sampler(logits, {}, k, p)
    assert seen == [(True, True, "cuda")]
