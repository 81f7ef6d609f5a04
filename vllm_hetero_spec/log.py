"""The plugin's loggers: children of vLLM's ``vllm`` logger.

vLLM 0.32.0 configures only the ``vllm`` logger tree (``vllm/logger.py``: its handler,
``propagate: False``, and the level from ``VLLM_LOGGING_LEVEL``). A logger named after
this package sat outside that tree, so its INFO and DEBUG records fell through to
Python's root logger (WARNING) and never reached a server's log: the chosen draft dtype,
the draft KV pool's size, the Ray actor's start and the per-step debug log were all
silent. Named ``vllm.<module>``, they print where vLLM's own lines do, at vLLM's level.
"""

from __future__ import annotations

import logging

from vllm.logger import init_logger


def plugin_logger(module: str) -> logging.Logger:
    """The logger for the module ``module`` (pass ``__name__``)."""
    return init_logger(f"vllm.{module}")
