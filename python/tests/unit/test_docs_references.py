"""The documents the code cites exist, and say what the code relies on them for.

The tree cites the original deployment's traps by number and the design documents by name.
These tests hold python/docs to those citations:

- every gotcha number cited anywhere (python/, patches/, modules/, nix/, checks/, README.md,
  flake.nix) has an entry in python/docs/gotchas.md, under its own anchor;
- every entry says how it is handled (default, check, patch, tool, not handled yet with its
  issue, out of scope) and which tests hold it; the patches it names are in the series, the
  ``qwen3090`` subcommands it names exist, and the test functions it names are defined
  somewhere under python/tests (looked up by ``def``, not by path: tests move);
- every cited document resolves: an upper-case name ending in ".md" beside the citing file, in
  one of its parent directories or in python/docs; a path with a directory from the citing
  file's directory or a parent; "seeds/" and three digits to that file under python/docs/seeds;
  relative links inside python/docs.

The checks are plain functions, and the last tests feed them broken inputs, so each can fail.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit


def _repo_root() -> Path:
    for parent in Path(__file__).resolve().parents:
        if (parent / "python" / "docs").is_dir():
            return parent
    raise AssertionError("no python/docs above this test file")


REPO = _repo_root()
DOCS = REPO / "python" / "docs"
GOTCHAS = DOCS / "gotchas.md"
TESTS = REPO / "python" / "tests"
SCANNED = ("python", "patches", "modules", "nix", "checks", "README.md", "flake.nix")
TEXT_SUFFIXES = {".py", ".pyi", ".md", ".nix", ".patch", ".yml", ".yaml", ".sh", ".toml",
                 ".json", ".txt", ".cfg", ".ini"}
SKIPPED_DIRS = {"__pycache__", "node_modules", "build", "dist"}
MAX_BYTES = 2_000_000

KINDS = ("default", "check", "patch", "tool", "not handled yet", "out of scope")
UNHANDLED = {"not handled yet", "out of scope"}

# "gotcha 5", "gotchas 7, 43", "Gotchas 39 and 44", "gotchas 42-52", "gotcha_49" (a test name).
DASH = "-\u2013"  # a hyphen or an en dash between the ends of a range
GOTCHA_RE = re.compile(
    rf"(?<![A-Za-z])gotchas?[ \t_]+(\d+(?:\s*(?:,|and|[{DASH}])\s*\d+)*)", re.IGNORECASE
)
SEED_RE = re.compile(r"\bseeds?[/ ](\d{3})\b")
DOC_RE = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.md)\b")
ANCHOR_RE = re.compile(r'<a id="gotcha-(\d+)"></a>')
HEADING_RE = re.compile(r"^### (\d+)\. \S", re.MULTILINE)
HANDLED_RE = re.compile(r"^- Handled: \*\*([a-z ]+)\*\*(.*?)(?=^- |\Z)", re.MULTILINE | re.DOTALL)
TESTED_RE = re.compile(r"^- Tested by: (.*?)(?=^- |\Z)", re.MULTILINE | re.DOTALL)
TEST_NAME_RE = re.compile(r"`(test_\w+)`")
PATCH_RE = re.compile(r"`patches/([\w.-]+\.patch)`")
COMMAND_RE = re.compile(r"`qwen3090 ([a-z][\w-]*)(?: ([a-z][\w-]*))?")
ISSUE_RE = re.compile(r"\bissues? \d+")
LINK_RE = re.compile(r"\]\(([^)#\s]*)(?:#([\w-]+))?\)")


# ---- reading the tree -------------------------------------------------------------------------


def scanned_files(root: Path) -> Iterator[Path]:
    """The text files whose citations must resolve."""
    for name in SCANNED:
        top = root / name
        if top.is_file():
            yield top
            continue
        if not top.is_dir():
            continue
        for path in sorted(top.rglob("*")):
            rel = path.relative_to(root).parts
            if any(p.startswith(".") or p in SKIPPED_DIRS or p.endswith(".egg-info") for p in rel):
                continue
            text = path.suffix in TEXT_SUFFIXES or path.name == "series"
            if path.is_file() and text and path.stat().st_size <= MAX_BYTES:
                yield path


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def gotcha_numbers(text: str) -> set[int]:
    """Every gotcha number a text cites, ranges expanded."""
    found: set[int] = set()
    for match in GOTCHA_RE.finditer(text):
        for part in re.split(r"\s*(?:,|and)\s*", match.group(1)):
            bounds = re.split(rf"\s*[{DASH}]\s*", part)
            a, b = int(bounds[0]), int(bounds[-1])
            found.update(range(a, b + 1) if a <= b else (a, b))
    return found


def doc_citations(text: str) -> set[str]:
    """Cited documents: upper-case NAME.md, or any path with a directory ending in .md."""
    out = set()
    for match in DOC_RE.finditer(text):
        token = match.group(1)
        if "/" in token or re.fullmatch(r"[A-Z][A-Z0-9_-]*\.md", token):
            out.add(token)
    return out


def resolves(token: str, citing: Path, root: Path) -> bool:
    docs = root / "python" / "docs"
    # python/ too: the vLLM overlay's comments cite "qwen3090's benchmarks/..." from there.
    bases = [citing.parent, *[p for p in citing.parents if root in (p, *p.parents)], docs,
             root / "python"]
    return any((base / token).is_file() for base in bases)


def unresolved_citations(files: Iterable[Path], root: Path) -> list[str]:
    """``file: citation`` for every document or seed citation that names no file."""
    bad = []
    docs = root / "python" / "docs"
    for path in files:
        text = read(path)
        rel = path.relative_to(root)
        for token in sorted(doc_citations(text)):
            if not resolves(token, path, root):
                bad.append(f"{rel}: {token}")
        for seed in sorted(set(SEED_RE.findall(text))):
            if not (docs / "seeds" / f"{seed}.md").is_file():
                bad.append(f"{rel}: seeds/{seed}")
    return bad


def defined_tests(tests: Path) -> set[str]:
    names: set[str] = set()
    for path in tests.rglob("*.py"):
        names.update(re.findall(r"^\s*(?:async\s+)?def (test_\w+)\s*\(", read(path), re.MULTILINE))
    return names


def subcommands() -> dict[str, set[str]]:
    """``qwen3090``'s subcommands and, for those that have them, their own subcommands."""
    from qwen3090 import cli

    def choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    return {name: set(choices(sub)) for name, sub in choices(cli.build_parser()).items()}


