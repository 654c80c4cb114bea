"""Apply and verify qwen3090's vLLM patch series. Standard library only.

This file runs inside the Nix build with nothing but ``python3`` and GNU ``patch``, so it
imports nothing outside the standard library and works as a standalone script.

Stable command line (the Nix check and ``python/dev.sh`` call it; exit 0 ok, 1 the tree or a
patch failed, 2 bad input)::

    python3 patchtool.py apply  --root DIR --patches DIR [--jobs N] [--no-compile]
        Apply every patch of DIR/series, in order, to the vLLM tree under --root (the directory
        that CONTAINS vllm/: an sdist root, an unpacked wheel, site-packages). Fails, naming
        the patch, file and hunk, on any rejected hunk, fuzz or offset. Then deletes every
        __pycache__ under vllm/ and byte-compiles it with checked-hash pycs (PEP 552), and
        writes vllm/_qwen3090/{manifest.json, series, *.patch, overlay/}. Prints the elapsed
        time.
    python3 patchtool.py verify --root DIR [--patches DIR] [--json]
        Per patch: applied / partial / not-applied / not-applicable. --patches defaults to
        the copy the apply step stored in vllm/_qwen3090/. Exit 0 only if all are applied.
    python3 patchtool.py check  --patches DIR
        Validate the series, the directory and every patch header; print the series digest.
    python3 patchtool.py digest --patches DIR
        Print the series digest ("sha256:<hex>") and nothing else.

Series file (``patches/series``): one patch file name a line, in apply order; ``#`` starts a
comment. One comment is structured: ``# vllm-version: 0.28.0`` names the vLLM release every
patch is written against; a tree of another version is refused by ``apply`` and reported
"not-applicable" by ``verify``. Every ``*.patch`` in the directory must be listed and every
listed file must exist.

Overlay (``patches/overlay/``): files the series ADDS to vLLM are kept whole, as ordinary
source at their vLLM path under ``overlay/`` (``overlay/vllm/x/y.py`` becomes ``vllm/x/y.py``),
so they are linted, type-checked and tested like any module; the ``*.patch`` files hold only
edits to vLLM's own files. A patch names each file it adds with an ``# adds: vllm/x/y.py``
header line (repeatable). ``apply`` copies a patch's added files, byte for byte, just before
its diff and refuses if one already exists in the tree; ``verify`` compares their bytes.
Every file under ``overlay/`` must be named by exactly one patch and every named file must
exist there (``__pycache__`` and ``*.pyc``, which importing an overlay file leaves, are
skipped). The patch that adds a file may not also edit it; a later one may.

Patch file: a unified diff with paths ``a/vllm/...`` / ``b/vllm/...``, preceded by a header of
``# key: value`` lines: ``qwen3090-patch`` (= file stem), ``summary``, ``why`` (required) and
``provides-env``, ``provides-flag``, ``provides-feature``, ``adds`` (optional, repeatable, comma
or space separated). An indented ``#   ...`` line continues the previous value.

Series digest: sha256 of ``"qwen3090-series 2\\nvllm <version>\\n"`` followed, per patch in
series order, by one ``"<sha256 of the patch file>  <file name>\\n"`` line and one
``"<sha256 of the file>  overlay/<path>\\n"`` line per file it adds, in header order.
"""

from __future__ import annotations

import argparse
import compileall
import hashlib
import json
import os
import py_compile
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

MANIFEST_SCHEMA = 1
STORE_DIR = Path("vllm") / "_qwen3090"
MANIFEST_NAME = "manifest.json"
SERIES_NAME = "series"
OVERLAY_NAME = "overlay"
DIGEST_PREFIX = "qwen3090-series 2\n"

HEADER_KEYS = {
    "qwen3090-patch",
    "summary",
    "why",
    "provides-env",
    "provides-flag",
    "provides-feature",
    "adds",
}
REQUIRED_KEYS = ("qwen3090-patch", "summary", "why")
LIST_KEYS = {"provides-env": "env", "provides-flag": "flags", "provides-feature": "features"}
# Paths no patch may create or touch: backups and bytecode are nobody's source (gotcha 54:
# a patch that carried .orig copies made the verifier demand them).
JUNK_SUFFIXES = (".orig", ".rej", ".pyc", ".pyo", "~", ".bak", ".swp")

HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
PATCH_FILE_LINE_RE = re.compile(r"^(checking|patching) file (.+)$")
PATCH_HUNK_RE = re.compile(r"^Hunk #(\d+) (.*)$")
SUMMARY_RE = re.compile(r"^\d+ out of \d+ hunks? (FAILED|ignored)")
VERSION_RE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)


