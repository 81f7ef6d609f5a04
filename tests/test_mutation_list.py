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


def test_the_testing_guide_names_every_mutation() -> None:
    """docs/testing.md's table is where a reader learns what the check covers; its count
    had fallen ten behind the list, unnoticed."""
    guide = (ROOT / "docs" / "testing.md").read_text()
    missing = [m.name for m in MUTATIONS if f"`{m.name}`" not in guide]
    assert not missing, f"docs/testing.md#mutations does not name {missing}"
    assert f"holds {len(MUTATIONS)} known-bad changes" in guide, "docs/testing.md#mutations: update the count"
