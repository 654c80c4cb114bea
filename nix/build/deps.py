"""auto-patchelf's dependency resolution, replayed outside Nix with the derivation's decisions.

    python deps.py check --root DIR --decisions decisions.json --derivation closure|vllm \
        [--lib DIR ...]

The rules are those of nixpkgs' pkgs/build-support/setup-hooks/auto-patchelf.py (this is an
independent implementation, not a copy): every file under --root named *.so* is a candidate
library, found by its FILE NAME wherever it lies (so the wheels' own $ORIGIN RUNPATHs play no
part), then the --lib directories (not recursively) and the non-$ORIGIN RUNPATH entries of the
libraries found there; a DT_NEEDED glibc ships is left to the dynamic linker; static
executables, objects without segments and other architectures are skipped. What Nix would
find in a buildInputs package is taken from decisions.json's `provided` (the replay has no
nixpkgs); what stays unsatisfied fails unless `ignored` names it (fnmatch patterns, as
autoPatchelfIgnoreMissingDeps). Exit 1 names every unsatisfied soname and the files needing
it, and every decision nothing needs any more.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elf import NotElf, read_elf

X86_64 = 62


@dataclass
class Resolution:
    # soname -> files needing it, for each outcome
    found: dict[str, list[Path]] = field(default_factory=dict)
    glibc: dict[str, list[Path]] = field(default_factory=dict)
    provided: dict[str, list[Path]] = field(default_factory=dict)
    ignored: dict[str, list[Path]] = field(default_factory=dict)
    missing: dict[str, list[Path]] = field(default_factory=dict)
    elf_files: int = 0


def library_index(root: Path, lib_dirs: Sequence[Path]) -> dict[str, list[Path]]:
    """File name -> directories holding it, in auto-patchelf's search order."""
    index: dict[str, list[Path]] = {}
    seen: set[Path] = set()

    def add(candidates: Iterable[Path], queue: list[Path]) -> None:
        for path in sorted(candidates):
            if not path.is_file():
                continue
            try:
                info = read_elf(path)
            except (NotElf, OSError):
                continue
            if info.machine != X86_64:
                continue
            index.setdefault(path.name, []).append(path.parent)
            queue.extend(Path(p) for p in info.runpath if p and "$ORIGIN" not in p)

    queue: list[Path] = []
    add(root.rglob("*.so*"), queue)
    queue.extend(lib_dirs)
    while queue:
        lib_dir = queue.pop(0)
        if lib_dir in seen or not lib_dir.is_dir():
            continue
        seen.add(lib_dir)
        add(lib_dir.glob("*.so*"), queue)
    return index


def resolve(root: Path, decisions: Mapping[str, Any], derivation: str,
            lib_dirs: Sequence[Path] = ()) -> Resolution:
    glibc = set(decisions["glibc"]["sonames"])
    own = decisions[derivation]
    provided = {k for k in own.get("provided", {}) if k != "_comment"}
    ignored = [k for k in own.get("ignored", {}) if k != "_comment"]
    index = library_index(root, lib_dirs)
    result = Resolution()
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        try:
            info = read_elf(path)
        except (NotElf, OSError):
            continue
        if info.is_static_executable or not info.has_segments or info.machine != X86_64:
            continue
        result.elf_files += 1
        for soname in info.needed:
            if soname.startswith("/") and Path(soname).is_file():
                continue
            if soname in glibc:
                bucket = result.glibc
            elif Path(soname).name in index:
                bucket = result.found
            elif soname in provided:
                bucket = result.provided
            elif any(fnmatch.fnmatch(Path(soname).name, p) for p in ignored):
                bucket = result.ignored
            else:
                bucket = result.missing
            bucket.setdefault(soname, []).append(path)
    return result


def stale_decisions(result: Resolution, decisions: Mapping[str, Any], derivation: str) -> list[str]:
    own = decisions[derivation]
    stale = []
    for soname in own.get("provided", {}):
        if soname != "_comment" and soname not in result.provided:
            stale.append(f"provided {soname}: nothing needs it from nixpkgs")
    for pattern in own.get("ignored", {}):
        if pattern != "_comment" and not any(
            fnmatch.fnmatch(Path(s).name, pattern) for s in result.ignored
        ):
            stale.append(f"ignored {pattern}: nothing misses it")
    return stale


def report(result: Resolution, root: Path, stale: Sequence[str]) -> list[str]:
    lines = []
    for soname, files in sorted(result.missing.items()):
        shown = ", ".join(str(f.relative_to(root)) for f in files[:5])
        more = f" (+{len(files) - 5} more)" if len(files) > 5 else ""
        lines.append(f"unsatisfied {soname}, needed by {shown}{more}")
    lines.extend(f"stale decision: {s}" for s in stale)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="resolve every ELF file's DT_NEEDED under --root")
    check.add_argument("--root", type=Path, required=True)
    check.add_argument("--decisions", type=Path, required=True)
    check.add_argument("--derivation", required=True)
    check.add_argument("--lib", type=Path, action="append", default=[])
    args = parser.parse_args(argv)
    decisions = json.loads(args.decisions.read_text())
    result = resolve(args.root, decisions, args.derivation, args.lib)
    problems = report(result, args.root, stale_decisions(result, decisions, args.derivation))
    print(
        f"{result.elf_files} ELF files: {len(result.found)} sonames found in the tree, "
        f"{len(result.glibc)} from glibc, {len(result.provided)} from nixpkgs "
        f"({', '.join(sorted(result.provided))}), {len(result.ignored)} ignored "
        f"({', '.join(sorted(result.ignored))}), {len(result.missing)} unsatisfied"
    )
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
