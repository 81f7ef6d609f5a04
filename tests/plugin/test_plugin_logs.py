"""The plugin's log lines reach the log vLLM writes (a server's, an engine's): its
loggers sit under vLLM's ``vllm`` logger, which vLLM configures and which does not pass
records on to Python's root logger. Outside it, INFO and DEBUG lines (the chosen draft
dtype, the draft KV pool's size, the per-step debug log) were dropped."""

from __future__ import annotations

import importlib
import logging

import pytest

MODULES = ("vllm_hetero_spec.vllm_integration", "vllm_hetero_spec.vllm_integration.proposer",
           "vllm_hetero_spec.vllm_integration.startup_checks", "vllm_hetero_spec.drafter.placement.ray_host")


@pytest.mark.parametrize("name", MODULES)
def test_plugin_loggers_write_where_vllm_does(name: str, monkeypatch) -> None:
    logger = importlib.import_module(name).logger
    vllm_logger = logging.getLogger("vllm")
    seen: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    monkeypatch.setattr(vllm_logger, "handlers", [Collect()])
    level = vllm_logger.level
    # setLevel, not the attribute: loggers cache isEnabledFor, and only setLevel clears
    # the cache (a debug call from an earlier test in this process had cached False).
    vllm_logger.setLevel(logging.DEBUG)
    try:
        logger.info("hetero spec: info line")
        logger.debug("hetero spec: debug line")
    finally:
        vllm_logger.setLevel(level)
    assert [r.getMessage() for r in seen] == ["hetero spec: info line", "hetero spec: debug line"]
