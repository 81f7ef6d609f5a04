"""The compatibility lane's list of tests not applicable on vLLM 0.33.0's CUDA build
(``tests/compat.py``) names tests that exist, each with a reason: a renamed test must
not silently leave the list, or stay skipped under a name nobody runs."""

from __future__ import annotations

import ast
from pathlib import Path

import compat

ROOT = Path(__file__).resolve().parents[1]


def _tests_in(path: Path) -> set[str]:
    return {node.name for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_listed_test_exists_and_has_a_reason() -> None:
    assert compat.NOT_APPLICABLE
    for key, reason in compat.NOT_APPLICABLE.items():
        module, _, name = key.partition("::")
        path = ROOT / module
        assert path.is_file(), key
        assert not name or name.split("[")[0] in _tests_in(path), key
        assert len(reason) > 40, key


def test_the_list_applies_only_on_the_compatibility_lanes_release(monkeypatch) -> None:
    item = type("Item", (), {"nodeid": next(iter(compat.NOT_APPLICABLE)), "markers": []})()
    item.add_marker = item.markers.append
    for release, marked in ((compat.COMPAT_VERSION, 1), ("0.32.0", 0)):
        item.markers.clear()
        monkeypatch.setattr(compat, "installed_release", lambda release=release: release)
        compat.mark_not_applicable([item])
        assert len(item.markers) == marked
