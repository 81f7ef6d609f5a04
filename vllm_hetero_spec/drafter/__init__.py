"""The draft model runtime: its own tokenizer, its own per-request KV cache, batched."""
