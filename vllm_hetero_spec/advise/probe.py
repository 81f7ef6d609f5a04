"""``advise``'s reach into vLLM's worker: a worker extension (``LLM(worker_extension_cls=
...)``, vLLM adds it to the worker's bases) whose methods ``LLM.collective_rpc`` calls by
name, wherever the worker runs (the engine core's process by default). It pins the
proposer's rule and draft length and reads back its step log; methods are prefixed so
that none clashes with a worker's own."""

from __future__ import annotations

from typing import Any

#: The value of ``worker_extension_cls`` that installs this class.
PROBE = "vllm_hetero_spec.advise.probe.AdviseProbe"


class AdviseProbe:
    def _hetero_proposer(self) -> Any:
        drafter = getattr(getattr(self, "model_runner", None), "drafter", None)
        if drafter is None or not hasattr(drafter, "pin"):
            raise RuntimeError("this engine's worker has no hetero proposer (speculative_config method 'hetero')")
        return drafter

    def advise_pin(self, rule: str, k: int) -> None:
        """Draft with ``rule`` and exactly ``k`` tokens from the next step on."""
        self._hetero_proposer().pin(rule, k)

    def advise_read(self) -> list[dict[str, Any]]:
        """The steps logged since the last read (then cleared)."""
        log = self._hetero_proposer().step_log
        if log is None:
            return []
        steps = log.as_dicts()
        log.clear()
        return steps
