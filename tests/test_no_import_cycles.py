"""No two modules of tabletune/ import each other, directly or round a loop, counting every
import: module level, inside functions, and type-only ones under ``if TYPE_CHECKING:``.

A type-only import breaks no import at run time, but it still ties the two modules together:
neither can be read, tested or moved without the other. ``tests/test_import_layers.py`` checks
the same between packages; this checks it between modules.

An edge goes to the module an import names: ``from tabletune.controller import state`` to
``tabletune.controller.state`` (a submodule), ``from tabletune.controller import Estimator`` to
``tabletune.controller`` (its ``__init__``). Importing ``a.b`` also runs ``a/__init__``; that is
not counted as an edge from the importer, since Python reaches a package's ``__init__`` first
whichever of its modules is asked for (counting it would put every module of a package whose
``__init__`` imports its modules on a loop).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tabletune"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module and package under ``root / "tabletune"``."""
    return {_module_name(path, root): path
            for path in sorted((root / "tabletune").glob("**/*.py"))}


def _imported(path: Path, module: str, known: set[str]) -> list[tuple[int, str]]:
    """(line, module of ours) for every import in ``path``, however deep in the file."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [_longest_known(alias.name, known) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[:len(package) - (node.level - 1)]
                                + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known
                       else _longest_known(base, known) for alias in node.names]
        else:
            continue
        found += [(node.lineno, t) for t in targets if t is not None and t != module]
    return found


def _longest_known(name: str, known: set[str]) -> str | None:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in known:
            return ".".join(parts[:end])
    return None


def import_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """Module -> {imported module of ours: line of its first import}."""
    modules = _modules(root)
    known = set(modules)
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, {})
        for line, target in _imported(path, module, known):
            edges.setdefault(target, line)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One loop per group of modules that reach each other (strongly connected component),
    as [a, b, ..., a], each starting from its first module in name order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(_loop_in(group, graph) for group in groups)


def _loop_in(group: set[str], graph: dict[str, dict[str, int]]) -> list[str]:
    """The shortest loop from the group's first module back to it, within the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node]):
                if nxt == start:
                    return paths[node] + [start]
                if nxt in group and nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no loop in {sorted(group)}")  # pragma: no cover


def describe(loop: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(loop, loop[1:])) + \
        f" -> {loop[-1]}"


def test_no_module_of_tabletune_is_on_an_import_loop():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import loops:\n" + "\n".join(describe(loop, graph) for loop in found)


def test_the_state_export_does_not_import_the_estimator():
    assert "tabletune.controller.estimator" not in import_graph()["tabletune.controller.state"]


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}, [["a", "b", "c", "a"]]),
    ({"a": {"b": 1}, "b": {"c": 1}, "c": {}}, []),
    ({"a": {"b": 1}, "b": {"a": 1}, "c": {"d": 1}, "d": {"c": 1, "a": 1}},
     [["a", "b", "a"], ["c", "d", "c"]]),
])
def test_the_loop_finder_reports_every_loop_and_only_loops(graph, expected):
    assert cycles(graph) == expected


def test_type_only_function_level_and_relative_imports_all_count(tmp_path):
    pkg = tmp_path / "tabletune" / "x"
    pkg.mkdir(parents=True)
    (tmp_path / "tabletune" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from tabletune.x.b import B\n")
    (pkg / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "c.py").write_text("import tabletune.x.a as a\nfrom tabletune.x import thing\n")
    graph = import_graph(tmp_path)
    assert graph["tabletune.x.a"] == {"tabletune.x.b": 3}
    assert graph["tabletune.x.b"] == {"tabletune.x.c": 2}
    assert graph["tabletune.x.c"] == {"tabletune.x.a": 1, "tabletune.x": 2}
    assert cycles(graph) == [["tabletune.x.a", "tabletune.x.b", "tabletune.x.c",
                              "tabletune.x.a"]]