class PatchToolError(Exception):
    """A failure to report to the user as one message (exit status ``code``)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class Hunk:
    number: int
    """1-based index within its file section, as GNU patch counts ("Hunk #N")."""
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    header: str


@dataclass(frozen=True)
class FileDiff:
    old_path: str | None
    """Path after stripping one component; None for /dev/null (a created file)."""
    new_path: str | None
    """None for /dev/null (a deleted file)."""
    hunks: tuple[Hunk, ...]
    text: str
    """This section alone, as a patch GNU patch can apply by itself."""

    @property
    def path(self) -> str:
        path = self.new_path or self.old_path
        assert path is not None
        return path

    @property
    def creates(self) -> bool:
        return self.old_path is None

    @property
    def deletes(self) -> bool:
        return self.new_path is None


@dataclass(frozen=True)
class PatchHeader:
    name: str
    summary: str
    why: str
    env: tuple[str, ...]
    flags: tuple[str, ...]
    features: tuple[str, ...]
    adds: tuple[str, ...] = ()
    """vLLM paths (``vllm/...``) this patch adds, copied from the series' overlay."""


@dataclass(frozen=True)
class AddedFile:
    """A whole file the patch adds: ``source`` is its copy under ``overlay/``."""

    path: str
    source: Path
    sha256: str


@dataclass(frozen=True)
class Patch:
    file: str
    path: Path
    sha256: str
    header: PatchHeader
    sections: tuple[FileDiff, ...]
    added: tuple[AddedFile, ...] = ()
    """The header's ``adds``, resolved against the overlay by :func:`load_series`."""

    @property
    def name(self) -> str:
        return self.header.name

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*self.header.adds, *(s.path for s in self.sections)]))

    @property
    def creates(self) -> tuple[str, ...]:
        return (*self.header.adds, *(s.path for s in self.sections if s.creates))


@dataclass(frozen=True)
class Series:
    directory: Path
    vllm_version: str | None
    patches: tuple[Patch, ...]
    text: str

    @property
    def digest(self) -> str:
        h = hashlib.sha256(DIGEST_PREFIX.encode())
        h.update(f"vllm {self.vllm_version or 'unspecified'}\n".encode())
        for p in self.patches:
            h.update(f"{p.sha256}  {p.file}\n".encode())
            for a in p.added:
                h.update(f"{a.sha256}  {OVERLAY_NAME}/{a.path}\n".encode())
        return "sha256:" + h.hexdigest()


def _split_values(value: str) -> list[str]:
    return [v for v in re.split(r"[,\s]+", value) if v]


def parse_header(text: str, file: str) -> PatchHeader:
    """The ``# key: value`` block before the first ``diff ``/``--- `` line."""
    values: dict[str, list[str]] = {}
    last: str | None = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith(("diff ", "--- ")):
            break
        if not line.startswith("#"):
            last = None
            continue
        body = line[1:]
        if body.strip() == "":
            last = None
            continue
        m = re.match(r"^ ([a-z0-9-]+):(.*)$", body)
        if m and m.group(1) in HEADER_KEYS:
            last = m.group(1)
            values.setdefault(last, []).append(m.group(2).strip())
        elif m and m.group(1).startswith(("qwen3090", "provides", "summary", "why", "add")):
            raise PatchToolError(f"{file}:{lineno}: unknown header key {m.group(1)!r}")
        elif body.startswith("  ") and last is not None:
            values[last].append(body.strip())
        # Any other "#" line is free commentary.
    for key in REQUIRED_KEYS:
        if not values.get(key) or not " ".join(values[key]).strip():
            raise PatchToolError(f"{file}: header lacks '# {key}: ...'")
    name = " ".join(values["qwen3090-patch"]).strip()
    stem = file[: -len(".patch")] if file.endswith(".patch") else file
    if name != stem:
        raise PatchToolError(f"{file}: header names the patch {name!r}, the file stem is {stem!r}")
    lists: dict[str, tuple[str, ...]] = {}
    for key, attr in LIST_KEYS.items():
        items = [v for chunk in values.get(key, []) for v in _split_values(chunk)]
        lists[attr] = tuple(dict.fromkeys(items))
    adds: list[str] = []
    for value in (v for chunk in values.get("adds", []) for v in _split_values(chunk)):
        path = _vllm_path(value, file, "# adds:")
        if path in adds:
            raise PatchToolError(f"{file}: '# adds: {path}' is listed twice")
        adds.append(path)
    return PatchHeader(
        name=name,
        summary=" ".join(values["summary"]),
        why=" ".join(values["why"]),
        env=lists["env"],
        flags=lists["flags"],
        features=lists["features"],
        adds=tuple(adds),
    )


