"""The package's import graph has no circle, and the rooms keep to their side.

Read from the source (every ``import``, at module level, inside functions and under
``TYPE_CHECKING`` alike: a circle hidden behind a late import is still a circle a
reader must untangle), so the test needs no vLLM and runs in the fast lane.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "vllm_hetero_spec"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a package import counts as its ``__init__``)."""
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t.startswith(PACKAGE) and t != name and t != PACKAGE:
                    edges.add(t)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (a path that returns to its start), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_package_has_no_import_circle() -> None:
    assert find_cycle(import_graph()) is None


def test_the_cycle_finder_finds_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_draft_rules_and_the_draft_loop_do_not_reach_for_the_batch_drafter() -> None:
    """They see the batch drafter through ``DraftContext`` only."""
    graph = import_graph()
    narrow = [m for m in graph if m.startswith(f"{PACKAGE}.drafter.rules") or m.endswith(".draft_loop")]
    assert narrow and all(f"{PACKAGE}.drafter.batch_drafter" not in graph[m] for m in narrow)


def test_policy_and_runtime_do_not_depend_on_their_users() -> None:
    """The budget and rule choice are pure policy; the runtime knows no draft rule or placement."""
    graph = import_graph()
    for module, edges in graph.items():
        if module.startswith(f"{PACKAGE}.policy"):
            assert not {e for e in edges if e.startswith(f"{PACKAGE}.drafter") and not e.endswith(".sampling")}, module
        if module.startswith(f"{PACKAGE}.drafter.runtime"):
            assert not {e for e in edges if ".rules" in e or ".placement" in e or e.endswith(".batch_drafter")}, module


def test_vllm_integration_is_entered_through_register_only() -> None:
    """Every patch of vLLM and the proposer vLLM loads live in ``vllm_integration/``, and
    no other module of the package imports it: only ``register`` (the package's
    ``__init__``) opens that door, so the rest reads vLLM's public objects and runs,
    and is tested, without the patches."""
    graph = import_graph()
    wing = f"{PACKAGE}.vllm_integration"
    inside = {m for m in graph if m == wing or m.startswith(f"{wing}.")}
    assert {f"{wing}.patching", f"{wing}.runner_hooks", f"{wing}.proposer"} <= inside
    assert wing in graph[PACKAGE]
    entering = {m: sorted(graph[m] & inside) for m in graph if m not in inside and m != PACKAGE}
    assert {m: e for m, e in entering.items() if e} == {}


def test_the_wing_sees_the_drafter_through_its_interface_only() -> None:
    """``vllm_integration/`` imports ``drafter``'s ``__init__`` (its exported names), never
    a module inside it: the drafter can be rearranged without touching the door to vLLM."""
    graph = import_graph()
    wing = f"{PACKAGE}.vllm_integration"
    reaching = {m: sorted(e for e in edges if e.startswith(f"{PACKAGE}.drafter."))
                for m, edges in graph.items() if m == wing or m.startswith(f"{wing}.")}
    assert f"{PACKAGE}.drafter" in graph[f"{wing}.proposer"]
    assert {m: e for m, e in reaching.items() if e} == {}


def test_rule_names_become_behaviour_in_the_draft_rules_only() -> None:
    """Outside ``drafter/rules`` (and the config schema, which names the rules'
    keys), no module compares anything with a rule's name."""
    rules = {"slem", "tli", "dtw", "union", "fsd", "slrs"}
    offenders = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("drafter/rules/") or rel in {"config.py", "metrics.py"}:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                consts = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant)}
                if consts & rules:
                    offenders.append(f"{rel}:{node.lineno}")
    assert offenders == []
