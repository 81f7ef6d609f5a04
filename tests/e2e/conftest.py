"""Fixtures shared by the serving modules."""

from __future__ import annotations

import pytest
from _serving import launch


@pytest.fixture(scope="session")
def plain_server(qwen05: str, tmp_path_factory: pytest.TempPathFactory):
    """One plain `vllm serve` of the target, the reference for every serving module
    (each used to start its own: a minute of start-up each). Returned launched, not yet
    ready, so that a module can start its hetero server beside it; call
    ``wait_ready()`` before use."""
    server = launch(qwen05, [], tmp_path_factory.mktemp("serve") / "plain.log")
    yield server
    server.stop()
