"""Which of vLLM's own tests the upstream tier runs, and which differences a patch declares.

Modules: every ``vllm/**/*.py`` file a patch of ``patches/series`` edits (its diff sections) or
adds (its ``# adds:`` header lines), read from the series at run time.

Selection rule, per module M (``vllm/a/b/stem.py``, dotted ``vllm.a.b.stem``): a file of the
sdist's ``tests/`` whose name starts with ``test_`` is selected if

- its name is ``test_<stem>.py`` or ``test_<stem>_*.py`` (named for M: the stem ends at a word
  boundary, so ``test_cudagraph_mode.py`` is not named for ``cuda.py``), or
- it imports M by name: ``import vllm.a.b.stem``, ``from vllm.a.b.stem import ...`` or
  ``from vllm.a.b import stem`` (absolute imports anywhere in the file, read with ``ast``),

except that a module imported by more than ``INFRASTRUCTURE_IMPORTERS`` test files is
infrastructure (``vllm.envs``, ``vllm.utils.import_utils``): a test that imports it uses it
without testing it, so only the name match selects for it. The bound sits between the real
test suites of modules the series patches (``vllm.v1.core.kv_cache_utils`` has 25 importers,
nearly all scheduler, prefix-cache and KV-connector tests) and the infrastructure modules
(35 and 53 importers in 0.28.0); the tier's report prints every module's count, so a shift
of either side shows there.

Accepted differences: a patch that knowingly changes behaviour an upstream test pins names the
test in its header, one line per test::

    # upstream-changes: tests/v1/core/test_x.py::test_y — why the patch must change it

patchtool treats the line as commentary; the tier accepts exactly that test id failing on the
patched tree only.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from qwen3090 import patchtool

INFRASTRUCTURE_IMPORTERS = 30
_UPSTREAM_CHANGES = re.compile(r"^#\s*upstream-changes:\s*(\S+)\s*(?:[—-]+\s*(.*))?$")


@dataclass(frozen=True)
class Module:
    path: str
    """``vllm/a/b/stem.py``, as the patch names it."""
    patches: tuple[str, ...]
    """File names of the patches that edit or add it, in series order."""

    @property
    def dotted(self) -> str:
        return self.path[: -len(".py")].replace("/", ".")

    @property
    def stem(self) -> str:
        return Path(self.path).stem


@dataclass(frozen=True)
class Selection:
    module: Module
    by_name: tuple[str, ...]
    """Test files (relative to the sdist root, ``tests/...``) named for the module."""
    by_import: tuple[str, ...]
    """Test files importing the module, whether or not the import counts (see ``counted``)."""
    infrastructure: bool
    """More than INFRASTRUCTURE_IMPORTERS importers: only ``by_name`` selects."""

    @property
    def files(self) -> tuple[str, ...]:
        chosen = set(self.by_name) if self.infrastructure else {*self.by_name, *self.by_import}
        return tuple(sorted(chosen))


@dataclass(frozen=True)
class AcceptedChange:
    test_id: str
    patch: str
    why: str


def patched_modules(patches_dir: Path) -> tuple[Module, ...]:
    """Every Python module of vLLM that the series edits or adds, in first-touched order."""
    series = patchtool.load_series(patches_dir)
    owners: dict[str, list[str]] = {}
    for patch in series.patches:
        for path in patch.files:
            if path.endswith(".py"):
                owners.setdefault(path, []).append(patch.file)
    return tuple(Module(path, tuple(files)) for path, files in owners.items())


def accepted_changes(patches_dir: Path) -> tuple[AcceptedChange, ...]:
    """The ``# upstream-changes:`` lines of the series' patch headers."""
    series = patchtool.load_series(patches_dir)
    found: list[AcceptedChange] = []
    for patch in series.patches:
        for line in patch.path.read_text(encoding="utf-8").splitlines():
            if line.startswith(("--- ", "diff ")):
                break
            m = _UPSTREAM_CHANGES.match(line)
            if m:
                if "::" not in m.group(1) or not (m.group(2) or "").strip():
                    raise ValueError(
                        f"{patch.path}: {line!r} must read '# upstream-changes: "
                        "tests/<file>.py::<test> — <why>'; fix the header line")
                found.append(AcceptedChange(m.group(1), patch.file, m.group(2).strip()))
    return tuple(found)


def imported_modules(source: str) -> set[str]:
    """Dotted names a file imports absolutely; ``from p import n`` yields ``p`` and ``p.n``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def sdist_test_files(sdist_root: Path) -> dict[str, set[str]]:
    """``tests/**/test_*.py`` of an unpacked sdist -> the modules each imports."""
    found: dict[str, set[str]] = {}
    for path in sorted((sdist_root / "tests").rglob("test_*.py")):
        rel = path.relative_to(sdist_root).as_posix()
        found[rel] = imported_modules(path.read_text(encoding="utf-8", errors="replace"))
    return found


def select(modules: tuple[Module, ...], tests: dict[str, set[str]]) -> tuple[Selection, ...]:
    """Apply the selection rule of this module's docstring to each module."""
    selections = []
    for module in modules:
        exact, prefix = f"test_{module.stem}.py", f"test_{module.stem}_"
        by_name = tuple(f for f in tests
                        if Path(f).name == exact or Path(f).name.startswith(prefix))
        by_import = tuple(f for f, imports in tests.items() if module.dotted in imports)
        selections.append(Selection(module, by_name, by_import,
                                    len(by_import) > INFRASTRUCTURE_IMPORTERS))
    return tuple(selections)


def selected_files(selections: tuple[Selection, ...]) -> tuple[str, ...]:
    return tuple(sorted({f for s in selections for f in s.files}))
