"""The patch mechanism: one small base, each patch beside the feature it serves.

As in ArcticInference's patching, the base knows nothing of any feature: a feature's
module wraps what it needs and hands the replacement to :func:`patch`, which sets it,
records why, and refuses to patch the same attribute twice, so a plugin loaded twice,
or two patches colliding, fail loudly instead of wrapping a wrapper. Each record names
the vLLM versions its patch was checked against, so an upgrade of the pin (``pin.py``)
shows which patches nobody has looked at again (``tests/plugin/test_patching.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PatchRecord:
    """One applied patch: ``target.attribute`` replaced, why, and the vLLM versions the
    replacement was checked against."""

    target: str
    attribute: str
    reason: str
    checked_on: tuple[str, ...]


class PatchError(RuntimeError):
    """A patch was applied twice (or collides with another), or names no version."""


APPLIED: list[PatchRecord] = []
_patched: set[tuple[int, str]] = set()


def _name(owner: Any) -> str:
    """``module.Class`` for a class, the module's name for a module."""
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}"
    return owner.__name__


def patch(owner: Any, attribute: str, replacement: Any, reason: str, *, checked_on: tuple[str, ...]) -> PatchRecord:
    """Set ``owner.attribute`` to ``replacement`` and record it; a second patch of the
    same attribute raises :class:`PatchError`. ``checked_on``: the vLLM versions whose
    source this patch was read against."""
    key = (id(owner), attribute)
    if key in _patched:
        raise PatchError(f"{_name(owner)}.{attribute} is already patched; refusing to patch it twice")
    if not hasattr(owner, attribute):
        raise PatchError(f"{_name(owner)} has no attribute {attribute!r} to patch (vLLM changed?)")
    if not checked_on:
        raise PatchError(f"{_name(owner)}.{attribute}: name the vLLM versions the patch was checked on")
    setattr(owner, attribute, replacement)
    _patched.add(key)
    record = PatchRecord(_name(owner), attribute, " ".join(reason.split()), tuple(checked_on))
    APPLIED.append(record)
    return record
