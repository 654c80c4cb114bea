"""Every error the CLI can print carries a fix, and a fix names only what exists.

Read from the package's source (AST), so a new raise site is covered the day it is written:

- every ``Qwen3090Error(...)`` (or subclass) call passes a ``fix``;
- a ``--flag`` in a fix belongs to the command that raises it: the raise site is traced back
  (a call graph over the package) to the subcommands whose entry function reaches it, and the
  flag must be an option of each of them;
- every ``qwen3090 CMD ...`` a string of the package spells out names a real subcommand, and
  the flags written after it are that subcommand's.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

import qwen3090
from qwen3090 import gate
from qwen3090.cli import build_parser

pytestmark = pytest.mark.unit

PKG = Path(qwen3090.__file__).parent
ROOT_ERROR = "Qwen3090Error"
FuncKey = tuple[str, str]  # (module, qualified name); "<module>" for module-level code


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _modules() -> dict[str, ast.Module]:
    return {
        _module_name(p): ast.parse(p.read_text(encoding="utf-8"), str(p))
        for p in sorted(PKG.rglob("*.py"))
    }


@cache
def _error_classes() -> frozenset[str]:
    """Qwen3090Error and every class of the package derived from it (by name)."""
    names = {ROOT_ERROR}
    bases: dict[str, set[str]] = {}
    for tree in _modules().values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = {
                    b.id if isinstance(b, ast.Name) else b.attr
                    for b in node.bases
                    if isinstance(b, ast.Name | ast.Attribute)
                }
    grew = True
    while grew:
        grew = False
        for cls, parents in bases.items():
            if cls not in names and parents & names:
                names.add(cls)
                grew = True
    return frozenset(names)


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


@dataclass
class Site:
    module: str
    line: int
    func: FuncKey
    fix: ast.expr | None

    @property
    def where(self) -> str:
        return f"{self.module.replace('.', '/')}.py:{self.line}"


@dataclass
class Graph:
    """Who references whom, per function, over the whole package (an over-approximation:
    a method is reached wherever an attribute of its name is read)."""

    edges: dict[FuncKey, set[FuncKey]] = field(default_factory=dict)
    defs: dict[str, dict[str, FuncKey]] = field(default_factory=dict)  # module -> name -> key
    classes: dict[FuncKey, set[FuncKey]] = field(default_factory=dict)  # class -> its methods
    methods: dict[str, set[FuncKey]] = field(default_factory=dict)  # method name -> keys
    sites: list[Site] = field(default_factory=list)

    def reach(self, start: FuncKey) -> set[FuncKey]:
        seen = {start}
        todo = [start]
        while todo:
            for nxt in self.edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen


def _bindings(module: str, tree: ast.Module, known: set[str]) -> dict[str, tuple[str, str]]:
    """Imported names of a module (its functions' imports too): name -> (module, attr), with
    attr "" when the name is a module."""
    out: dict[str, tuple[str, str]] = {}
    package = module if (PKG / Path(*module.split(".")[1:]) / "__init__.py").exists() \
        else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    out[alias.asname] = (alias.name, "")
                else:
                    root = alias.name.split(".")[0]
                    out[root] = (root, "")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                name = alias.asname or alias.name
                out[name] = (full, "") if full in known else (base, alias.name)
    return out


def _collect_defs(g: Graph, module: str, body: list[ast.stmt], prefix: str,
                  cls: FuncKey | None) -> None:
    """Pass 1: every def of ``module`` with its key; top-level names in ``g.defs``."""
    for node in body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        key = (module, f"{prefix}{node.name}")
        if not prefix:
            g.defs[module][node.name] = key
        if isinstance(node, ast.ClassDef):
            g.classes[key] = set()
            _collect_defs(g, module, node.body, f"{key[1]}.", key)
        else:
            if cls is not None:
                g.classes[cls].add(key)
                g.methods.setdefault(node.name, set()).add(key)
            _collect_defs(g, module, node.body, f"{key[1]}.", None)


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


class _Scan:
    """Pass 2 for one module: the references of each def's own body, and its raise sites."""

    def __init__(self, g: Graph, module: str) -> None:
        self.g = g
        self.module = module
        self.mods = _modules()
        self.binds = _bindings(module, self.mods[module], set(self.mods))

    def resolve(self, mod: str, attr: str, depth: int = 0) -> set[FuncKey]:
        if mod not in self.mods or depth > 5:
            return set()
        key = self.g.defs[mod].get(attr)
        if key is not None:
            return {key, *self.g.classes.get(key, ())}
        # A name that module itself imported (a re-export): follow it.
        target = _bindings(mod, self.mods[mod], set(self.mods)).get(attr)
        if target is not None and target[1]:
            return self.resolve(target[0], target[1], depth + 1)
        return set()

    def refs(self, node: ast.AST) -> set[FuncKey]:
        if isinstance(node, ast.Name):
            key = self.g.defs[self.module].get(node.id)
            if key is not None:
                return {key, *self.g.classes.get(key, ())}
            if node.id in self.binds:
                mod, attr = self.binds[node.id]
                return self.resolve(mod, attr) if attr else set()
            return set()
        if not isinstance(node, ast.Attribute):
            return set()
        name = _dotted(node)
        if name is not None:
            head, *rest = name.split(".")
            if head in self.binds and not self.binds[head][1]:
                mod = self.binds[head][0]
                for i in range(len(rest), 0, -1):
                    candidate = ".".join([mod, *rest[: i - 1]])
                    if candidate in self.mods:
                        return self.resolve(candidate, rest[i - 1])
        if node.attr.startswith("__"):
            return set()  # super().__init__ and the like: not every class's dunder
        return set(self.g.methods.get(node.attr, ()))

    def site(self, node: ast.Call, here: FuncKey) -> Site:
        fix = next((k.value for k in node.keywords if k.arg == "fix"), None)
        if fix is None and len(node.args) >= 2:
            fix = node.args[1]
        if isinstance(fix, ast.Constant) and fix.value is None:
            fix = None
        return Site(self.module, node.lineno, here, fix)

    def scan(self, body: list[ast.stmt], here: FuncKey, prefix: str) -> None:
        out = self.g.edges.setdefault(here, set())
        errors = _error_classes()
        stack: list[ast.AST] = list(body)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                key = (self.module, f"{prefix}{node.name}")
                out.add(key)  # defining a nested def usually means calling it
                out.update(self.g.classes.get(key, ()))
                self.scan(node.body, key, f"{key[1]}.")
                if not isinstance(node, ast.ClassDef):
                    stack.extend(node.args.defaults)
                    stack.extend(d for d in node.args.kw_defaults if d is not None)
                stack.extend(node.decorator_list)
                continue
            if isinstance(node, ast.Call) and _called_name(node) in errors:
                self.g.sites.append(self.site(node, here))
            out.update(self.refs(node))
            stack.extend(ast.iter_child_nodes(node))


@cache
def _graph() -> Graph:
    mods = _modules()
    g = Graph()
    for module, tree in mods.items():
        g.defs[module] = {}
        _collect_defs(g, module, tree.body, "", None)
    for module, tree in mods.items():
        _Scan(g, module).scan(tree.body, (module, "<module>"), "")
        # Importing a module runs its top level.
        for target, _ in _bindings(module, tree, set(mods)).values():
            if target in mods:
                g.edges[(module, "<module>")].add((target, "<module>"))
    return g


# --- the parser: commands, their entry functions, their flags ---------------------------------


@dataclass(frozen=True)
class Command:
    path: str  # "fetch", "cache clear", "bench boot"
    entry: FuncKey
    flags: frozenset[str]


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


@cache
def _commands() -> dict[str, Command]:
    out: dict[str, Command] = {}

    def walk(parser: argparse.ArgumentParser, path: str, inherited: frozenset[str]) -> None:
        flags = inherited | {
            o for a in parser._actions for o in a.option_strings if o.startswith("--")
        }
        func = parser._defaults.get("func")
        if path and func is not None:
            out[path] = Command(path, (func.__module__, func.__qualname__), frozenset(flags))
        for name, sub in _subparsers(parser):
            walk(sub, f"{path} {name}".strip(), flags)

    walk(build_parser(), "", frozenset())
    return out


@cache
def _reached_by() -> dict[FuncKey, set[str]]:
    g = _graph()
    out: dict[FuncKey, set[str]] = {}
    for cmd in _commands().values():
        for key in g.reach(cmd.entry):
            out.setdefault(key, set()).add(cmd.path)
    return out


# --- reading flags out of a fix ---------------------------------------------------------------

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
MENTION = re.compile(r"qwen3090 ((?:[a-z][a-z0-9-]*)(?: [a-z][a-z0-9-]*)*)")
# Where a mention of another command ends: flags after it are the raising command's again.
CLAUSE_END = re.compile(r"[`;()\n]|, | or | and |\. ")


def _text(node: ast.expr) -> list[str]:
    """The possible texts of a string expression, "{}" for what is formatted in."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [
            "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)
        ]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return [a + b for a in _text(node.left) for b in _text(node.right)]
    if isinstance(node, ast.IfExp):
        return _text(node.body) + _text(node.orelse)
    return []


@dataclass
class Reading:
    own: set[str] = field(default_factory=set)  # flags of the command that raised it
    named: list[tuple[str, set[str]]] = field(default_factory=list)  # `qwen3090 X`: its flags
    unknown: list[str] = field(default_factory=list)  # `qwen3090 X` where X is no command


def read_flags(text: str) -> Reading:
    """Split a text's ``--flags`` between the commands it spells out and its own command."""
    commands = _commands()
    top = {c.split()[0] for c in commands}
    reading = Reading()
    taken: list[tuple[int, int]] = []
    for m in MENTION.finditer(text):
        words = m.group(1).split()
        if words[0] not in top:
            if m.start() > 0 and text[m.start() - 1] == "`":
                reading.unknown.append(" ".join(words))  # a spelled-out command that is none
            continue
        path = next(
            " ".join(words[:i]) for i in range(len(words), 0, -1)
            if " ".join(words[:i]) in commands or i == 1
        )
        end = CLAUSE_END.search(text, m.end())
        stop = end.start() if end else len(text)
        taken.append((m.start(), stop))
        flags = set(FLAG.findall(text, m.end(), stop))
        reading.named.append((path, flags))
    for f in FLAG.finditer(text):
        if not any(a <= f.start() < b for a, b in taken):
            reading.own.add(f.group())
    return reading


def _flags_of(path: str) -> frozenset[str]:
    """A command's flags; for a group (``cache``) those of every subcommand under it."""
    commands = _commands()
    if path in commands:
        return commands[path].flags
    return frozenset().union(*(c.flags for p, c in commands.items() if p.startswith(path + " ")))


# --- the tests --------------------------------------------------------------------------------


def test_the_walk_sees_the_package() -> None:
    g = _graph()
    assert len(g.sites) > 60, "the AST walk lost the raise sites"
    assert {"fetch", "serve", "gate", "cache clear", "bench boot"} <= set(_commands())
    reached = _reached_by()
    run_gate = ("qwen3090.gate", "run_gate")
    assert {"gate", "serve"} <= reached[run_gate], reached.get(run_gate)
    assert "plan" not in reached[run_gate], "the call graph is too coarse to check anything"


def test_every_error_carries_a_fix() -> None:
    missing = [s.where for s in _graph().sites if s.fix is None]
    assert not missing, "Qwen3090Error without fix= at:\n  " + "\n  ".join(missing)


def test_fix_flags_belong_to_the_commands_that_raise_them() -> None:
    reached = _reached_by()
    bad: list[str] = []
    checked = 0
    for site in _graph().sites:
        if site.fix is None:
            continue
        cmds = reached.get(site.func, set())
        for text in _text(site.fix):
            reading = read_flags(text)
            for path, flags in reading.named:
                for flag in sorted(flags - _flags_of(path)):
                    bad.append(f"{site.where}: `qwen3090 {path}` has no {flag}")
            for cmd in sorted(cmds):
                checked += bool(reading.own)
                for flag in sorted(reading.own - _flags_of(cmd)):
                    bad.append(f"{site.where}: raised under `qwen3090 {cmd}`, which has no {flag}")
    print(f"flag check: {checked} (site, command) pairs with flags in the fix")
    assert checked > 10
    assert not bad, "\n".join(bad)


def test_spelled_out_commands_exist_with_their_flags() -> None:
    bad: list[str] = []
    for module, tree in _modules().items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant | ast.JoinedStr):
                continue
            for text in _text(node):
                reading = read_flags(text)
                where = f"{module.replace('.', '/')}.py:{node.lineno}"
                bad += [f"{where}: `qwen3090 {u}` is no command" for u in reading.unknown]
                for path, flags in reading.named:
                    for flag in sorted(flags - _flags_of(path)):
                        bad.append(f"{where}: `qwen3090 {path}` has no {flag}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    ("wording", "command"), [(gate.GATE_CLI, "gate"), (gate.SERVE_CLI, "serve")]
)
def test_the_gate_words_each_fix_for_its_command(wording: gate.GateCli, command: str) -> None:
    texts = (wording.busy, wording.read_failed, wording.no_gpu)
    for text in texts:
        reading = read_flags(text)
        assert reading.own <= _flags_of(command), (command, text)
        for path, flags in reading.named:
            assert flags <= _flags_of(path), (path, text)


