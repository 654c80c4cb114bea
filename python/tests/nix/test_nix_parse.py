"""Every .nix file of the repository parses, and what needs only builtins evaluates."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.nixeval import REPO, nix_instantiate, run_nix

pytestmark = pytest.mark.nix

SKIP_DIRS = {".git", ".venv", "node_modules", ".artifacts", "result"}


def nix_files() -> list[Path]:
    return sorted(
        p
        for p in REPO.rglob("*.nix")
        if not any(part in SKIP_DIRS for part in p.relative_to(REPO).parts)
    )


def test_the_nix_tree_is_there() -> None:
    names = {str(p.relative_to(REPO)) for p in nix_files()}
    for required in (
        "flake.nix",
        "modules/qwen3090/default.nix",
        "nix/vllm.nix",
        "nix/python-closure.nix",
        "checks/default.nix",
    ):
        assert required in names


@pytest.mark.parametrize("path", nix_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_parses(path: Path) -> None:
    proc = subprocess.run(
        [nix_instantiate(), "--parse", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


def test_a_broken_file_does_not_parse(tmp_path: Path) -> None:
    # The parse test above must be able to fail.
    bad = tmp_path / "bad.nix"
    bad.write_text("{ a = 1; b = ; }\n")
    proc = subprocess.run(
        [nix_instantiate(), "--parse", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0


def test_scrape_configs_evaluate_with_builtins_only() -> None:
    expr = (
        f"import {REPO}/modules/qwen3090/scrape-configs.nix "
        '{ vllmTarget = "127.0.0.1:18020"; exporterTarget = "127.0.0.1:18021"; '
        'profile = "batch"; }'
    )
    jobs = json.loads(run_nix(["--eval", "--strict", "--json", "-E", expr]).stdout)
    assert [j["job_name"] for j in jobs] == ["qwen3090-vllm", "qwen3090-exporter"]
    assert jobs[0]["static_configs"][0]["targets"] == ["127.0.0.1:18020"]
    assert jobs[0]["metrics_path"] == "/metrics"
    assert jobs[1]["static_configs"][0]["labels"] == {"profile": "batch", "service": "qwen3090"}
    no_exporter = json.loads(
        run_nix(
            [
                "--eval",
                "--strict",
                "--json",
                "-E",
                f'import {REPO}/modules/qwen3090/scrape-configs.nix {{ vllmTarget = "h:1"; }}',
            ]
        ).stdout
    )
    assert [j["job_name"] for j in no_exporter] == ["qwen3090-vllm"]


def test_flake_lock_pins_a_real_looking_nixpkgs() -> None:
    lock = json.loads((REPO / "flake.lock").read_text())
    assert lock["version"] == 7
    root_inputs = lock["nodes"][lock["root"]]["inputs"]
    flake_text = (REPO / "flake.nix").read_text()
    declared = set(re.findall(r"inputs\.([A-Za-z0-9_-]+)\.url", flake_text))
    assert set(root_inputs) == declared
    for name in root_inputs:
        locked = lock["nodes"][root_inputs[name]]["locked"]
        assert re.fullmatch(r"[0-9a-f]{40}", locked["rev"]), locked
        assert re.fullmatch(r"sha256-[A-Za-z0-9+/]{43}=", locked["narHash"]), locked
        # flake.nix says where each locked revision and hash come from.
        assert locked["rev"] in flake_text
