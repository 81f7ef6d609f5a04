"""The configuration names a ``defaults.py`` run records, and its runs grouped by them.

``defaults.py`` writes runs under these names and ``matrix.py`` reads them back from the
store; both import them from here, so neither imports the other.
"""

from __future__ import annotations

#: The lossless rules a run measures alone (``--rules``), each under its own name.
RULES = ("slem", "tli", "slrs", "dtw", "union")
#: vLLM's own heterogeneous-vocabulary drafting (``draft_model`` with ``use_heterogeneous_vocab``).
BUILTIN = "vllm built-in TLI"


def by_configuration(runs: list[dict]) -> dict[tuple, list[dict]]:
    """The runs of each (target, batch size, temperature, configuration), in first-seen order."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["target"], r["batch_size"], r["temperature"], r["config"]), []).append(r)
    return groups
