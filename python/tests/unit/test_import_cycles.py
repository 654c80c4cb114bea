"""No import circles in the package: a module never needs, even lazily, one that needs it.

The graph is read from the source (AST): every ``import``/``from ... import`` of a qwen3090
module, at module level or inside a function (a lazy import still ties the two modules), plus
the packages a dotted import runs. Each circle is reported with its path.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

import qwen3090

pytestmark = pytest.mark.unit

PKG = Path(qwen3090.__file__).parent


def _name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def import_graph(root: Path = PKG) -> dict[str, set[str]]:
    """module -> the package modules it imports (anywhere in its source)."""
    files = {_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        is_pkg = path.name == "__init__.py"
        package = module if is_pkg else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                # "from pkg import name": name is a submodule when such a file exists.
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                for mod in _ancestors(target):
                    if mod in files and mod != module:
                        graph[module].add(mod)
    return graph


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop(0)
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp: list[str] = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _shortest_cycle(graph: dict[str, set[str]], through: str, within: set[str]) -> list[str]:
    """The shortest import path from ``through`` back to itself inside one component."""
    parent: dict[str, str] = {}
    frontier = [through]
    seen = {through}
    while frontier:
        nxt_frontier: list[str] = []
        for node in frontier:
            for nxt in sorted(graph[node] & within):
                if nxt == through:
                    path = [node]
                    while path[-1] != through:
                        path.append(parent[path[-1]])
                    return [*reversed(path), through]
                if nxt not in seen:
                    seen.add(nxt)
                    parent[nxt] = node
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    return []


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest circle through each module of each component, each circle once."""
    found: dict[frozenset[tuple[str, str]], list[str]] = {}
    for comp in _components(graph):
        for module in comp:
            cycle = _shortest_cycle(graph, module, set(comp))
            key = frozenset(itertools.pairwise(cycle))
            found.setdefault(key, cycle)
    return sorted(found.values())


def test_the_graph_is_read() -> None:
    graph = import_graph()
    assert "qwen3090.fetch" in graph["qwen3090.commands.fetch"]  # a lazy import counts
    assert "qwen3090.pins" in graph["qwen3090.fetch"]
    assert "qwen3090.commands" in graph["qwen3090.cli"]


def test_the_cycle_finder_finds_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"d2"}, "d2": {"d"}, "e": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"], ["d", "d2", "d"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_in_the_package() -> None:
    found = cycles(import_graph())
    assert not found, "import circles:\n  " + "\n  ".join(" -> ".join(c) for c in found)
