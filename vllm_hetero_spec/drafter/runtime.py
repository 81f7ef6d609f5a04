"""The draft model: loaded with transformers, run packed across requests.

We use transformers' model code (any causal LM it supports can draft) with our own
attention backend and per-request KV caches, so one forward serves every request of the
step. The drafter runs in float32 by default: on CPU that is faster than bf16 matmuls
without AMX, and it keeps draft probabilities well-conditioned for TLI's ratio test.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig

from vllm_hetero_spec.drafter import varlen_attention
from vllm_hetero_spec.drafter.kv_cache import RequestKVCache


class DraftModelRuntime:
    """Loads a causal LM and runs packed forwards over many requests' caches."""

    def __init__(self, model_path: str, dtype: torch.dtype = torch.float32):
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=dtype, attn_implementation=varlen_attention.BACKEND_NAME
        ).eval()
        self.dtype = dtype
        cfg: PretrainedConfig = self.model.config.get_text_config()
        self.num_layers = cfg.num_hidden_layers
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.vocab_size = self.model.get_output_embeddings().weight.shape[0]

    def new_cache(self) -> RequestKVCache:
        return RequestKVCache(self.num_layers, self.kv_heads, self.head_dim, self.dtype)

    @torch.inference_mode()
    def forward(self, caches: list[RequestKVCache], new_tokens: list[list[int]]) -> torch.Tensor:
        """Append ``new_tokens[i]`` to ``caches[i]`` (each non-empty) and return the
        float32 logits ``[len(caches), vocab]`` at each request's last new token."""
        lengths = [len(t) for t in new_tokens]
        if not all(lengths):
            raise ValueError("every request needs at least one new token (its logits come from the last one)")
        starts = [0]
        for n in lengths[:-1]:
            starts.append(starts[-1] + n)
        ids = torch.tensor([tok for toks in new_tokens for tok in toks], dtype=torch.long).unsqueeze(0)
        positions = torch.cat([torch.arange(c.length, c.length + n) for c, n in zip(caches, lengths)]).unsqueeze(0)
        last = torch.tensor([s + n - 1 for s, n in zip(starts, lengths)], dtype=torch.long)
        batch = varlen_attention.PackedBatch(caches, starts, lengths)
        out = self.model(
            input_ids=ids,
            position_ids=positions,
            use_cache=False,
            logits_to_keep=last,
            packed_batch=batch,
        )
        for c, n in zip(caches, lengths):
            c.advance(n)
        return out.logits[0].float()

    @torch.inference_mode()
    def grow_trees(
        self, caches: list[RequestKVCache], trees: list[varlen_attention.TokenTree], parents: list[list[int]],
        tokens: list[list[int]],
    ) -> list[torch.Tensor]:
        """Add ``tokens[i]`` under ``parents[i]`` to ``trees[i]`` (see
        :meth:`TokenTree.grow`; each non-empty) and return per request the float32
        logits ``[len(tokens[i]), vocab]`` at the new nodes. The caches' committed
        lengths are unchanged."""
        starts, lengths, positions, ids = [], [], [], []
        for cache, tree, par, toks in zip(caches, trees, parents, tokens):
            if cache.length != tree.context:
                raise ValueError("a token tree must hang from its cache's committed length")
            tree.grow(par)
            positions.append(tree.positions()[-len(toks) :])
            starts.append(len(ids))
            lengths.append(len(toks))
            ids.extend(toks)
            cache.length = tree.context + tree.depth.numel() - len(toks)
        batch = varlen_attention.PackedBatch(caches, starts, lengths, trees)
        try:
            out = self.model(
                input_ids=torch.tensor(ids, dtype=torch.long).unsqueeze(0),
                position_ids=torch.cat(positions).unsqueeze(0),
                use_cache=False,
                packed_batch=batch,
            )
        finally:
            for cache, tree in zip(caches, trees):
                cache.length = tree.context
        logits = out.logits[0].float()
        return [logits[s : s + n] for s, n in zip(starts, lengths)]
