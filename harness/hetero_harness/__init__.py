"""Tooling around the plugin, not part of it: building the models from PyPI wheels, one
engine run isolated in a subprocess (tests, benchmarks, the main job), a ``vllm serve``
process, the prompts, and the main job itself (``python -m hetero_harness``). A separate
distribution (``harness/pyproject.toml``) that ``scripts/setup.sh`` installs beside the
plugin: the plugin never imports it."""
