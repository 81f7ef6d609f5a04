"""The one vLLM version the plugin patches (``scripts/setup.sh`` installs it from here;
``pyproject.toml``'s extras repeat it, checked by ``tests/plugin/test_patching.py``)."""

VLLM_VERSION = "0.32.0"