# ---- reading gotchas.md -----------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    number: int
    text: str


def entries(markdown: str) -> list[Entry]:
    anchors = list(ANCHOR_RE.finditer(markdown))
    out = []
    for i, anchor in enumerate(anchors):
        end = anchors[i + 1].start() if i + 1 < len(anchors) else len(markdown)
        out.append(Entry(int(anchor.group(1)), markdown[anchor.end():end]))
    return out


def entry_problems(
    entry: Entry,
    tests: set[str],
    series: set[str],
    commands: dict[str, set[str]],
) -> list[str]:
    """What is wrong with one entry; empty when nothing is."""
    n = entry.number
    problems = []
    heading = HEADING_RE.search(entry.text)
    if heading is None or int(heading.group(1)) != n:
        problems.append(f"gotcha {n}: no '### {n}. ...' heading under its anchor")
    handled = HANDLED_RE.findall(entry.text)
    if not handled:
        problems.append(f"gotcha {n}: no '- Handled: **kind**' line")
    kinds = set()
    for kind, rest in handled:
        kinds.add(kind)
        if kind not in KINDS:
            problems.append(f"gotcha {n}: unknown kind {kind!r} (one of {', '.join(KINDS)})")
        if kind == "not handled yet" and not ISSUE_RE.search(rest):
            problems.append(f"gotcha {n}: 'not handled yet' names no issue")
        if kind == "patch" and not PATCH_RE.search(rest):
            problems.append(f"gotcha {n}: a patch handling names no patches/*.patch")
        if kind == "out of scope" and len(rest.strip(" -—\n")) < 20:
            problems.append(f"gotcha {n}: 'out of scope' without a reason")
    for patch in PATCH_RE.findall(entry.text):
        if patch not in series:
            problems.append(f"gotcha {n}: patches/{patch} is not in patches/series")
    for command, action in COMMAND_RE.findall(entry.text):
        if command not in commands:
            problems.append(f"gotcha {n}: `qwen3090 {command}` is not a subcommand")
        elif action and commands[command] and action not in commands[command]:
            problems.append(f"gotcha {n}: `qwen3090 {command} {action}` is not a subcommand")
    tested = TESTED_RE.findall(entry.text)
    if len(tested) != 1:
        problems.append(f"gotcha {n}: needs exactly one '- Tested by:' line")
    else:
        names = TEST_NAME_RE.findall(tested[0])
        if not names and not (kinds and kinds <= UNHANDLED):
            problems.append(f"gotcha {n}: handled, but names no test function")
        if not names and not tested[0].strip().startswith("nothing"):
            problems.append(f"gotcha {n}: 'Tested by:' names no test and does not say 'nothing'")
        missing = [t for t in names if t not in tests]
        problems += [f"gotcha {n}: no `def {t}` under python/tests" for t in missing]
    return problems


