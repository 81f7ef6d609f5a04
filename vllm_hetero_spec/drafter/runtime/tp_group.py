"""The drafter's tensor-parallel group of one rank, and the scoped swap that makes it
vLLM's TP group while the drafter is built and run.

It sits below both ``drafter/runtime/model.py`` (which uses it) and ``vllm_integration/``
(whose proposer imports the runtime): the swap is not a patch of vLLM's code but a
scoped change of one of its globals, restored on exit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


@contextlib.contextmanager
def tensor_parallel_group(group: Any) -> Iterator[None]:
    """Make ``group`` vLLM's tensor-parallel group inside the block.

    Why: vLLM's parallel layers read the global TP group (``parallel_state._TP``) when
    they are built (to shard weights) and the logits processor when it runs (to gather
    logits). Our drafter runs whole on TP rank 0 instead of sharded: a small draft
    model gains nothing from a per-layer all-reduce, and its head counts need not divide
    by the target's TP size (SmolLM2 has 9 heads). So it is built and run with a TP
    group of one rank (``drafter/runtime/model.py``). Targets vLLM 0.32.0's
    ``vllm.distributed.parallel_state``; restored on exit, also on error.
    """
    from vllm.distributed import parallel_state

    saved = parallel_state._TP
    parallel_state._TP = group
    try:
        yield
    finally:
        parallel_state._TP = saved


def _worker_group(vllm_config: Any) -> Any | None:
    """Inside a vLLM worker, the drafter's one-rank TP group; None outside one. With a
    TP target every rank creates (collectively, in the same order) one single-rank group
    per rank: rank 0 drafts with its own, the others create theirs only for the
    collective (:func:`join_draft_tp_group`)."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return None
    tp = parallel_state.get_tp_group()
    if tp.world_size == 1:
        return tp
    world = parallel_state.get_world_group()
    ranks = [[r] for r in range(world.world_size)]
    with set_current_vllm_config(vllm_config):
        return parallel_state.init_model_parallel_group(
            ranks, world.local_rank, torch.distributed.get_backend(world.device_group),
            use_device_communicator=False, group_name="hetero_draft_tp",
        )


def join_draft_tp_group(vllm_config: Any) -> None:
    """On a TP rank that does not draft: take part in creating the drafter's groups,
    which torch.distributed makes collectively (``vllm_integration/proposer.py``); nothing outside a worker."""
    _worker_group(vllm_config)


def draft_tp_group(vllm_config: Any) -> Any:
    """A tensor-parallel group of one rank for the drafter, which runs whole.

    vLLM's layers need its model-parallel groups. Inside a vLLM worker they exist (see
    :func:`_worker_group`). In a standalone process (a Ray actor, a test, a benchmark)
    we create a world of one and use its TP group."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state
    from vllm.utils.network_utils import get_open_port

    group = _worker_group(vllm_config)
    if group is not None:
        return group
    if vllm_config.device_config.device.type == "cpu":
        # What vLLM's CPU worker does at start: torch.accelerator calls become no-ops
        # (the model loader calls empty_cache, which raises without an accelerator).
        from vllm.v1.worker.cpu_model_runner import _set_torch_accelerator_to_noop

        _set_torch_accelerator_to_noop()
    with set_current_vllm_config(vllm_config):
        parallel_state.init_distributed_environment(
            world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{get_open_port()}", local_rank=0,
            backend="gloo",
        )
        parallel_state.ensure_model_parallel_initialized(1, 1)
    return parallel_state.get_tp_group()