def _strip_path(raw: str, file: str, lineno: int) -> str | None:
    path = raw.split("\t", 1)[0].strip()
    if path == "/dev/null":
        return None
    parts = path.split("/", 1)
    if len(parts) != 2 or not parts[1]:
        raise PatchToolError(f"{file}:{lineno}: path {path!r} has no a/ or b/ prefix")
    return _vllm_path(parts[1], f"{file}:{lineno}", f"path {path!r}")


def _vllm_path(path: str, where: str, what: str) -> str:
    """``path`` if it is a plain source path under ``vllm/`` a patch may create or edit."""
    segments = path.split("/")
    if path.startswith("/") or ".." in segments or "" in segments or segments[0] != "vllm":
        raise PatchToolError(f"{where}: {what} is not a relative path under vllm/")
    if path.endswith(JUNK_SUFFIXES) or "__pycache__" in segments:
        raise PatchToolError(
            f"{where}: patch touches {path!r}, a backup or bytecode file that is "
            "nobody's source (gotcha 54); remove it from the patch"
        )
    if path.startswith(STORE_DIR.as_posix() + "/"):
        raise PatchToolError(f"{where}: {path!r} is the apply tool's own directory")
    return path


def parse_diff(text: str, file: str, allow_empty: bool = False) -> tuple[FileDiff, ...]:
    """Split a unified diff into per-file sections, checking every hunk's line counts.

    ``allow_empty``: a patch that adds files may have no diff at all.
    """
    lines = text.splitlines(keepends=True)
    sections: list[FileDiff] = []
    i = 0
    n = len(lines)
    while i < n:
        line = lines[i]
        if line.startswith(("GIT binary patch", "Binary files ")):
            raise PatchToolError(f"{file}:{i + 1}: binary diffs are not supported")
        if line.startswith(("rename from ", "copy from ")):
            raise PatchToolError(f"{file}:{i + 1}: renames/copies are not supported; "
                                 "write them as a deletion and a creation")
        if not (line.startswith("--- ") and i + 1 < n and lines[i + 1].startswith("+++ ")):
            i += 1
            continue
        start = i
        old = _strip_path(line[4:], file, i + 1)
        new = _strip_path(lines[i + 1][4:], file, i + 2)
        if old is None and new is None:
            raise PatchToolError(f"{file}:{i + 1}: both sides are /dev/null")
        if old is not None and new is not None and old != new:
            raise PatchToolError(
                f"{file}:{i + 1}: {old!r} and {new!r} differ (renames are not supported)")
        i += 2
        hunks: list[Hunk] = []
        while i < n:
            m = HUNK_RE.match(lines[i])
            if not m:
                break
            header = lines[i].rstrip("\n")
            old_len = int(m.group(2)) if m.group(2) is not None else 1
            new_len = int(m.group(4)) if m.group(4) is not None else 1
            hunks.append(Hunk(len(hunks) + 1, int(m.group(1)), old_len, int(m.group(3)), new_len,
                              header))
            i += 1
            need_old, need_new = old_len, new_len
            while need_old > 0 or need_new > 0:
                if i >= n:
                    raise PatchToolError(f"{file}: hunk {header!r} ends early")
                body = lines[i]
                tag = body[:1]
                if tag in (" ", "\n", "\r"):
                    need_old -= 1
                    need_new -= 1
                elif tag == "-":
                    need_old -= 1
                elif tag == "+":
                    need_new -= 1
                elif tag != "\\":
                    raise PatchToolError(f"{file}:{i + 1}: unexpected line inside hunk {header!r}")
                if need_old < 0 or need_new < 0:
                    raise PatchToolError(f"{file}:{i + 1}: hunk {header!r} has more lines than "
                                         "its header counts")
                i += 1
            while i < n and lines[i].startswith("\\"):
                i += 1
        if not hunks:
            raise PatchToolError(f"{file}:{start + 1}: file section without hunks")
        path = new or old
        if any(s.path == path for s in sections):
            raise PatchToolError(f"{file}: {path} appears in two sections; merge them")
        sections.append(FileDiff(old, new, tuple(hunks), "".join(lines[start:i])))
    if not sections and not allow_empty:
        raise PatchToolError(f"{file}: no unified diff found")
    return tuple(sections)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_patch(path: Path, overlay: Path | None = None) -> Patch:
    """One patch file; with ``overlay`` (the series' overlay directory) its added files too."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise PatchToolError(f"cannot read patch {path}: {err}") from err
    header = parse_header(text, path.name)
    sections = parse_diff(text, path.name, allow_empty=bool(header.adds))
    for section in sections:
        if section.path in header.adds:
            raise PatchToolError(
                f"{path.name}: adds {section.path} and also has a diff section for it; edit "
                f"the overlay file ({OVERLAY_NAME}/{section.path}) instead")
    added: list[AddedFile] = []
    if overlay is not None:
        for rel in header.adds:
            source = overlay / rel
            if not source.is_file():
                raise PatchToolError(
                    f"{path.name} names '# adds: {rel}', but {source} does not exist; add the "
                    "file to the overlay or remove the header line")
            added.append(AddedFile(rel, source, sha256_file(source)))
    return Patch(
        file=path.name,
        path=path,
        sha256=sha256_file(path),
        header=header,
        sections=sections,
        added=tuple(added),
    )


def overlay_files(overlay: Path) -> list[str]:
    """Every file under ``overlay`` as a vLLM path, skipping what importing one leaves."""
    if not overlay.is_dir():
        return []
    found: list[str] = []
    for path in sorted(overlay.rglob("*")):
        rel = path.relative_to(overlay)
        if "__pycache__" in rel.parts or path.suffix in (".pyc", ".pyo"):
            continue
        if path.is_file() or path.is_symlink():
            found.append(rel.as_posix())
    return found


def parse_series_text(text: str) -> tuple[str | None, list[str]]:
    """(vllm version directive, patch file names) of a series file's text."""
    version: str | None = None
    names: list[str] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        m = re.match(r"^#\s*vllm-version:\s*(\S+)\s*$", raw)
        if m:
            version = m.group(1)
            continue
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if "/" in line or not line.endswith(".patch") or " " in line:
            raise PatchToolError(
                f"series:{lineno}: {line!r} is not a bare '<name>.patch' file name")
        if line in names:
            raise PatchToolError(f"series:{lineno}: {line} is listed twice")
        names.append(line)
    return version, names


