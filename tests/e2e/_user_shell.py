"""A fresh shell's environment, as a user's commands run in it: this process's without
the variables the suite or the plugin set (HOME and PATH stay: the model cache and the
shell's tools)."""

from __future__ import annotations

import os

# Variables the suite (scripts/test.sh, tests/conftest.py, the harness) or the plugin set.
SUITE_PREFIXES = ("VLLM_", "PYTEST_", "HETERO_SPEC_")
SUITE_NAMES = {"OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM", "PYTHONPATH"}


def user_env(**extra: str) -> dict[str, str]:
    """A fresh shell's environment: this one without the suite's variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(SUITE_PREFIXES) and k not in SUITE_NAMES}
    return {**env, **extra}
