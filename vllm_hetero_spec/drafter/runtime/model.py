"""The draft model on vLLM's own machinery: vLLM's model class, weights loader,
attention backend and metadata builder, with a paged KV pool of the plugin's own.

What vLLM provides, we use: ``get_model`` builds the drafter from vLLM's model registry
(any architecture vLLM serves can draft, with vLLM's prepacked matmuls and fused
kernels) on the target's device, and every step runs as one variable-length forward
through the platform's attention backend, with metadata from that backend's builder --
the way ``vllm/v1/spec_decode/llm_base_proposer.py`` runs vLLM's own draft models.

What it cannot provide is the KV cache: vLLM addresses every KV group with the target's
block table, and our drafter's positions differ from the target's. So the drafter gets a
private ``VllmConfig`` (its own compilation config, hence its own
``static_forward_context``: vLLM never sees its layers when it sizes, allocates or
binds its KV cache), and a bounded pool of blocks (``drafter/runtime/paged_kv.py``) allocated
here, in the layout the backend reads, and bound to its layers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from vllm_hetero_spec.drafter.runtime.attention import (
    attention_groups, common_metadata, draft_block_size, step_metadata)
from vllm_hetero_spec.drafter.runtime.config import RuntimeConfig
from vllm_hetero_spec.drafter.runtime.cuda_graphs import DraftGraphs, graph_compilation_config
from vllm_hetero_spec.drafter.runtime.draft_head import DraftHead, draft_head
from vllm_hetero_spec.drafter.runtime.input_staging import InputStaging
from vllm_hetero_spec.drafter.runtime.kv_layout import allocate_layer_caches
from vllm_hetero_spec.drafter.runtime.paged_kv import BlockPool, PagedCache, PoolExhausted, TokenTree
from vllm_hetero_spec.drafter.runtime.tp_group import draft_tp_group, tensor_parallel_group
from vllm_hetero_spec.host_to_device import to_device
from vllm_hetero_spec.log import plugin_logger
from vllm_hetero_spec.vocab.frequent_tokens import head_ids, read_tokenizer

_PREFIX = "hetero_draft"
logger = plugin_logger(__name__)


def draft_engine_args(cfg: RuntimeConfig):
    """vLLM's ``EngineArgs`` for the drafter alone: its model as named (a Hub id is
    fetched by vLLM's loader at the config's revision, into its download folder), the
    draft-model keys (``cfg.load``) and the runtime's sizes. The start-up check
    (``vllm_integration/startup_checks.py``) builds the drafter's ``ModelConfig`` from these same arguments, so
    a key vLLM refuses (a quantization the checkpoint or platform lacks, a length past
    the model's) fails there, naming it, and not in a worker."""
    from vllm.engine.arg_utils import EngineArgs

    load = cfg.load
    extra = {"moe_backend": load.moe_backend} if load.moe_backend else {}
    return EngineArgs(
        model=cfg.model,
        revision=load.revision,
        code_revision=load.code_revision,
        quantization=load.quantization,
        trust_remote_code=load.trust_remote_code,
        download_dir=load.download_dir,
        load_format=load.load_format,
        dtype=str(cfg.dtype).removeprefix("torch."),
        max_model_len=cfg.max_model_len,
        enforce_eager=not cfg.graph_sizes,
        compilation_config=graph_compilation_config(cfg.graph_sizes),
        skip_tokenizer_init=True,
        enable_prefix_caching=False,
        max_num_batched_tokens=cfg.max_forward_tokens,
        max_num_seqs=cfg.max_forward_tokens,
        attention_backend=cfg.attention_backend,
        **extra,
    )


def draft_vllm_config(cfg: RuntimeConfig):
    """A complete ``VllmConfig`` for the drafter alone, with its own compilation config,
    so its attention layers register in a ``static_forward_context`` vLLM's runner
    never reads. Compiled with piecewise CUDA graphs when ``cfg.graph_sizes`` asks
    (CUDA: ``drafter/runtime/cuda_graphs.py``), else eager: on CPU vLLM's compile path
    (``DYNAMO_TRACE_ONCE`` + inductor) ran no faster (the forward is memory-bound) and
    added a long compile to start-up (docs/drafter.md, "What is ours, and why":
    Evidence). A compiled drafter's token budget is ``max_forward_tokens``:
    vLLM compiles for token counts up to its ``max_num_batched_tokens`` and refuses a
    larger forward. Its ``max_num_seqs`` is the same cap: the most rows a forward holds
    (``slrs``'s tree nodes are rows of one token each), which backends size their
    per-row buffers by (FlashInfer refuses a wider batch)."""
    return draft_engine_args(cfg).create_engine_config()


class DraftModel:
    """Loads the draft model with vLLM and runs packed forwards over paged sequences."""

    def __init__(self, cfg: RuntimeConfig):
        from vllm.compilation.backends import set_model_tag
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
        from vllm.model_executor.model_loader import get_model

        self.cfg = cfg
        self.vllm_config = draft_vllm_config(cfg)
        self.tp_group = draft_tp_group(self.vllm_config)
        self.device = torch.device(self.vllm_config.device_config.device)
        with set_current_vllm_config(self.vllm_config), set_model_tag(_PREFIX), tensor_parallel_group(self.tp_group):
            try:
                self.model = get_model(vllm_config=self.vllm_config, prefix=_PREFIX)
            except Exception as err:
                if not cfg.load.quantization:
                    raise
                raise RuntimeError(
                    f"hetero spec: the drafter's 'quantization' = {cfg.load.quantization!r} did not load on "
                    f"{self.device.type} ({type(err).__name__}: {err}); vLLM's build for this platform may lack "
                    "its kernels: choose a method it runs, or drop 'quantization'") from err
        self.model.eval()
        layers = {
            name: layer
            for name, layer in self.vllm_config.compilation_config.static_forward_context.items()
            if isinstance(layer, AttentionLayerBase)
        }
        self.layer_names = sorted(layers)
        self.staging = InputStaging(self.device)
        self.graphs = DraftGraphs(self.vllm_config, self.device)
        self.vocab_size = self.vllm_config.model_config.get_vocab_size()
        self.max_len = self.vllm_config.model_config.max_model_len
        self.head = self._head()
        self._build_pool(layers)

    def _head(self) -> DraftHead | None:
        """The output layer over ``cfg.head_tokens`` tokens (``None``: the model's own;
        where a subset was asked and cannot be had, a warning says why)."""
        if not self.cfg.head_tokens:
            return None
        tokenizer = read_tokenizer(self.cfg.tokenizer or self.cfg.model)
        if tokenizer is None:  # without its tokenizer.json the added tokens (end of turn) are unknown
            head, why = None, "no tokenizer.json to rank its tokens and find its added ones"
        else:
            ids = head_ids(tokenizer, self.cfg.head_tokens, self.vocab_size).tolist()
            head, why = draft_head(self.model, to_device(ids, torch.long, self.device), self.vocab_size)
        if head is None:
            logger.warning("hetero spec: draft_head_tokens: the drafter keeps its whole output layer: %s", why)
        return head

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``[rows, vocab]`` of the hidden states ``[rows, hidden]``."""
        if self.head is not None:
            return self.head(hidden)
        return self.model.compute_logits(hidden).float()

    # -- KV pool ----------------------------------------------------------------------

    def _build_pool(self, layers: dict) -> None:
        """Allocate the pool (one tensor per layer, laid out as vLLM lays out a KV cache
        for these backends: ``drafter/runtime/kv_layout.py``), bind it, and build the
        metadata builders, all under the drafter's own config
        (``drafter/runtime/attention.py``)."""
        specs = {name: layers[name].get_kv_cache_spec(self.vllm_config) for name in self.layer_names}
        backends = {name: layers[name].get_attn_backend() for name in self.layer_names}
        block_size = draft_block_size(self.vllm_config, specs, backends)
        specs = {n: s.copy_with_new_block_size(block_size) for n, s in specs.items()}
        per_block = sum(s.page_size_bytes for s in specs.values())
        num_blocks = max(1, (self.cfg.kv_pool_mb << 20) // per_block)
        self.pool = BlockPool(num_blocks, block_size, per_block)
        self.pool.copy_blocks = self._copy_blocks
        caches = allocate_layer_caches(self.vllm_config, specs, backends.values(), num_blocks, self.device)
        self.kv: list[torch.Tensor] = []
        for name in self.layer_names:
            layers[name].bind_kv_cache(caches[name])
            self.kv.append(caches[name])
        self.groups = attention_groups(self.vllm_config, specs, backends, self.device)

    def _copy_blocks(self, src: list[int], dst: list[int]) -> None:
        s = to_device(src, torch.long, self.device)
        d = to_device(dst, torch.long, self.device)
        for kv in self.kv:
            kv.index_copy_(0, d, kv.index_select(0, s))

    def new_cache(self) -> PagedCache:
        return PagedCache(self.pool)

    # -- forwards ---------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, caches: list[PagedCache], new_tokens: list[list[int]]) -> torch.Tensor:
        """Append ``new_tokens[i]`` to ``caches[i]`` (each non-empty) in one forward and
        return the float32 logits ``[len(caches), vocab]`` at each one's last new token.
        Raises :class:`PoolExhausted` before running when the pool cannot hold them."""
        lengths = [len(t) for t in new_tokens]
        if not all(lengths):
            raise ValueError("every request needs at least one new token (its logits come from the last one)")
        cap = self.cfg.max_forward_tokens
        if len(caches) > cap:  # e.g. slrs's tree nodes: one token each, more than a forward takes
            return torch.cat([self.forward(caches[i : i + cap], new_tokens[i : i + cap])
                              for i in range(0, len(caches), cap)])
        if sum(lengths) > cap:
            new_tokens = self._feed_prefixes(caches, new_tokens)
            lengths = [len(t) for t in new_tokens]
        return self._forward(caches, lengths, [t for toks in new_tokens for t in toks], None, 0)

    def _feed_prefixes(self, caches: list[PagedCache], new_tokens: list[list[int]]) -> list[list[int]]:
        """Feed leading tokens in forwards of at most ``max_forward_tokens`` (no logits)
        until the rest fits one forward, and return the rest: every request keeps at
        least its last token, whose logits the caller wants."""
        cap = self.cfg.max_forward_tokens
        rest = [list(t) for t in new_tokens]
        while sum(map(len, rest)) > cap and any(len(r) > 1 for r in rest):
            take, room = [], cap
            for r in rest:
                take.append(min(len(r) - 1, room))
                room -= take[-1]
            rows = [i for i, n in enumerate(take) if n]
            self._forward([caches[i] for i in rows], [take[i] for i in rows],
                          [tok for i in rows for tok in rest[i][: take[i]]], None, 0, logits=False)
            rest = [r[n:] for r, n in zip(rest, take)]
        return rest

    @torch.inference_mode()
    def forward_next(self, caches: list[PagedCache], ids: torch.Tensor, draft_index: int) -> torch.Tensor:
        """Append one token per cache, ``ids`` ``[len(caches)]`` already on the device
        (the previous draft position's samples: they never visit the host), and return
        the logits as :meth:`forward` does. ``draft_index`` is the draft position, for the
        backend's drafting metadata path."""
        return self._forward(caches, [1] * len(caches), None, ids, draft_index)

    def _forward(
        self, caches: list[PagedCache], lengths: list[int], ids: list[int] | None, device_ids: torch.Tensor | None,
        draft_index: int, logits: bool = True,
    ) -> torch.Tensor | None:
        for cache, n in zip(caches, lengths):
            cache.reserve(cache.length + n)
        out = self._run(caches, lengths, ids, device_ids, draft_index, logits)
        for cache, n in zip(caches, lengths):
            cache.advance(n)
        return out

    def _run(
        self, caches: list[PagedCache], lengths: list[int], ids: list[int] | None, device_ids: torch.Tensor | None,
        draft_index: int, logits: bool = True,
    ) -> torch.Tensor | None:
        """One variable-length forward. Its integer inputs are written into the
        persistent host staging buffers in one numpy pass and reach the device in two
        copies (:class:`InputStaging`); the token ids come from the host (``ids``) or are
        already on the device (``device_ids``). A forward a graph bucket holds is padded
        to it and reads its ids and positions from the graphs' persistent buffers
        (:class:`DraftGraphs`)."""
        from vllm.config import CUDAGraphMode
        from vllm.forward_context import set_forward_context

        bs = self.pool.block_size
        b, t = len(caches), sum(lengths)
        width = max(len(c.blocks) for c in caches)
        host = self.staging.host(t, b, width)
        starts = np.fromiter((c.length for c in caches), dtype=np.int64, count=b)
        n = np.asarray(lengths, dtype=np.int64)
        host.query_start_loc[0] = 0
        np.cumsum(n, out=host.query_start_loc[1:])
        qsl = host.query_start_loc.astype(np.int64)
        host.positions[:] = np.repeat(starts - qsl[:-1], n) + np.arange(t)
        host.block_table.fill(0)
        for i, c in enumerate(caches):
            host.block_table[i, : len(c.blocks)] = c.blocks
        row = np.repeat(np.arange(b), n)
        host.slots[:] = host.block_table[row, host.positions // bs] * bs + host.positions % bs
        host.seq_lens[:] = starts + n
        host.last[:] = qsl[1:] - 1
        if ids is not None:
            host.ids[:] = ids
        dev = self.staging.upload()
        input_ids = dev.ids if device_ids is None else device_ids
        mode, batch = self.graphs.dispatch(t)
        positions, slots = dev.positions, dev.slots
        if mode != CUDAGraphMode.NONE:
            input_ids, positions, slots = self.graphs.stage(input_ids, positions, slots, batch.num_tokens)
        cam = common_metadata(host, dev, t, int(n.max()))
        metadata = step_metadata(self.vllm_config, self.groups, cam, draft_index)
        with set_forward_context(
            metadata, self.vllm_config, num_tokens=batch.num_tokens, cudagraph_runtime_mode=mode,
            batch_descriptor=batch, slot_mapping={name: slots for name in self.layer_names},
        ), tensor_parallel_group(self.tp_group):
            hidden = self.model(input_ids=input_ids, positions=positions)
            return self._logits(hidden.index_select(0, dev.last)) if logits else None

    @torch.inference_mode()
    def dummy_logits(self, num_tokens: int, num_rows: int) -> torch.Tensor:
        """The drafter's largest forward, for vLLM's memory profile: ``num_tokens``
        tokens (capped as every forward is) and the float32 logits ``[num_rows, vocab]``
        (more rows than tokens are gathered in forwards of at most ``max_forward_tokens``
        rows, as :meth:`forward` runs them). No attention metadata, so attention layers
        skip and no KV is written, as in vLLM's own dummy runs."""
        from vllm.forward_context import set_forward_context

        n = min(num_tokens, self.cfg.max_forward_tokens)
        ids = torch.zeros(n, dtype=torch.int64, device=self.device)
        with set_forward_context(None, self.vllm_config, num_tokens=n, slot_mapping={}), \
                tensor_parallel_group(self.tp_group):
            hidden = self.model(input_ids=ids, positions=ids)
            parts = [self._logits(hidden.narrow(0, 0, min(n, num_rows - start))) for start in range(0, num_rows, n)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    @torch.inference_mode()
    def capture_graphs(self, warmups: int = 1) -> int:
        """Capture a graph per bucket (:meth:`DraftGraphs.capture_plan`), as vLLM's
        runner captures its own: inside vLLM's ``graph_capture`` context (a side stream),
        with capturing allowed for the duration, ``warmups`` eager runs before each
        capture, and no attention metadata (attention layers skip, as in vLLM's dummy
        runs). One eager run at the largest bucket comes first, outside the capture
        context: it compiles the model if the profile run has not. Returns how many
        graphs were captured (0 when graphs are off)."""
        from vllm.compilation import monitor
        from vllm.config import CUDAGraphMode
        from vllm.distributed.parallel_state import graph_capture

        plan = self.graphs.capture_plan()
        if not plan:
            return 0
        allowed = monitor.cudagraph_capturing_enabled
        monitor.set_cudagraph_capturing_enabled(True)
        try:
            with tensor_parallel_group(self.tp_group):
                self._dummy(plan[0][1], CUDAGraphMode.NONE)
                with graph_capture(device=self.device):
                    for mode, batch in plan:
                        for run_mode in [CUDAGraphMode.NONE] * warmups + [mode]:
                            self._dummy(batch, run_mode)
        finally:
            monitor.set_cudagraph_capturing_enabled(allowed)
        return len(plan)

    @torch.inference_mode()
    def graph_memory(self) -> int:
        """The bytes the drafter's CUDA graphs take, measured as vLLM's runner measures
        its own before sizing the KV cache (``profile_cudagraph_memory``): every bucket
        captured into a temporary pool, the device's free memory compared before and
        after, the graphs then dropped (they are captured for good in the capture
        phase). 0 when graphs are off. Must run where every other graph is cleared
        (right after vLLM's own estimate), since it clears them all."""
        from vllm.compilation.counter import compilation_counter
        from vllm.compilation.cuda_graph import CUDAGraphWrapper
        from vllm.config import CUDAGraphMode
        from vllm.platforms import current_platform

        plan = self.graphs.capture_plan()
        if not plan:
            return 0
        with tensor_parallel_group(self.tp_group):
            self._dummy(plan[0][1], CUDAGraphMode.NONE)  # compiled, so the graph wrappers exist
        wrappers = list(CUDAGraphWrapper._all_instances)
        pools = {id(w): w.graph_pool for w in wrappers}
        pool = current_platform.graph_pool_handle()
        captured = compilation_counter.num_cudagraph_captured
        for wrapper in wrappers:
            wrapper.graph_pool = pool
        try:
            torch.accelerator.synchronize()
            torch.accelerator.empty_cache()
            free_before = torch.accelerator.get_memory_info()[0]
            self.capture_graphs(warmups=1)
            torch.accelerator.synchronize()
            used = free_before - torch.accelerator.get_memory_info()[0]
        finally:
            CUDAGraphWrapper.clear_all_graphs()
            for wrapper in wrappers:
                wrapper.graph_pool = pools[id(wrapper)]
            compilation_counter.num_cudagraph_captured = captured
        return max(used, 0)

    def _dummy(self, batch: Any, mode: Any) -> None:
        """One forward of ``batch.num_tokens`` tokens on the graph buffers, in ``mode``,
        without attention metadata."""
        from vllm.forward_context import set_forward_context

        n = batch.num_tokens
        with set_forward_context(None, self.vllm_config, num_tokens=n, cudagraph_runtime_mode=mode,
                                 batch_descriptor=batch, slot_mapping={}):
            self.model(input_ids=self.graphs.input_ids.narrow(0, 0, n), positions=self.graphs.positions.narrow(0, 0, n))

    @torch.inference_mode()
    def grow_trees(
        self, caches: list[PagedCache], trees: list[TokenTree], parents: list[list[int]], tokens: list[list[int]]
    ) -> list[torch.Tensor]:
        """Add ``tokens[i]`` under ``parents[i]`` to ``trees[i]`` (see
        :meth:`TokenTree.grow`; each non-empty) in one forward, and return per tree the
        float32 logits ``[len(tokens[i]), vocab]`` at the new nodes. The contexts'
        caches are unchanged. Raises :class:`PoolExhausted` when the pool cannot hold
        the new nodes' blocks."""
        nodes: list[PagedCache] = []
        for tree, par, cache in zip(trees, parents, caches):
            if tree.root is not cache:
                raise ValueError("a token tree must hang from its own cache")
            nodes += tree.grow(par)
        logits = self.forward(nodes, [[tok] for toks in tokens for tok in toks])
        out, start = [], 0
        for toks in tokens:
            out.append(logits.narrow(0, start, len(toks)))
            start += len(toks)
        return out


__all__ = ["DraftModel", "PagedCache", "PoolExhausted", "RuntimeConfig", "TokenTree"]
