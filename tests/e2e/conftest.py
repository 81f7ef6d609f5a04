"""Fixtures shared by the e2e modules: the Gemma pair's target alone."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import _gemma_pair

from hetero_harness.evaluation import run_isolated
from hetero_harness.run_once import run_once


class GemmaAlone:
    """Gemma-3-270M alone on :data:`_gemma_pair.REFERENCE_ROWS`: one engine for the
    whole run, whichever module of whichever xdist worker asks first
    (``hetero_harness.run_once``), so that the modules comparing with it may run in
    either lane. Its start and rows are charged to its own budget line, once.

    Ask before taking a core lease (``run_once`` refuses otherwise): the worker running
    it may be waiting for that core."""

    def __init__(self, gemma: str, store: Path, count_rows: Callable[[int], None]) -> None:
        self.gemma = gemma
        self._store = store
        self._count_rows = count_rows
        self._results: dict[str, dict | Exception] | None = None  # this process's copy

    def _run(self) -> dict:
        job, groups = _gemma_pair.reference_job(self.gemma)
        result = run_isolated(job, env=_gemma_pair.IN_PROCESS, charge=_gemma_pair.GEMMA_ALONE, lease_cores=1)
        self._count_rows(_gemma_pair.sampled_rows(groups))
        return result

    def results(self) -> dict[str, dict | Exception]:
        """``{rows name: result}`` (a failed run: its exception in each place); read from
        the run's store once per process."""
        if self._results is None:
            groups = _gemma_pair.reference_job(self.gemma)[1]
            try:
                result: dict | Exception = run_once(self._store, self._run)[0]
            except Exception as exc:  # noqa: BLE001 -- kept in the groups' places, raised by unwrap
                result = exc
            self._results = _gemma_pair.split(result, groups, _gemma_pair.prompts(self.gemma), [])["target"]
        return self._results


@pytest.fixture(scope="session")
def gemma_alone(gemma: str, count_rows_for, tmp_path_factory: pytest.TempPathFactory) -> GemmaAlone:
    # Under pytest-xdist the parent of a worker's base folder is the run's (its way to
    # share files); without it, the base folder is.
    base = tmp_path_factory.getbasetemp()
    store = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "gemma_alone.json"
    return GemmaAlone(gemma, store, lambda n: count_rows_for(_gemma_pair.GEMMA_ALONE, n))