def load_series(directory: Path) -> Series:
    """Read ``directory/series`` and every patch; the list and the directory must agree."""
    series_path = directory / SERIES_NAME
    try:
        text = series_path.read_text(encoding="utf-8")
    except OSError as err:
        raise PatchToolError(f"cannot read {series_path}: {err.strerror}") from err
    version, names = parse_series_text(text)
    on_disk = {p.name for p in directory.glob("*.patch") if p.is_file()}
    for name in names:
        if name not in on_disk:
            raise PatchToolError(f"series lists {name}, but {directory / name} does not exist")
    for name in sorted(on_disk - set(names)):
        raise PatchToolError(f"{directory / name} is not listed in {series_path}; "
                             "append it to the series or delete it")
    overlay = directory / OVERLAY_NAME
    patches = tuple(load_patch(directory / name, overlay) for name in names)
    seen: dict[str, str] = {}
    for p in patches:
        if p.name in seen:
            raise PatchToolError(f"{p.file} and {seen[p.name]} share the name {p.name!r}")
        seen[p.name] = p.file
    adder: dict[str, str] = {}
    for p in patches:
        for rel in p.header.adds:
            if rel in adder:
                raise PatchToolError(f"{p.file} and {adder[rel]} both add {rel}")
            adder[rel] = p.file
    for rel in overlay_files(overlay):
        if rel not in adder:
            raise PatchToolError(
                f"{overlay / rel} is added by no patch; name it in a patch header "
                f"('# adds: {rel}') or delete it")
    return Series(directory, version, patches, text)


def tree_vllm_version(root: Path) -> str | None:
    """The version in ``vllm/_version.py`` (setuptools-scm writes it), read without importing."""
    try:
        text = (root / "vllm" / "_version.py").read_text(encoding="utf-8")
    except OSError:
        return None
    m = VERSION_RE.search(text)
    return m.group(1) if m else None


def base_version(version: str) -> str:
    """``0.28.0+cpu`` and ``0.28.0`` are the same release for the series."""
    return version.split("+", 1)[0]


# --------------------------------------------------------------------------- GNU patch


@dataclass
class PatchRun:
    ok: bool
    """Every hunk applied exactly: no failure, no fuzz, no offset, nothing skipped."""
    problems: list[str] = field(default_factory=list)
    output: str = ""


