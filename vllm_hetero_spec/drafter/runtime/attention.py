"""The drafter's attention plumbing, chosen and built under the drafter's own ``VllmConfig``.

vLLM's backends read the *current* config while they pick a block size, build their
metadata builders and plan a step (FlashInfer sizes its page table by
``max_num_seqs``, and advertises 1,024-token pages on SM100 from the current model's
head counts). Inside a worker the current config is the target's, so every call here
runs under ``set_current_vllm_config(drafter's config)``: the drafter's head sizes,
block size and batch limits, never the target's.

The pool's block size is a kernel block size every backend accepts under that config,
checked with vLLM's own ``select_common_block_size``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from vllm_hetero_spec.drafter.runtime.input_staging import StagedInputs


def draft_block_size(vllm_config: Any, specs: Mapping[str, Any], backends: Mapping[str, type]) -> int:
    """The pool's block size: the smallest size every layer's backend takes as a
    kernel block under ``vllm_config`` (vLLM's ``select_common_block_size`` accepts it
    as is). Small, because a fork that writes into a shared block copies the whole
    block in every layer (``slrs``'s tree nodes, the pipeline's branches), and a
    sequence's last block is mostly empty; the target's cache block size is tuned for
    its prefix cache instead (128 tokens on CPU)."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.worker.utils import select_common_block_size

    names = sorted(specs)
    layer_backends, layer_specs = [backends[n] for n in names], [specs[n] for n in names]
    with set_current_vllm_config(vllm_config):
        sizes = sorted({size.base if isinstance(size, MultipleOf) else int(size)
                        for backend, spec in zip(layer_backends, layer_specs)
                        for size in backend.get_supported_kernel_block_sizes(spec)} or {16})
        for size in sizes:
            try:
                if select_common_block_size(size, layer_backends, layer_specs) == size:
                    return size
            except ValueError:
                continue
    raise ValueError(f"the drafter's attention backends share no block size: "
                     f"{sorted({b.get_name() for b in layer_backends})}")


def attention_groups(vllm_config: Any, specs: Mapping[str, Any], backends: Mapping[str, type],
                     device: torch.device) -> list[Any]:
    """One vLLM ``AttentionGroup`` per distinct (backend, spec kind, window), e.g.
    Gemma-3's sliding and global layers, each with its metadata builder made under
    ``vllm_config``, as ``LLMBaseProposer.initialize_attn_backend`` groups vLLM's own
    draft layers. ``specs`` are at the pool's block size."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.utils import AttentionGroup

    groups: dict[tuple, AttentionGroup] = {}
    for name in sorted(specs):
        spec, backend = specs[name], backends[name]
        key = (backend.full_cls_name(), type(spec).__name__, getattr(spec, "sliding_window", None))
        if key in groups:
            groups[key].layer_names.append(name)
        else:
            groups[key] = AttentionGroup(backend=backend, layer_names=[name], kv_cache_spec=spec,
                                         kv_cache_group_id=len(groups))
    with set_current_vllm_config(vllm_config):
        for group in groups.values():
            group.create_metadata_builders(vllm_config, device)
    return list(groups.values())


def common_metadata(host: StagedInputs[np.ndarray], dev: StagedInputs[torch.Tensor], num_tokens: int,
                    max_query_len: int) -> Any:
    """vLLM's ``CommonAttentionMetadata`` for one forward staged in ``host`` / ``dev``.

    The host lengths go with it (``query_start_loc_cpu``, and
    ``seq_lens_cpu_upper_bound``, exact here), so no backend reads them back from the
    device (FlashInfer would, once per forward). They are copies: a backend may hand
    them to an asynchronous upload of its own, and the staging buffers are rewritten
    as soon as the drafter's own uploads are done."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    return CommonAttentionMetadata(
        query_start_loc=dev.query_start_loc,
        query_start_loc_cpu=torch.from_numpy(host.query_start_loc.copy()),
        seq_lens=dev.seq_lens,
        num_reqs=host.seq_lens.shape[0],
        num_actual_tokens=num_tokens,
        max_query_len=max_query_len,
        max_seq_len=int(host.seq_lens.max()),
        block_table_tensor=dev.block_table,
        slot_mapping=dev.slots,
        positions=dev.positions,
        seq_lens_cpu_upper_bound=torch.from_numpy(host.seq_lens.copy()),
    )


def step_metadata(vllm_config: Any, groups: list[Any], common: Any, draft_index: int) -> dict[str, Any]:
    """Per layer name, its backend's metadata for one forward, ``common`` being vLLM's
    ``CommonAttentionMetadata`` for it (with ``seq_lens_cpu_upper_bound`` set, so no
    backend reads the lengths back from the device)."""
    from vllm.config import set_current_vllm_config

    metadata: dict[str, Any] = {}
    with set_current_vllm_config(vllm_config):
        for group in groups:
            built = group.get_metadata_builder().build_for_drafting(common, draft_index)
            metadata.update({name: built for name in group.layer_names})
    return metadata
