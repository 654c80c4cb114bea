"""Purpose-built vLLM-shaped trees and patches for the pipeline's unit tests."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path

DEV_NULL = "/dev/null"


def make_tree(root: Path, files: Mapping[str, str], version: str = "0.28.0") -> Path:
    """A directory containing ``vllm/`` with ``_version.py`` and the given files."""
    (root / "vllm").mkdir(parents=True, exist_ok=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "_version.py").write_text(
        f"__version__ = version = '{version}'\n__version_tuple__ = version_tuple = (0, 0)\n"
    )
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def diff_text(changes: Mapping[str, tuple[str | None, str | None]], context: int = 3) -> str:
    """A unified diff (paths a/..., b/...) for {path: (old text or None, new text or None)}."""
    out: list[str] = []
    for rel, (old, new) in changes.items():
        old_lines = old.splitlines(keepends=True) if old is not None else []
        new_lines = new.splitlines(keepends=True) if new is not None else []
        out.append(f"diff --git a/{rel} b/{rel}\n")
        out.extend(
            difflib.unified_diff(
                old_lines,
                new_lines,
                DEV_NULL if old is None else f"a/{rel}",
                DEV_NULL if new is None else f"b/{rel}",
                n=context,
            )
        )
    return "".join(out)


def header(name: str, provides: str = "") -> str:
    text = f"# qwen3090-patch: {name}\n# summary: test patch {name}\n# why: a test\n"
    return text + provides


def write_patch(
    patches: Path,
    name: str,
    changes: Mapping[str, tuple[str | None, str | None]],
    provides: str = "",
    context: int = 3,
) -> Path:
    patches.mkdir(parents=True, exist_ok=True)
    path = patches / f"{name}.patch"
    path.write_text(header(name, provides) + diff_text(changes, context))
    return path


def write_overlay(patches: Path, rel: str, text: str) -> Path:
    """A file the series adds, at its vLLM path under ``patches/overlay/``."""
    path = patches / "overlay" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def write_series(patches: Path, names: list[str], version: str | None = "0.28.0") -> Path:
    lines = ["# test series\n"]
    if version:
        lines.append(f"# vllm-version: {version}\n")
    lines += [f"{n}.patch\n" for n in names]
    path = patches / "series"
    path.write_text("".join(lines))
    return path


def numbered(n: int, prefix: str = "line") -> str:
    return "".join(f"{prefix}_{i} = {i}\n" for i in range(1, n + 1))