def run_gnu_patch(
    root: Path, patch_text: str, *, reverse: bool = False, dry_run: bool = True
) -> PatchRun:
    """Run GNU patch with zero fuzz on ``root`` and judge its output strictly.

    Any line of output other than "checking/patching file X" means the patch did not apply
    exactly (offset, fuzz, failure, missing file, reversed patch, ...), so it is a problem.
    """
    argv = ["patch", "-p1", "--fuzz=0", "--force", "--no-backup-if-mismatch",
            "--reject-file=-", "--quoting-style=literal", "-d", str(root)]
    if reverse:
        argv.append("--reverse")
    if dry_run:
        argv.append("--dry-run")
    env = dict(os.environ, LC_ALL="C", LANG="C")
    env.pop("POSIXLY_CORRECT", None)
    env.pop("PATCH_GET", None)
    env.pop("SIMPLE_BACKUP_SUFFIX", None)
    env.pop("VERSION_CONTROL", None)
    try:
        proc = subprocess.run(argv, input=patch_text, capture_output=True, text=True, env=env,
                              check=False)
    except FileNotFoundError as err:
        raise PatchToolError("GNU patch is not installed (the 'patch' program)") from err
    output = proc.stdout + proc.stderr
    problems: list[str] = []
    current = "?"
    for line in output.splitlines():
        fm = PATCH_FILE_LINE_RE.match(line)
        if fm:
            current = fm.group(2)
            continue
        hm = PATCH_HUNK_RE.match(line)
        if hm:
            problems.append(f"{current}: hunk #{hm.group(1)} {hm.group(2).rstrip('.')}")
            continue
        if line.strip():
            problems.append(f"{current}: {line.strip()}")
    if proc.returncode != 0 and not problems:
        problems.append(f"patch exited with status {proc.returncode}")
    return PatchRun(ok=proc.returncode == 0 and not problems, problems=problems, output=output)


def _hunk_label(section: FileDiff, problem: str) -> str:
    m = re.search(r"hunk #(\d+)", problem)
    if m:
        number = int(m.group(1))
        for h in section.hunks:
            if h.number == number:
                return f"{problem} [{h.header}]"
    return problem


# --------------------------------------------------------------------------- apply


def _check_tree(root: Path, series: Series) -> str:
    if not (root / "vllm" / "__init__.py").is_file():
        raise PatchToolError(f"{root} does not contain vllm/__init__.py; --root must be the "
                             "directory that contains vllm/")
    version = tree_vllm_version(root)
    if version is None:
        raise PatchToolError(f"cannot read the vLLM version from {root / 'vllm/_version.py'}")
    if series.vllm_version and base_version(version) != series.vllm_version:
        raise PatchToolError(f"{root} holds vLLM {version}; the series is written against "
                             f"vLLM {series.vllm_version}")
    return version


def apply_patch(root: Path, patch: Patch) -> None:
    """Dry-run first so a failing patch leaves the tree untouched, then copy the files it
    adds and apply its diff for real."""
    for rel in patch.creates:
        if (root / rel).exists() or (root / rel).is_symlink():
            raise PatchToolError(f"patch {patch.file}: creates {rel}, which already "
                                 "exists in the tree", code=1)
    if len(patch.added) != len(patch.header.adds):
        raise PatchToolError(f"patch {patch.file} adds files but was loaded without its "
                             "overlay; load it through load_series")
    text = "".join(s.text for s in patch.sections)
    if not text:
        _copy_added(root, patch)
        return
    probe = run_gnu_patch(root, text, dry_run=True)
    if not probe.ok:
        labels = [_label_for(patch, p) for p in probe.problems
                  if not SUMMARY_RE.match(p.split(": ", 1)[-1])]
        hint = ""
        if run_gnu_patch(root, text, reverse=True, dry_run=True).ok:
            hint = "\n  (its reverse applies exactly: the tree already carries this patch)"
        raise PatchToolError(
            f"patch {patch.file} does not apply exactly (fuzz 0, no offset):\n  "
            + "\n  ".join(labels) + hint, code=1)
    _copy_added(root, patch)
    real = run_gnu_patch(root, text, dry_run=False)
    if not real.ok:
        raise PatchToolError(f"patch {patch.file} failed after a clean dry run:\n"
                             + real.output, code=1)


def _copy_added(root: Path, patch: Patch) -> None:
    for added in patch.added:
        target = root / added.path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(added.source, target)


def _label_for(patch: Patch, problem: str) -> str:
    for section in patch.sections:
        if problem.startswith(section.path + ":"):
            return _hunk_label(section, problem)
    return problem


