"""The mutation check (``tests/mutations.py``, not run by CI) stays applicable: each
mutation's code is still in its file, once. Without this, a refactor of the code a
mutation targets leaves the check stopping at "update me" until someone runs it (the
``bias`` and ``residual`` mutations had gone stale that way)."""

from __future__ import annotations

import pytest
from mutations import MUTATIONS, ROOT


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_mutation_applies_once(mutation) -> None:
    assert (ROOT / mutation.path).read_text().count(mutation.old) == 1, (
        f"{mutation.name}: its code is not (uniquely) in {mutation.path}; update tests/mutations.py")
    assert mutation.old != mutation.new