def doc_problems(markdown: str, cited: set[int], tests: set[str], series: set[str],
                 commands: dict[str, set[str]]) -> list[str]:
    found = entries(markdown)
    numbers = [e.number for e in found]
    problems = [f"gotcha {n}: more than one entry" for n in sorted(set(numbers))
                if numbers.count(n) > 1]
    if numbers and sorted(set(numbers)) != list(range(1, max(numbers) + 1)):
        missing = sorted(set(range(1, max(numbers) + 1)) - set(numbers))
        problems.append(f"entries missing from the numbering: {missing}")
    problems += [f"gotcha {n} is cited but has no entry" for n in sorted(cited - set(numbers))]
    for entry in found:
        problems += entry_problems(entry, tests, series, commands)
    return problems


def series_patches(root: Path) -> set[str]:
    series = root / "patches" / "series"
    lines = read(series).splitlines() if series.is_file() else []
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def cited_gotchas(files: Iterable[Path]) -> dict[int, list[str]]:
    where: dict[int, list[str]] = {}
    for path in files:
        for n in gotcha_numbers(read(path)):
            where.setdefault(n, []).append(str(path.relative_to(REPO)))
    return where


# ---- the tree ---------------------------------------------------------------------------------


# This file's own strings are deliberately bogus citations; the tests below read the rest.
THIS = Path(__file__).resolve()


def test_every_cited_gotcha_has_a_complete_entry() -> None:
    files = [p for p in scanned_files(REPO) if p not in (GOTCHAS, THIS)]
    cited = cited_gotchas(files)
    assert len(cited) >= 40, "the scan found too few citations to be looking at the tree"
    problems = doc_problems(read(GOTCHAS), set(cited), defined_tests(TESTS),
                            series_patches(REPO), subcommands())
    assert problems == [], "\n".join(problems)
    assert {e.number for e in entries(read(GOTCHAS))} >= set(range(1, 55))  # the original 54


def test_every_cited_document_resolves() -> None:
    files = [p for p in scanned_files(REPO) if p != THIS]
    assert any(doc_citations(read(p)) for p in files)
    bad = unresolved_citations(files, REPO)
    assert bad == [], "\n".join(bad)


def test_links_inside_the_docs_resolve() -> None:
    anchors = {f"gotcha-{e.number}" for e in entries(read(GOTCHAS))}
    bad = []
    for path in sorted(DOCS.rglob("*.md")):
        for target, anchor in LINK_RE.findall(read(path)):
            if target.startswith(("http://", "https://")):
                continue
            dest = (path.parent / target).resolve() if target else path
            if not dest.exists():
                bad.append(f"{path.relative_to(REPO)}: {target}")
            elif anchor and dest == GOTCHAS.resolve() and anchor not in anchors:
                bad.append(f"{path.relative_to(REPO)}: {target}#{anchor}")
    assert bad == [], "\n".join(bad)


# ---- the checks can fail ----------------------------------------------------------------------

WORD = "gotcha"


def test_citation_forms_are_all_read() -> None:
    text = (f"({WORD} 5) ({WORD}s 7, 43) ({WORD.title()}s 39 and 44) ({WORD}s 1, 6, 42-45) "
            f"def test_x_on_the_{WORD}_49_figures")
    assert gotcha_numbers(text) == {1, 5, 6, 7, 39, 42, 43, 44, 45, 49}


