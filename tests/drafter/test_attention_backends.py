"""The drafter's attention plumbing on the three CUDA backends vLLM picks for it --
FlashAttention (SM80/SM90), Triton, FlashInfer (Blackwell, or head sizes FlashAttention
lacks) -- on a fake ``cuda`` device, with vLLM's real backend classes, attention layers,
metadata builders and planning code.

Each case builds what ``DraftModel`` builds (block size, pool layout, metadata
builders) with the runtime's own functions, while the *target's* config is vLLM's
current config (as inside a worker) and the target's head size differs from the
drafter's, then plans a forward wider than the largest CUDA graph (``slrs``'s tree
nodes and new requests' catch-ups are such forwards). It checks:

- every backend call saw the drafter's config, never the target's;
- the pool's block size is one the backend takes (no 1,024-token pages);
- the forward plans without error, and with no device-to-host read (FlashInfer reads
  the lengths back unless the host's copy is handed to it);
- FlashInfer is planned with the drafter's heads, head size and page size.

What cannot run here: the kernels. FlashInfer's package (CUDA only) is replaced by a
recorder of its plans (``tests/_flashinfer_stub.py``), and its page-index Triton kernel
by a no-op launch.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

import _flashinfer_stub
from _device_traffic import DeviceTraffic
from vllm_hetero_spec.drafter.runtime.attention import (
    attention_groups, common_metadata, draft_block_size, step_metadata)
from vllm_hetero_spec.drafter.runtime.input_staging import StagedInputs
from vllm_hetero_spec.drafter.runtime.kv_layout import allocate_layer_caches
from vllm_hetero_spec.drafter.runtime.model import RuntimeConfig, draft_vllm_config

CUDA = torch.device("cuda")
GRAPH_SIZES = (1, 2, 4, 8)
ROWS = 40  # > the largest graph size
HEADS, KV_HEADS, HEAD_SIZE = 9, 3, 64  # SmolLM2-135M; the target (Gemma-3-270M) has 256
PREFIX = "hetero_draft.model.layers.{}.self_attn.attn"


def _backend(name: str, monkeypatch: pytest.MonkeyPatch) -> type:
    if name == "FLASH_ATTN":
        from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
        return FlashAttentionBackend
    if name == "TRITON_ATTN":
        from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
        return TritonAttentionBackend
    _flashinfer_stub.install()
    import vllm.utils.flashinfer as flashinfer_utils
    import vllm.v1.attention.backends.flashinfer as flashinfer_backend

    # No network probe for kernel downloads; the page-index kernel is Triton's.
    monkeypatch.setattr(flashinfer_utils, "has_nvidia_artifactory", lambda: False)
    monkeypatch.setattr(flashinfer_backend, "_copy_page_indices_kernel", _NoLaunch())
    return flashinfer_backend.FlashInferBackend


class _NoLaunch:
    """A Triton kernel's ``kernel[grid](...)`` that launches nothing."""

    def __getitem__(self, grid: tuple) -> object:
        return lambda *args, **kwargs: None


def _spy_current_config(monkeypatch: pytest.MonkeyPatch, backend: type, seen: list) -> None:
    """Record vLLM's current config at every backend entry point the drafter reaches."""
    from vllm.config import get_current_vllm_config_or_none

    builder = backend.get_builder_cls()
    for owner, name in [(builder, "__init__"), (builder, "build"), (backend, "get_supported_kernel_block_sizes")]:
        static = isinstance(inspect.getattr_static(owner, name), (staticmethod, classmethod))
        func = getattr(owner, name)  # bound to the class when it is a class or static method

        def spy(*args, _func=func, _name=name, **kwargs):
            seen.append((_name, get_current_vllm_config_or_none()))
            return _func(*args, **kwargs)

        monkeypatch.setattr(owner, name, staticmethod(spy) if static else spy)


