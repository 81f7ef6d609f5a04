"""``draft_kv_pool_mb: auto``: a draft KV pool sized for the engine's batch, not a fixed
number.

The pool has to hold every running request's draft sequence, so ``auto`` sizes it for
``max_num_seqs`` requests at the longest context the drafter can see (the target's
``max_model_len``, or the draft model's own limit when shorter), plus one block and a
step's drafts per request. A fixed 512 MiB holds about 11,000 float32 SmolLM2 tokens:
at batch 64 with 2,000-token contexts most requests would run undrafted.

That need is capped, so a long ``max_model_len`` cannot claim the device: at the
target's own explicit KV budget when there is one (``kv_cache_memory_bytes``, which
``VLLM_CPU_KVCACHE_SPACE`` sets on CPU: the drafter never reserves more than the target
does), else at a tenth of the device's memory. Resolved once in the engine's process
(``vllm_integration/proposer.py``) and logged; a standalone drafter (tests, benchmarks,
no engine) keeps :data:`STANDALONE_MB`.
"""

from __future__ import annotations

import math

import torch

MiB = 1 << 20
STANDALONE_MB = 512
_DEVICE_SHARE = 0.10
_BLOCK = 16
_MIN_MB = 16


def draft_bytes_per_token(hf_config, dtype: torch.dtype) -> int:
    """KV bytes one draft token takes (keys and values, every layer)."""
    text = hf_config.get_text_config()
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    return text.num_hidden_layers * kv_heads * head_dim * 2 * dtype.itemsize


def device_memory_bytes(device: torch.device) -> int:
    """The device's total memory (host RAM for the CPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    import psutil

    return psutil.virtual_memory().total


def auto_pool_mb(
    per_token: int, max_num_seqs: int, context: int, step_tokens: int, cap_bytes: int
) -> tuple[int, str]:
    """The pool's size in MiB and why: ``max_num_seqs`` sequences of ``context`` tokens,
    each with one spare block and ``step_tokens`` drafted positions, at most
    ``cap_bytes``."""
    per_seq = (math.ceil((context + step_tokens) / _BLOCK) + 1) * _BLOCK
    need = max_num_seqs * per_seq * per_token
    size = max(_MIN_MB, math.ceil(min(need, cap_bytes) / MiB))
    why = (f"{max_num_seqs} sequences x {per_seq} tokens x {per_token} B = {need / MiB:.0f} MiB"
           + (f", capped at {cap_bytes / MiB:.0f} MiB" if need > cap_bytes else ""))
    return size, why


def engine_pool_mb(vllm_config, draft_model: str, dtype: torch.dtype, step_tokens: int) -> tuple[int, str]:
    """``auto`` for an engine with ``vllm_config`` (the target's) drafting with
    ``draft_model`` in ``dtype``, ``step_tokens`` draft positions per step."""
    from transformers import AutoConfig

    draft = AutoConfig.from_pretrained(draft_model)
    own_limit = getattr(draft.get_text_config(), "max_position_embeddings", None)
    context = min(vllm_config.model_config.max_model_len, own_limit or vllm_config.model_config.max_model_len)
    cap = vllm_config.cache_config.kv_cache_memory_bytes or int(
        _DEVICE_SHARE * device_memory_bytes(torch.device(vllm_config.device_config.device)))
    return auto_pool_mb(draft_bytes_per_token(draft, dtype), vllm_config.scheduler_config.max_num_seqs, context,
                        step_tokens, cap)
