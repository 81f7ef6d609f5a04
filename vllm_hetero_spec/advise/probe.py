"""``advise``'s reach into vLLM's worker: a worker extension (``LLM(worker_extension_cls=
...)``, vLLM adds it to the worker's bases) whose methods ``LLM.collective_rpc`` calls by
name, wherever the worker runs (the engine core's process by default). It pins the
proposer's rule and draft length and reads back its step log and counters; methods are
prefixed so that none clashes with a worker's own."""

from __future__ import annotations

import dataclasses
from typing import Any

#: The value of ``worker_extension_cls`` that installs this class.
PROBE = "vllm_hetero_spec.advise.probe.AdviseProbe"


class AdviseProbe:
    def _hetero_proposer(self) -> Any:
        drafter = getattr(getattr(self, "model_runner", None), "drafter", None)
        if drafter is None or not hasattr(drafter, "pin"):
            raise RuntimeError("this engine's worker has no hetero proposer (speculative_config method 'hetero')")
        return drafter

    def advise_pin(self, rule: str | None, k: int) -> None:
        """Draft with ``rule`` and exactly ``k`` tokens from the next step on."""
        self._hetero_proposer().pin(rule, k)

    def advise_read(self) -> dict[str, Any]:
        """The steps logged since the last read (then cleared) and the drafter's counters
        so far (cumulative: the caller takes differences)."""
        drafter = self._hetero_proposer()
        log = drafter.step_log
        steps = log.as_dicts() if log is not None else []
        if log is not None:
            log.clear()
        return {"steps": steps, "stats": dataclasses.asdict(drafter.stats)}