def byte_compile(root: Path, jobs: int) -> None:
    """Delete every pyc under vllm/ and compile all sources with checked-hash pycs.

    A checked-hash pyc carries the sha256-derived hash of its source and the interpreter
    recompiles when they differ, so no pyc can outlive its source (gotcha 22), whatever the
    mtimes say. Old timestamp pycs (pip writes them) are removed first so none is left for an
    optimisation level we do not compile.
    """
    pkg = root / "vllm"
    for cache in sorted(pkg.rglob("__pycache__")):
        if cache.is_dir():
            shutil.rmtree(cache)
    ok = compileall.compile_dir(
        str(pkg), quiet=1, force=True, workers=jobs,
        invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
    )
    if not ok:
        raise PatchToolError(f"byte-compiling {pkg} failed (see the errors above)", code=1)


def _write_store(root: Path, series: Series, version: str) -> Path:
    store = root / STORE_DIR
    if store.exists():
        shutil.rmtree(store)
    store.mkdir(parents=True)
    (store / SERIES_NAME).write_text(series.text, encoding="utf-8")
    for p in series.patches:
        shutil.copyfile(p.path, store / p.file)
        for a in p.added:
            copy = store / OVERLAY_NAME / a.path
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(a.source, copy)
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "vllm_version": base_version(version),
        "series_digest": series.digest,
        "patches": [
            {
                "name": p.name,
                "file": p.file,
                "sha256": p.sha256,
                "files": list(p.files),
                "creates": list(p.creates),
                "adds": [{"path": a.path, "sha256": a.sha256} for a in p.added],
                "provides": {
                    "env": list(p.header.env),
                    "flags": list(p.header.flags),
                    "features": list(p.header.features),
                },
            }
            for p in series.patches
        ],
    }
    path = store / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return path


def _extend_record(root: Path, series: Series) -> None:
    """List our files in the installing dist's RECORD so ``pip uninstall`` removes them.

    Otherwise a reinstall of vLLM over a patched site-packages leaves a manifest that claims
    patches the fresh files do not carry.
    """
    for record in root.glob("*.dist-info/RECORD"):
        text = record.read_text(encoding="utf-8")
        if "vllm/__init__.py," not in text:
            continue
        listed = {line.split(",", 1)[0] for line in text.splitlines()}
        ours = [(STORE_DIR / n).as_posix() for n in
                [MANIFEST_NAME, SERIES_NAME, *(p.file for p in series.patches)]]
        ours += [(STORE_DIR / OVERLAY_NAME / a.path).as_posix()
                 for p in series.patches for a in p.added]
        ours += [c for p in series.patches for c in p.creates]
        extra = [f"{path},,\n" for path in ours if path not in listed]
        if extra:
            with record.open("a", encoding="utf-8") as fh:
                if text and not text.endswith("\n"):
                    fh.write("\n")
                fh.writelines(extra)


def apply_series(root: Path, series: Series, *, compile_tree: bool = True, jobs: int = 0,
                 log: bool = True) -> Path:
    """Apply the whole series to ``root``; returns the manifest path."""
    started = time.monotonic()
    version = _check_tree(root, series)
    if (root / STORE_DIR / MANIFEST_NAME).exists():
        raise PatchToolError(f"{root} is already patched ({root / STORE_DIR / MANIFEST_NAME} "
                             "exists); apply the series to a pristine tree")
    for patch in series.patches:
        apply_patch(root, patch)
        if log:
            print(f"applied {patch.file}")
    applied_at = time.monotonic()
    if compile_tree:
        byte_compile(root, jobs)
    compiled_at = time.monotonic()
    manifest = _write_store(root, series, version)
    _extend_record(root, series)
    if log:
        print(f"patched vLLM {version} at {root}: {len(series.patches)} patches in "
              f"{applied_at - started:.1f} s, byte-compile "
              f"{'skipped' if not compile_tree else f'{compiled_at - applied_at:.1f} s'}, "
              f"total {time.monotonic() - started:.1f} s")
        print(f"manifest {manifest} ({series.digest})")
    return manifest


# --------------------------------------------------------------------------- verify

APPLIED = "applied"
PARTIAL = "partial"
NOT_APPLIED = "not-applied"
NOT_APPLICABLE = "not-applicable"


@dataclass
class FileResult:
    path: str
    applied: bool
    detail: str


@dataclass
class PatchResult:
    name: str
    file: str
    status: str
    files: list[FileResult]

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "file": self.file,
            "status": self.status,
            "files": [{"path": f.path, "applied": f.applied, "detail": f.detail}
                      for f in self.files],
        }


