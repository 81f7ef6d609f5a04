"""Our ``hetero:*`` series on ``/metrics`` when vLLM serves it from prometheus_client's
multiprocess mode (several API servers). The board itself, free of vLLM, is
``metrics.py``; this module only brings its collector into the registries vLLM reads.

Patches ``prometheus_client.multiprocess.MultiProcessCollector``.
"""

from __future__ import annotations

from typing import Any

from vllm_hetero_spec.vllm_integration.patching import patch


def patch_multiprocess_metrics() -> None:
    """Why: our ``hetero:*`` collector sits in prometheus_client's default registry, which
    serves ``/metrics`` with one API server. With several (``--data-parallel-size``,
    ``--api-server-count``) vLLM sets ``PROMETHEUS_MULTIPROC_DIR`` and ``/metrics`` is
    answered by prometheus-fastapi-instrumentator's handler from a registry it builds per
    request holding only a ``MultiProcessCollector`` (vLLM's own ``get_prometheus_registry``
    does the same); the default registry is never read, so the series vanished from
    data-parallel servers. Every ``MultiProcessCollector`` made in a process where the
    plugin is loaded now brings ours into its registry. Targets prometheus_client's
    ``multiprocess.MultiProcessCollector(registry, path=None)``, as vLLM 0.32.0 and
    prometheus-fastapi-instrumentator call it (by module attribute, at request time)."""
    from prometheus_client import multiprocess

    from vllm_hetero_spec.metrics import register_collector

    collector = register_collector()
    original = multiprocess.MultiProcessCollector

    class MultiProcessCollector(original):  # type: ignore[misc, valid-type]
        def __init__(self, registry: Any, path: str | None = None) -> None:
            super().__init__(registry, path)
            if registry is not None:
                registry.register(collector)

    patch(multiprocess, "MultiProcessCollector", MultiProcessCollector, patch_multiprocess_metrics.__doc__,
          checked_on=("0.32.0", "0.33.0"))
