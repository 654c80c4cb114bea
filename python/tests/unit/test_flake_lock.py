"""flake.lock is valid JSON of the shape Nix writes, and pins the nixpkgs the flake.nix comment
names: the rev and narHash that independent public locks were checked to agree on."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.support.nixeval import REPO

pytestmark = pytest.mark.unit


def _comment_above_inputs() -> str:
    """The comment block directly above ``inputs.nixpkgs.url`` in flake.nix, without ``#``."""
    lines = (REPO / "flake.nix").read_text().splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.strip().startswith("inputs.nixpkgs.url")]
    block: list[str] = []
    for line in reversed(lines[:at]):
        if not line.strip().startswith("#"):
            break
        block.insert(0, line.strip().removeprefix("#").strip())
    return " ".join(block)


def _locked_nixpkgs() -> dict[str, Any]:
    lock = json.loads((REPO / "flake.lock").read_text())
    assert lock["version"] == 7 and lock["root"] == "root"
    name = lock["nodes"]["root"]["inputs"]["nixpkgs"]
    node: dict[str, Any] = lock["nodes"][name]
    assert node["original"] == {
        "owner": "NixOS", "ref": "nixos-unstable", "repo": "nixpkgs", "type": "github",
    }
    locked: dict[str, Any] = node["locked"]
    return locked


def test_flake_lock_pins_the_revision_the_comment_names() -> None:
    locked = _locked_nixpkgs()
    assert locked["type"] == "github" and locked["repo"] == "nixpkgs"
    assert re.fullmatch(r"[0-9a-f]{40}", locked["rev"])
    # An SRI sha256 is 32 bytes: 43 base64 characters and one '='.
    assert re.fullmatch(r"sha256-[A-Za-z0-9+/]{43}=", locked["narHash"])
    comment = _comment_above_inputs()
    assert f"at {locked['rev']}" in comment
    assert f"narHash {locked['narHash']}" in comment


def test_the_comment_names_at_least_two_independent_locks() -> None:
    comment = _comment_above_inputs()
    # "owner/repo at <40-hex commit>": where each agreeing lock can be read.
    sources = re.findall(r"([\w.-]+/[\w.-]+) at ([0-9a-f]{40})", comment)
    repos = {repo for repo, _ in sources}
    assert len(repos) >= 2, comment
    assert "NixOS/nixpkgs" not in repos