@dataclass
class VerifyReport:
    root: Path
    tree_version: str | None
    series_version: str | None
    series_digest: str
    manifest_digest: str | None
    patches: list[PatchResult]

    @property
    def ok(self) -> bool:
        return all(p.status == APPLIED for p in self.patches)

    def to_dict(self) -> dict[str, object]:
        return {
            "root": str(self.root),
            "tree_vllm_version": self.tree_version,
            "series_vllm_version": self.series_version,
            "series_digest": self.series_digest,
            "manifest_series_digest": self.manifest_digest,
            "ok": self.ok,
            "patches": [p.to_dict() for p in self.patches],
        }


def _section_state(root: Path, section: FileDiff) -> tuple[bool, str]:
    """Is this file section applied on ``root``, by exact reverse dry-run?"""
    target = root / section.path
    if section.creates and not target.exists():
        return False, "missing: this patch creates it"
    if section.deletes:
        if target.exists():
            return False, "still present: this patch deletes it"
        return True, "deleted, as the patch does"
    if not target.exists():
        return False, "missing: the file this patch edits is not in the tree"
    run = run_gnu_patch(root, section.text, reverse=True, dry_run=True)
    if run.ok:
        return True, "reverse applies exactly"
    prefix = section.path + ": "
    shown = [p.removeprefix(prefix) for p in run.problems]
    # GNU patch's "N out of M hunks FAILED" repeats what the hunk lines already said.
    shown = [p for p in shown if not SUMMARY_RE.match(p)] or shown
    return False, "; ".join(_hunk_label(section, p) for p in shown)


def _added_state(root: Path, added: AddedFile) -> tuple[bool, str]:
    """Is this added file in the tree, byte for byte as the overlay holds it?"""
    target = root / added.path
    if not target.is_file():
        return False, f"missing: this patch adds it ({OVERLAY_NAME}/{added.path})"
    have = sha256_file(target)
    if have != added.sha256:
        return False, (f"differs from {OVERLAY_NAME}/{added.path} (sha256 {have[:12]}, the "
                       f"overlay's {added.sha256[:12]})")
    return True, f"identical to {OVERLAY_NAME}/{added.path}"


def _unwound_states(root: Path, series: Series) -> dict[tuple[int, str], tuple[bool, str]]:
    """Reverse the series from last to first in a scratch copy of the touched files.

    Each file section is judged against the tree as it stood right after its own patch: the
    later patches that are applied get undone first. That is the content fallback for regions
    two patches share: the later patch's edits sit inside the earlier one's hunk (or shift it),
    so the earlier patch's reverse no longer matches the final tree exactly.
    """
    results: dict[tuple[int, str], tuple[bool, str]] = {}
    with tempfile.TemporaryDirectory(prefix="qwen3090-verify-") as tmp:
        scratch = Path(tmp)
        for path in {f for p in series.patches for f in p.files}:
            src = root / path
            if src.is_file():
                dst = scratch / path
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
        for index in range(len(series.patches) - 1, -1, -1):
            patch = series.patches[index]
            # Undo in the reverse of apply's order: the diff first, then the added files.
            for section in patch.sections:
                state = _section_state(scratch, section)
                results[(index, section.path)] = state
                if state[0] and not section.deletes:
                    undo = run_gnu_patch(scratch, section.text, reverse=True, dry_run=False)
                    if not undo.ok:
                        raise PatchToolError(f"undoing {section.path} in the scratch copy "
                                             f"failed after a clean dry run:\n{undo.output}")
            for added in patch.added:
                state = _added_state(scratch, added)
                results[(index, added.path)] = state
                if state[0]:
                    (scratch / added.path).unlink()
    return results


def verify_tree(root: Path, series: Series) -> VerifyReport:
    version = tree_vllm_version(root)
    manifest_digest: str | None = None
    manifest_path = root / STORE_DIR / MANIFEST_NAME
    if manifest_path.is_file():
        try:
            manifest_digest = str(json.loads(manifest_path.read_text())["series_digest"])
        except (ValueError, KeyError, TypeError):
            manifest_digest = "unreadable"
    results: list[PatchResult] = []
    if version is None or (series.vllm_version
                           and base_version(version) != series.vllm_version):
        why = (f"tree is vLLM {version}" if version else "tree has no vllm/_version.py") + \
              f", series targets {series.vllm_version}"
        for p in series.patches:
            results.append(PatchResult(p.name, p.file, NOT_APPLICABLE,
                                       [FileResult(f, False, why) for f in p.files]))
        return VerifyReport(root, version, series.vllm_version, series.digest, manifest_digest,
                            results)
    unwound: dict[tuple[int, str], tuple[bool, str]] | None = None
    for index, patch in enumerate(series.patches):
        files: list[FileResult] = []
        states = [(a.path, _added_state(root, a)) for a in patch.added]
        states += [(s.path, _section_state(root, s)) for s in patch.sections]
        for path, (applied, detail) in states:
            later_touches = [q.name for q in series.patches[index + 1:] if path in q.files]
            if not applied and later_touches:
                if unwound is None:
                    unwound = _unwound_states(root, series)
                u_applied, u_detail = unwound[(index, path)]
                if u_applied:
                    applied = True
                    detail = ("as this patch leaves it, once the later patches touching this "
                              f"file are undone ({', '.join(later_touches)})")
                else:
                    detail += f" (also after undoing {', '.join(later_touches)}: {u_detail})"
            files.append(FileResult(path, applied, detail))
        count = sum(f.applied for f in files)
        status = APPLIED if count == len(files) else NOT_APPLIED if count == 0 else PARTIAL
        results.append(PatchResult(patch.name, patch.file, status, files))
    return VerifyReport(root, version, series.vllm_version, series.digest, manifest_digest,
                        results)


