"""A check's build script, taken from the .nix file and run outside Nix.

The script is the check's `buildCommand` as nix/ and checks/ evaluate it against the stand-in
nixpkgs (python/tests/nix/stub-pkgs.nix); its store paths are then swapped for the replay's
local builds, and the filtered source (nix/sources.nix) is copied to stand for `${src}`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support import replay

STUB = replay.REPO / "python" / "tests" / "nix" / "stub-pkgs.nix"
FAKE_SRC = "/nix/store/00000000000000000000000000000000-source"


def _nix(expr: str) -> Any:
    exe = shutil.which("nix-instantiate")
    if exe is None:
        pytest.skip("nix-instantiate is not installed (Debian: apt-get install nix-bin)")
    proc = subprocess.run(
        [exe, "--readonly-mode", "--eval", "--strict", "--json", "-E", expr],
        capture_output=True, text=True, timeout=300, cwd=replay.REPO,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _lib() -> str:
    raw = os.environ.get("NIXPKGS_LIB")
    if not raw:
        pytest.skip("NIXPKGS_LIB is unset: the stand-in nixpkgs needs nixpkgs' lib")
    root = Path(raw)
    return str(root / "lib" if (root / "lib" / "default.nix").is_file() else root)


def source_parts() -> list[str]:
    parts: list[str] = _nix(f"(import {replay.REPO}/nix/sources.nix).src")
    return parts


def _fresh(path: Path) -> None:
    """Remove ``path`` (read-only trees included) left by an earlier run."""
    if not path.exists():
        return
    if not path.is_dir():
        path.unlink()
        return
    for sub in [path, *path.rglob("*")]:
        if not sub.is_symlink():
            sub.chmod(sub.stat().st_mode | 0o700)
    shutil.rmtree(path)


def copy_source(dest: Path) -> Path:
    """The flake's `src`: only the parts nix/sources.nix names, read-only as in the store."""
    _fresh(dest)
    for part in source_parts():
        origin = replay.REPO / part
        target = dest / part
        target.parent.mkdir(parents=True, exist_ok=True)
        if origin.is_dir():
            shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, target)
    for path in sorted(dest.rglob("*"), reverse=True):
        path.chmod(path.stat().st_mode & ~0o222)
    dest.chmod(0o555)
    return dest


def check(name: str) -> dict[str, Any]:
    """The check's build script and the store paths it names."""
    lib = _lib()
    result: dict[str, Any] = _nix(
        f'let lib = import {lib}; pkgs = import {STUB} {{ inherit lib; '
        f'pythonVersion = "{replay.PYTHON}"; }}; src = "{FAKE_SRC}"; '
        f"built = import {replay.REPO}/nix {{ inherit pkgs src; }}; "
        f"checks = import {replay.REPO}/checks {{ inherit pkgs lib built src; "
        'nixosSystem = _: throw "not here"; nixosModule = { }; }; '
        f'c = checks."{name}".drvAttrs; in {{ script = c.buildCommand; '
        "inputs = map toString (c.nativeBuildInputs or [ ]); "
        "qwen3090 = toString built.qwen3090; testTools = toString built.testTools; "
        "vllm = toString built.vllm; }"
    )
    return result


def run_check(name: str, substitutions: dict[str, str], path: list[Path], work: Path,
              timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    """Run the check's script as runCommand would: bash with -eu -o pipefail, $out and a
    private TMPDIR/HOME; PATH holds the replayed nativeBuildInputs, then this host's
    coreutils standing in for stdenv's."""
    spec = check(name)
    script = spec["script"]
    for store_path, local in sorted(substitutions.items(), key=lambda kv: -len(kv[0])):
        script = script.replace(store_path, local)
    leftover = [p for p in script.split() if "/nix/store/" in p]
    assert not leftover, f"store paths the replay has no local build for: {leftover}"
    build = work / f"build-{name}"
    _fresh(build)
    _fresh(work / f"out-{name}")
    build.mkdir(parents=True)
    env = {
        "PATH": ":".join([*map(str, path), "/usr/bin", "/bin"]),
        "TMPDIR": str(build), "HOME": "/homeless-shelter", "out": str(work / f"out-{name}"),
        "NIX_BUILD_TOP": str(build),
    }
    return subprocess.run(["/bin/bash", "-eu", "-o", "pipefail", "-c", script],
                          capture_output=True, text=True, timeout=timeout, cwd=build, env=env)
