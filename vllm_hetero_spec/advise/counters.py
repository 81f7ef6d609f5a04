"""vLLM's speculative-decoding counters between two ``LLM.get_metrics()`` snapshots:
what every run that compares acceptance reads (``advise``, the benchmarks)."""

from __future__ import annotations

from typing import Any


def _counter(metrics: list[Any], name: str) -> float:
    return float(sum(getattr(m, "value", 0) or 0 for m in metrics if m.name == name))


def spec_decode_delta(before: dict[str, Any], after: list[Any]) -> dict[str, Any]:
    """vLLM's spec-decode counters (and preemptions) between two ``LLM.get_metrics()``
    snapshots, ``before`` keyed by name. vLLM keeps one Prometheus registry per process
    and each new engine's stat logger unregisters the previous one's, so with two
    engines in a process the snapshots are the newest engine's.

    ``acceptance_per_position[i]``: the share of drafts whose position ``i + 1`` was
    accepted (cumulative: it counts only when positions ``1..i`` were)."""

    def delta(name: str) -> float:
        prev = before.get(name)
        return _counter(after, name) - (float(getattr(prev, "value", 0) or 0) if prev else 0.0)

    per_pos: dict[int, float] = {}
    for m in after:
        if m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            before_pos = before.get(m.name)
            prev = list(getattr(before_pos, "values", []) or []) if before_pos else []
            for i, v in enumerate(getattr(m, "values", []) or []):
                per_pos[i] = per_pos.get(i, 0.0) + v - (prev[i] if i < len(prev) else 0.0)
    drafts = delta("vllm:spec_decode_num_drafts")
    draft_tokens = delta("vllm:spec_decode_num_draft_tokens")
    accepted = delta("vllm:spec_decode_num_accepted_tokens")
    return {
        "num_drafts": drafts,
        "num_draft_tokens": draft_tokens,
        "num_accepted_tokens": accepted,
        "accepted_per_position": [per_pos[i] for i in sorted(per_pos)],
        "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        "acceptance_per_position": [per_pos[i] / drafts for i in sorted(per_pos)] if drafts else None,
        "num_preemptions": delta("vllm:num_preemptions"),
    }