def format_report(report: VerifyReport) -> str:
    width = max([len(p.name) for p in report.patches] + [5])
    out = [f"vLLM tree {report.root} (version {report.tree_version or 'unknown'}); "
           f"series for {report.series_version or 'any version'}, {report.series_digest}"]
    if report.manifest_digest is None:
        out.append("no manifest in the tree (vllm/_qwen3090/manifest.json)")
    elif report.manifest_digest != report.series_digest:
        out.append(f"manifest series digest {report.manifest_digest} differs from this series")
    out.append(f"{'patch'.ljust(width)}  status          detail")
    for p in report.patches:
        bad = [f for f in p.files if not f.applied]
        shown = bad if bad else p.files[:1]
        first = True
        for f in shown:
            label = p.name.ljust(width) if first else " " * width
            status = p.status.ljust(14) if first else " " * 14
            out.append(f"{label}  {status}  {f.path}: {f.detail}")
            first = False
        if not bad and len(p.files) > 1:
            more = len(p.files) - 1
            noun = "file" if more == 1 else "files"
            out.append(f"{' ' * width}  {' ' * 14}  (+{more} more {noun}, all applied)")
    counts: dict[str, int] = {}
    for p in report.patches:
        counts[p.status] = counts.get(p.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "empty series"
    out.append(f"{'OK' if report.ok else 'NOT OK'}: {summary}")
    return "\n".join(out)


# --------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="patchtool.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("apply", help="apply the series to a vLLM tree and byte-compile it")
    a.add_argument("--root", type=Path, required=True)
    a.add_argument("--patches", type=Path, required=True)
    a.add_argument("--jobs", type=int, default=0, help="compile workers (0: all cores)")
    a.add_argument("--no-compile", action="store_true")
    v = sub.add_parser("verify", help="report which patches a vLLM tree carries")
    v.add_argument("--root", type=Path, required=True)
    v.add_argument("--patches", type=Path, default=None)
    v.add_argument("--json", action="store_true")
    c = sub.add_parser("check", help="validate the series and the patch headers")
    c.add_argument("--patches", type=Path, required=True)
    d = sub.add_parser("digest", help="print the series digest")
    d.add_argument("--patches", type=Path, required=True)
    return parser


def stored_patches_dir(root: Path) -> Path:
    return root / STORE_DIR


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "apply":
            apply_series(args.root, load_series(args.patches), compile_tree=not args.no_compile,
                         jobs=args.jobs)
            return 0
        if args.cmd == "verify":
            patches_dir = args.patches or stored_patches_dir(args.root)
            if not (patches_dir / SERIES_NAME).is_file():
                raise PatchToolError(f"no series at {patches_dir}; this tree was not patched by "
                                     "the apply tool, pass --patches DIR")
            report = verify_tree(args.root, load_series(patches_dir))
            print(json.dumps(report.to_dict(), indent=2) if args.json else format_report(report))
            return 0 if report.ok else 1
        series = load_series(args.patches)
        if args.cmd == "digest":
            print(series.digest)
            return 0
        for p in series.patches:
            print(f"{p.file}: {len(p.sections)} files edited, {len(p.added)} added; "
                  f"provides env={list(p.header.env)} "
                  f"flags={list(p.header.flags)} features={list(p.header.features)}")
        print(f"series OK: {len(series.patches)} patches for vLLM "
              f"{series.vllm_version or '(unspecified)'}, {series.digest}")
        return 0
    except PatchToolError as err:
        print(f"patchtool: error: {err}", file=sys.stderr)
        return err.code


if __name__ == "__main__":
    sys.exit(main())