def _staged(block_size: int, width: int) -> tuple[StagedInputs, StagedInputs, int]:
    """A forward of ``ROWS`` rows: most one token (tree nodes), some a catch-up of
    several (new requests), at contexts of 30 to 500 tokens."""
    rng = np.random.default_rng(0)
    n = np.where(np.arange(ROWS) % 8 == 0, 5, 1).astype(np.int64)
    starts = rng.integers(30, 500, ROWS)
    t = int(n.sum())
    qsl = np.concatenate([[0], np.cumsum(n)]).astype(np.int32)
    seq_lens = (starts + n).astype(np.int32)
    table = np.arange(ROWS * width, dtype=np.int32).reshape(ROWS, width)
    host = StagedInputs(np.zeros(t, np.int64), np.zeros(t, np.int64), np.zeros(t, np.int64),
                        (qsl[1:] - 1).astype(np.int64), qsl, seq_lens, table)
    dev = StagedInputs(*(torch.empty(a.shape, dtype=torch.from_numpy(a).dtype, device=CUDA)
                         for a in (host.ids, host.positions, host.slots, host.last, qsl, seq_lens, table)))
    return host, dev, int(n.max())


@pytest.mark.parametrize("backend_name", ["FLASH_ATTN", "TRITON_ATTN", "FLASHINFER"])
def test_drafter_attention_under_its_own_config(
    backend_name: str, smollm2: str, gemma: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention

    backend = _backend(backend_name, monkeypatch)
    draft = draft_vllm_config(RuntimeConfig(smollm2, torch.bfloat16, graph_sizes=GRAPH_SIZES, max_forward_tokens=64))
    target = draft_vllm_config(RuntimeConfig(gemma, torch.bfloat16))
    assert target.model_config.get_head_size() != HEAD_SIZE
    with set_current_vllm_config(draft):  # as get_model builds the drafter's layers
        layers = {PREFIX.format(i): Attention(HEADS, HEAD_SIZE, HEAD_SIZE ** -0.5, KV_HEADS,
                                              cache_config=draft.cache_config, prefix=PREFIX.format(i),
                                              attn_backend=backend) for i in range(3)}
    seen: list = []
    _spy_current_config(monkeypatch, backend, seen)
    plans = _flashinfer_stub.install().plans
    plans.clear()

    with set_current_vllm_config(target):  # a worker's current config is the target's
        specs = {name: layer.get_kv_cache_spec(draft) for name, layer in layers.items()}
        backends = {name: layer.get_attn_backend() for name, layer in layers.items()}
        block_size = draft_block_size(draft, specs, backends)
        specs = {name: spec.copy_with_new_block_size(block_size) for name, spec in specs.items()}
        allocate_layer_caches(draft, specs, backends.values(), 8, torch.device("meta"))  # resolves the layout
        width = 500 // block_size + 2
        probe = DeviceTraffic(lambda shape, dtype: torch.zeros(shape, dtype=dtype))
        with FakeTensorMode(allow_non_fake_inputs=True), probe:
            groups = attention_groups(draft, specs, backends, CUDA)
            host, dev, max_query = _staged(block_size, width)
            with unset_fake_temporarily():  # its host tensors are real, as on a GPU machine
                common = common_metadata(host, dev, int(host.query_start_loc[-1]), max_query)
            metadata = step_metadata(draft, groups, common, draft_index=1)
        traffic = probe.reset()

    assert max(GRAPH_SIZES) < ROWS <= draft.scheduler_config.max_num_seqs
    assert block_size == 16, block_size  # the smallest page all three take
    assert set(metadata) == set(layers)
    assert traffic.d2h == 0, traffic.where
    assert seen and all(config is draft for _, config in seen), [name for name, c in seen if c is not draft]
    if backend_name == "FLASHINFER":
        assert plans, "FlashInfer was never planned"
        for _, plan in plans:
            assert (plan["num_qo_heads"], plan["num_kv_heads"]) == (HEADS, KV_HEADS)
            assert plan.get("head_dim", plan.get("head_dim_qk")) == HEAD_SIZE
            assert plan.get("page_size", plan.get("page_size")) == block_size
