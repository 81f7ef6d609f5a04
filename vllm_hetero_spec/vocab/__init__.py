"""Bridging two tokenizers: per-token byte strings, the shared vocabulary, re-tokenization."""
