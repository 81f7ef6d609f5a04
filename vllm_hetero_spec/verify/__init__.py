"""Acceptance rules (pure tensor functions) and the vLLM-facing rejection sampler."""