def test_the_flag_reader_splits_own_and_named_flags() -> None:
    r = read_flags("give --model-dir DIR (e.g. `qwen3090 demo-model DIR --seed 1`), or --out")
    assert r.own == {"--model-dir", "--out"}
    assert r.named == [("demo-model", {"--seed"})]
    r = read_flags("qwen3090 fetch {} {} --dest {}")
    assert r.named == [("fetch", {"--dest"})] and not r.own
    r = read_flags("run `qwen3090 frobnicate --x`")
    assert r.unknown == ["frobnicate"]
    # The reader must be able to fail: a flag serve lacks, raised under serve.
    assert "--threshold-mib" not in _flags_of("serve")
    assert "--threshold-mib" in read_flags(gate.GATE_CLI.busy).own


def test_serve_on_the_cpu_without_a_model_suggests_a_demo_model(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from qwen3090.knobs import NAMES

    env = {k: v for k, v in os.environ.items() if k not in NAMES}
    env["PYTHONPATH"] = str(PKG.parent)
    done = subprocess.run(
        [sys.executable, "-m", "qwen3090", "serve", "--device", "cpu", "--dry-run"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "`qwen3090 demo-model DIR`, then MODEL=DIR" in done.stderr
    assert "qwen3090 fetch" not in done.stderr  # the 27B checkpoints are no CPU fix
