"""The resolver's shape: short functions, and a planner that does not reach up into ``serve``
or the commands (tests/unit/test_import_cycles.py holds the package against import circles)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "qwen3090"
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports, lazy (function-level) imports included."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {_owner(a.name, modules) for a in node.names
                         if a.name.startswith("qwen3090")}
            elif (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                  and node.module.startswith("qwen3090")):
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    deps.add(full if full in modules else _owner(node.module, modules))
        graph[name] = {d for d in deps if d is not None and d not in (name, "qwen3090")}
    return graph


def test_the_planner_does_not_import_serve_or_commands() -> None:
    graph = import_graph()
    for name, deps in graph.items():
        if name.startswith("qwen3090.resolver") or name == "qwen3090.plan":
            assert not {d for d in deps if d.startswith(("qwen3090.serve", "qwen3090.commands"))}


def test_no_resolver_function_over_80_lines() -> None:
    long: list[str] = []
    for path in sorted((PACKAGE / "resolver").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{path.name}:{node.name} ({length} lines)")
    assert long == []
