"""The CPU build's broken ``expand_batch_to_tokens`` (T > 0 garbage) is fixed by the plugin."""

import torch
from vllm.platforms.cpu import CpuPlatform
from vllm.v1.sample import rejection_sampler

import vllm_hetero_spec


def _expected(x: torch.Tensor, counts: list[int], replace_from: float, replace_to: float) -> torch.Tensor:
    vals = [replace_to if float(v) == replace_from else float(v) for v in x]
    return torch.tensor([v for v, n in zip(vals, counts) for _ in range(n)], dtype=x.dtype)


def test_expand_batch_to_tokens_is_correct_with_plugin_on_cpu() -> None:
    # What the CPU worker does at start-up: native C++ fallbacks for the Triton kernels.
    CpuPlatform.register_triton_kernel_overrides()
    vllm_hetero_spec.register()
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        b = int(torch.randint(1, 9, (1,), generator=gen))
        counts = torch.randint(0, 6, (b,), generator=gen).tolist()
        x = torch.rand(b, generator=gen) + 0.1
        x[0] = 0.0  # a greedy row: temperature 0 must be replaced by 1
        cu = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32)
        out = rejection_sampler.expand_batch_to_tokens(x, cu, sum(counts), replace_from=0, replace_to=1)
        assert torch.equal(out, _expected(x, counts, 0.0, 1.0))


def test_sampling_constraints_use_each_requests_temperature() -> None:
    """The path vLLM's rejection sampler takes at T > 0: logits / per-request temperature."""
    CpuPlatform.register_triton_kernel_overrides()
    vllm_hetero_spec.register()
    from vllm.v1.sample.metadata import SamplingMetadata

    temps = torch.tensor([0.5, 2.0])
    logits = torch.randn(5, 7)
    cu = torch.tensor([2, 5], dtype=torch.int32)
    meta = SamplingMetadata.__new__(SamplingMetadata)
    meta.all_greedy, meta.temperature, meta.top_k, meta.top_p = False, temps, None, None
    out = rejection_sampler.apply_sampling_constraints(logits.clone(), cu, meta)
    expected = logits / torch.tensor([0.5, 0.5, 2.0, 2.0, 2.0]).unsqueeze(1)
    assert torch.allclose(out, expected)
