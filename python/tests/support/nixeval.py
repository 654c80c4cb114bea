"""Running Debian's nix-instantiate from the tests: parse .nix files, evaluate with nixpkgs' lib.

The module tests need nixpkgs' lib (only the lib, not nixpkgs): a checkout of
github:nix-community/nixpkgs.lib, or of nixpkgs itself, named by ``NIXPKGS_LIB`` (the
directory holding ``lib/default.nix``, or that ``lib`` directory itself). Without it those
tests skip and say so; parsing needs nothing but nix-instantiate.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
LIB_ENV = "NIXPKGS_LIB"


def nix_instantiate() -> str:
    exe = shutil.which("nix-instantiate")
    if exe is None:
        pytest.skip("nix-instantiate is not installed (Debian: apt-get install nix-bin)")
    return exe


def nixpkgs_lib() -> Path:
    """The ``lib`` directory of a nixpkgs(.lib) checkout named by $NIXPKGS_LIB, or skip."""
    raw = os.environ.get(LIB_ENV)
    if not raw:
        pytest.skip(
            f"{LIB_ENV} is unset: point it at a checkout of github:nix-community/nixpkgs.lib "
            "(the directory holding lib/default.nix) to evaluate the NixOS module "
            "(python/dev.sh test uses ../shared/nixpkgs-lib beside the checkout when present)"
        )
    root = Path(raw)
    for candidate in (root / "lib", root):
        if (candidate / "default.nix").is_file() and (candidate / "modules.nix").is_file():
            return candidate
    pytest.fail(f"{LIB_ENV}={raw} holds no nixpkgs lib (no lib/default.nix with modules.nix)")


def run_nix(args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    # --readonly-mode: evaluation only; nothing is written to (or needs) a Nix store.
    cmd = [nix_instantiate(), "--readonly-mode", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return proc


def eval_json(expr: str, check: bool = True) -> Any:
    """Evaluate ``expr`` (``lib`` is bound to nixpkgs' lib) strictly, as JSON."""
    lib = nixpkgs_lib()
    wrapped = f"let lib = import {lib}; in {expr}"
    proc = run_nix(["--eval", "--strict", "--json", "-E", wrapped], check=check)
    if not check:
        return proc
    return json.loads(proc.stdout)


def eval_module(configuration: str) -> dict[str, Any]:
    """checks/eval-module.nix's summary for a NixOS configuration given as a Nix expression."""
    harness = REPO / "checks" / "eval-module.nix"
    result: dict[str, Any] = eval_json(
        f"(import {harness} {{ inherit lib; configuration = {configuration}; }}).summary"
    )
    return result


def eval_module_error(configuration: str) -> str:
    """The error text of an evaluation that must fail."""
    harness = REPO / "checks" / "eval-module.nix"
    proc = eval_json(
        f"(import {harness} {{ inherit lib; configuration = {configuration}; }}).summary",
        check=False,
    )
    assert proc.returncode != 0, f"evaluation unexpectedly succeeded: {proc.stdout[:500]}"
    return str(proc.stderr)


def exec_argv(line: str) -> list[str]:
    """Split an Exec*= line rendered by escapeSystemdExecArgs back into its argv.

    Each argument is a JSON string with systemd's % and $ doubled; undo both.
    """
    decoder = json.JSONDecoder()
    text = line.replace("%%", "%").replace("$$", "$")
    argv: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos] == " ":
            pos += 1
            continue
        value, pos = decoder.raw_decode(text, pos)
        assert isinstance(value, str), line
        argv.append(value)
    return argv
