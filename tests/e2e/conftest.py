"""Fixtures shared by the e2e modules: the Gemma pair's target alone."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import _gemma_pair

from hetero_harness.evaluation import run_isolated



class GemmaAlone:
    """Gemma-3-270M alone on :data:`_gemma_pair.REFERENCE_ROWS`: one engine for the
    session, whichever module asks first. A module that runs engines of its own side by
    side takes :meth:`job` into its batch and hands the result back with :meth:`keep`;
    the others call :meth:`results`. Its start is charged to its own budget line."""

    def __init__(self, gemma: str, count_rows: Callable[[int], None]) -> None:
        self.gemma = gemma
        self._count_rows = count_rows
        self._results: dict[str, dict] | None = None

    def job(self) -> dict | None:
        """The job to run, or None once it has run."""
        return None if self._results is not None else _gemma_pair.reference_job(self.gemma)[0]

    def keep(self, result: dict | Exception) -> None:
        groups = _gemma_pair.reference_job(self.gemma)[1]
        self._count_rows(_gemma_pair.sampled_rows(groups))
        self._results = _gemma_pair.split(result, groups, _gemma_pair.prompts(self.gemma), [])["target"]

    def results(self) -> dict[str, dict | Exception]:
        """``{rows name: result}`` (a failed run: its exception in each place)."""
        if self._results is None:
            try:
                self.keep(run_isolated(self.job(), charge=_gemma_pair.GEMMA_ALONE, lease_cores=1))
            except Exception as exc:  # noqa: BLE001 -- kept in the groups' places, raised by unwrap
                self.keep(exc)
        return self._results


@pytest.fixture(scope="session")
def gemma_alone(gemma: str, count_rows_for) -> GemmaAlone:
    return GemmaAlone(gemma, lambda n: count_rows_for(_gemma_pair.GEMMA_ALONE, n))
