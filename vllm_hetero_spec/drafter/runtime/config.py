"""The drafter's concrete runtime config, and the one place its ``auto`` settings resolve.

``draft_dtype``, ``draft_kv_pool_mb`` and ``draft_cuda_graphs`` may each be ``auto``,
whose meaning depends on the target engine (its dtype, batch, memory and graph capture)
and on where the drafter runs; ``draft_head_tokens`` is checked against the drafter's
tokenizer. :func:`resolve_runtime_config` turns them into one
:class:`RuntimeConfig`, with the reason for each choice, once per engine: the proposer
calls it when it loads the drafter and hands the result to wherever drafting runs;
a drafter built outside an engine (benchmarks, tests) calls it without a target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from vllm_hetero_spec.config import HeteroConfigError, HeteroSettings
from vllm_hetero_spec.drafter.runtime.cuda_graphs import resolve_graph_sizes
from vllm_hetero_spec.drafter.runtime.draft_dtype import cpu_flags, platform_device_type, resolve_draft_dtype
from vllm_hetero_spec.drafter.runtime.pool_size import STANDALONE_MB, engine_pool_mb
from vllm_hetero_spec.model_names import draft_model_folder, draft_tokenizer_folder
from vllm_hetero_spec.vocab.frequent_tokens import merge_ordered, read_tokenizer

DEFAULT_FORWARD_TOKENS = 8192
DEFAULT_ROWS = 256


@dataclass(frozen=True)
class DraftLoad:
    """What vLLM's loader needs to find and build the drafter: the config's draft-model
    keys, and what the drafter inherits from the target (``trust_remote_code``,
    ``download_dir``, ``load_format``), as vLLM's own draft models inherit them.
    ``model`` in :class:`RuntimeConfig` is the name as given (a Hub id is downloaded
    by vLLM's loader, into the target's ``download_dir`` unless the config names one)."""

    revision: str | None = None
    code_revision: str | None = None
    quantization: str | None = None
    moe_backend: str | None = None
    trust_remote_code: bool = False
    download_dir: str | None = None
    load_format: str = "auto"


@dataclass(frozen=True)
class RuntimeConfig:
    """Where and how the drafter runs, every value concrete.

    Attributes:
        model: the draft model folder.
        dtype: the drafter's weights and KV cache dtype.
        kv_pool_mb: the paged pool's size (MiB); a request that finds it full runs
            undrafted until blocks free up.
        max_model_len: the longest draft sequence (positions) it accepts; ``None``: the
            draft model's own limit.
        graph_sizes: the token counts whose forwards are captured as CUDA graphs
            (``cuda_graphs.py``); empty: eager.
        max_forward_tokens: the most tokens one forward takes; a larger catch-up (new
            requests' prompts) runs in several, so the drafter's transient memory is
            bounded by what vLLM's profile run measures (an engine's drafter takes the
            target's ``max_num_batched_tokens``).
        max_rows: the most rows one step samples at once (an engine's drafter takes the
            target's ``max_num_seqs``, the rows vLLM's own sampler is profiled at):
            wider work, such as ``slrs``'s tree levels, runs in slices of this many, so
            the drafter's transient peak is the one its profile run measures.
        attention_backend: the attention backend's name when the target's config names
            one (``--attention-backend``, ``attention_config.backend``), so the choice
            covers the whole engine; ``None``: vLLM picks for the drafter's own heads.
        head_tokens: the output layer's tokens (``drafter/runtime/draft_head.py``): the
            ids below it and the added tokens; 0: the whole vocabulary.
        tokenizer: the folder whose ``tokenizer.json`` lists those added tokens
            (``None``: the model's).
        load: how vLLM loads the drafter (:class:`DraftLoad`).
    """

    model: str
    dtype: torch.dtype = torch.float32
    kv_pool_mb: int = 512
    max_model_len: int | None = None
    graph_sizes: tuple[int, ...] = ()
    max_forward_tokens: int = DEFAULT_FORWARD_TOKENS
    max_rows: int = DEFAULT_ROWS
    attention_backend: str | None = None
    head_tokens: int = 0
    tokenizer: str | None = None
    load: DraftLoad = field(default_factory=DraftLoad)


def draft_load(settings: HeteroSettings, trust_remote_code: bool = False, download_dir: str | None = None,
               load_format: Any = "auto", moe_backend: str | None = None) -> DraftLoad:
    """The drafter's :class:`DraftLoad`: its own keys, else the target's settings given
    (as vLLM holds them: ``load_format`` may be its enum, ``moe_backend`` ``"auto"``)."""
    own = settings.draft_load_config or {}
    target_moe = None if moe_backend in (None, "auto") else moe_backend
    return DraftLoad(revision=settings.revision, code_revision=settings.code_revision,
                     quantization=settings.quantization, moe_backend=settings.moe_backend or target_moe,
                     trust_remote_code=trust_remote_code, download_dir=own.get("download_dir", download_dir),
                     load_format=own.get("load_format", getattr(load_format, "value", load_format)))


def target_draft_load(settings: HeteroSettings, target: Any | None) -> DraftLoad:
    """:func:`draft_load` with what the target engine's ``VllmConfig`` sets (a config
    that leaves a loading section out leaves vLLM's defaults)."""
    if target is None:
        return draft_load(settings)
    load_config = getattr(target, "load_config", None)
    return draft_load(settings, bool(getattr(target.model_config, "trust_remote_code", False)),
                      getattr(load_config, "download_dir", None), getattr(load_config, "load_format", "auto"),
                      getattr(getattr(target, "kernel_config", None), "moe_backend", None))


def resolve_runtime_config(
    settings: HeteroSettings, target: Any | None = None, device_type: str | None = None
) -> tuple[RuntimeConfig, dict[str, str]]:
    """``settings``' runtime keys made concrete, and why, per key (for the start-up log).

    ``target`` is the target engine's ``VllmConfig`` (``None``: a drafter of its own,
    outside any engine); ``device_type`` where the drafter runs (default: the target's
    device, else the platform's; a Ray actor drafts on ``cpu``).
    """
    if device_type is None:
        device_type = target.device_config.device.type if target is not None else platform_device_type()
    target_dtype = target.model_config.dtype if target is not None else None
    dtype_name, dtype_why = resolve_draft_dtype(settings.draft_dtype, target_dtype, device_type, cpu_flags())
    dtype = getattr(torch, dtype_name)

    pool = settings.draft_kv_pool_mb
    if pool != "auto":
        pool, pool_why = int(pool), "set in the config"
    elif target is not None:
        pool, pool_why = engine_pool_mb(target, str(draft_model_folder(settings)), dtype, settings.max_draft_tokens)
    else:
        pool, pool_why = STANDALONE_MB, "no engine to size it for"

    graphs = settings.draft_cuda_graphs
    if target is not None:
        sizes = resolve_graph_sizes(graphs, target.compilation_config, target.model_config.enforce_eager, device_type)
    else:
        # Graphs are captured in an engine's capture phase; a drafter of its own captures
        # only the sizes it is given.
        sizes = tuple(sorted(set(graphs))) if isinstance(graphs, list) else ()
    if settings.enforce_eager:
        sizes = ()
    graphs_why = f"at sizes {list(sizes)}" if sizes else "off (eager)"

    forward_tokens, rows, backend = DEFAULT_FORWARD_TOKENS, DEFAULT_ROWS, None
    if target is not None:
        rows = target.scheduler_config.max_num_seqs
        if device_type == target.device_config.device.type:
            forward_tokens = target.scheduler_config.max_num_batched_tokens
            chosen = getattr(getattr(target, "attention_config", None), "backend", None)
            backend = getattr(chosen, "name", chosen)
    backend = settings.attention_backend or backend
    head, head_why = resolve_head_tokens(settings)
    cfg = RuntimeConfig(settings.draft_model, dtype, pool, max_model_len=settings.max_model_len, graph_sizes=sizes,
                        max_forward_tokens=forward_tokens, max_rows=rows, attention_backend=backend,
                        head_tokens=head, tokenizer=str(draft_tokenizer_folder(settings)),
                        load=target_draft_load(settings, target))
    return cfg, {"dtype": f"{dtype_name} ({dtype_why})", "kv pool": f"{pool} MiB ({pool_why})",
                 "CUDA graphs": graphs_why, "output layer": head_why,
                 "attention": (f"{backend} (the config's)" if settings.attention_backend else
                               f"{backend} (the target's)" if backend else "vLLM's choice for the drafter")}


def resolve_head_tokens(settings: HeteroSettings) -> tuple[int, str]:
    """``draft_head_tokens`` checked against the drafter's tokenizer (0: the whole
    vocabulary), and the log's text. Raises :class:`HeteroConfigError` for a head the
    tokenizer cannot rank: the lowest ids of a vocabulary not in merge order are
    arbitrary tokens."""
    asked = settings.draft_head_tokens
    if asked == 0:
        return 0, "the whole vocabulary"
    tokenizer = read_tokenizer(str(draft_tokenizer_folder(settings)))
    size = len((tokenizer or {}).get("model", {}).get("vocab") or ())
    if asked >= size > 0:
        return 0, f"the whole vocabulary ({size} tokens, draft_head_tokens {asked})"
    if tokenizer is None or not merge_ordered(tokenizer):
        raise HeteroConfigError(
            f"draft_head_tokens: {asked} needs a byte-level BPE tokenizer whose ids follow its merges (then the "
            "lowest ids are the most frequent tokens), and the drafter's does not; set it to 0")
    return asked, f"the {asked} most frequent of {size} tokens"