def _real_inputs() -> tuple[str, set[str], set[str], dict[str, set[str]]]:
    return read(GOTCHAS), defined_tests(TESTS), series_patches(REPO), subcommands()


def test_a_removed_entry_is_reported() -> None:
    markdown, tests, series, commands = _real_inputs()
    start = markdown.index('<a id="gotcha-33"></a>')
    end = markdown.index('<a id="gotcha-34"></a>')
    problems = doc_problems(markdown[:start] + markdown[end:], {33}, tests, series, commands)
    assert "gotcha 33 is cited but has no entry" in problems
    assert "entries missing from the numbering: [33]" in problems


def test_a_citation_beyond_the_list_is_reported() -> None:
    markdown, tests, series, commands = _real_inputs()
    cited = gotcha_numbers(f"see {WORD} {len(entries(markdown)) + 1}")
    assert doc_problems(markdown, cited, tests, series, commands) == [
        f"gotcha {len(entries(markdown)) + 1} is cited but has no entry"
    ]


def test_an_entry_without_handling_or_tests_is_reported() -> None:
    markdown, tests, series, commands = _real_inputs()
    entry = next(e for e in entries(markdown) if e.number == 36)
    assert entry_problems(entry, tests, series, commands) == []
    no_handling = Entry(36, re.sub(r"^- Handled:.*\n", "", entry.text, flags=re.MULTILINE))
    assert "gotcha 36: no '- Handled: **kind**' line" in entry_problems(
        no_handling, tests, series, commands)
    no_tests = Entry(36, TESTED_RE.sub("- Tested by: nothing.\n", entry.text))
    assert entry_problems(no_tests, tests, series, commands) == [
        "gotcha 36: handled, but names no test function"
    ]


def test_a_test_that_does_not_exist_is_reported() -> None:
    markdown, tests, series, commands = _real_inputs()
    entry = next(e for e in entries(markdown) if e.number == 36)
    renamed = Entry(36, entry.text.replace("`test_mid_grammar", "`test_no_such_grammar"))
    assert entry_problems(renamed, tests, series, commands) == [
        "gotcha 36: no `def test_no_such_grammar_rejection_still_fails` under python/tests"
    ]


def test_a_bogus_patch_command_or_unhandled_without_issue_is_reported() -> None:
    markdown, tests, series, commands = _real_inputs()
    # A real entry with no problem, then three bad lines added to it.
    entry = next(e for e in entries(markdown) if e.number == 46)
    assert entry_problems(entry, tests, series, commands) == []
    text = (entry.text + "- Handled: **not handled yet** — nobody owns it.\n"
            + "- Handled: **patch** `patches/no-such.patch`, see `qwen3090 no-such-tool`.\n")
    problems = entry_problems(Entry(46, text), tests, series, commands)
    assert "gotcha 46: 'not handled yet' names no issue" in problems
    assert "gotcha 46: patches/no-such.patch is not in patches/series" in problems
    assert "gotcha 46: `qwen3090 no-such-tool` is not a subcommand" in problems


def test_a_bogus_document_citation_is_reported(tmp_path: Path) -> None:
    (tmp_path / "python" / "docs" / "seeds").mkdir(parents=True)
    (tmp_path / "python" / "docs" / "PLAN" ".md").write_text("x")
    (tmp_path / "python" / "docs" / "seeds" / "001.md").write_text("x")
    code = tmp_path / "python" / "pkg" / "mod.py"
    code.parent.mkdir()
    code.write_text(
        "# see " + "PLAN" + ".md, " + "NOPE" + ".md, docs/" + "gone" + ".md, table.md,\n"
        "# seeds" + "/001 and seeds" + "/002 and https://example.org/x/" + "READ" + "ME" + ".md\n"
    )
    assert unresolved_citations(scanned_files(tmp_path), tmp_path) == [
        "python/pkg/mod.py: NOPE.md",
        "python/pkg/mod.py: docs/gone.md",
        "python/pkg/mod.py: seeds/002",
    ]
