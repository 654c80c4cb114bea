"""The pinned Python closure: uv.lock -> table.json, and its agreement with pins.json."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.nixeval import REPO, eval_json

pytestmark = pytest.mark.nix

CLOSURE = REPO / "nix" / "closure"
PINS = REPO / "python" / "qwen3090" / "pins.json"


def table() -> dict[str, Any]:
    result: dict[str, Any] = json.loads((CLOSURE / "table.json").read_text())
    return result


def test_table_is_what_the_generator_derives_from_uv_lock() -> None:
    proc = subprocess.run(
        [sys.executable, str(CLOSURE / "lock2table.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


def test_generator_notices_a_stale_table(tmp_path: Path) -> None:
    stale = tmp_path / "table.json"
    data = table()
    data["pythons"]["3.13"]["runtime"].pop()
    stale.write_text(json.dumps(data))
    proc = subprocess.run(
        [sys.executable, str(CLOSURE / "lock2table.py"), "--check", "--out", str(stale)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1


def test_closure_roots_follow_the_package_requirements() -> None:
    package = tomllib.loads((REPO / "python" / "pyproject.toml").read_text())["project"]
    closure = tomllib.loads((CLOSURE / "pyproject.toml").read_text())["project"]
    wanted = {
        canonicalize_name(Requirement(r).name)
        for r in [*package["dependencies"], *package["optional-dependencies"]["cuda"]]
    }
    roots = {canonicalize_name(Requirement(r).name) for r in closure["dependencies"]}
    assert wanted == roots
    # vLLM and torch are pinned exactly, to the versions pins.json names.
    pins = json.loads(PINS.read_text())
    exact = {Requirement(r).name: str(Requirement(r).specifier) for r in closure["dependencies"]}
    assert exact["vllm"] == f"=={pins['vllm_version']}"
    assert exact["torch"] == f"=={pins['torch_version']}"


def test_every_python_gets_the_pinned_vllm_and_torch_wheels() -> None:
    pins = json.loads(PINS.read_text())["artifacts"]
    vllm_pin = pins["vllm-wheel-cuda-x86_64"]
    for python, wheels in table()["pythons"].items():
        by_name = {w["name"]: w for w in wheels["runtime"]}
        assert by_name["vllm"]["url"] == vllm_pin["url"], python
        assert by_name["vllm"]["hash"] == _sri(vllm_pin["sha256"]), python
        assert by_name["torch"]["version"] == "2.13.0", python
        tag = "cp" + python.replace(".", "")
        assert f"-{tag}-{tag}-" in by_name["torch"]["file"], python
        torch_pin = pins.get(f"torch-wheel-cuda-{tag}-x86_64")
        if torch_pin is not None:
            assert by_name["torch"]["url"] == torch_pin["url"], python
            assert by_name["torch"]["hash"] == _sri(torch_pin["sha256"]), python
        # Linux x86_64 glibc wheels only: musllinux or another platform would not load.
        for wheel in wheels["runtime"] + wheels["test"]:
            assert "musllinux" not in wheel["file"] and "macosx" not in wheel["file"], wheel
            assert wheel["file"].endswith(".whl"), wheel


def test_cuda_runtime_wheels_are_in_the_closure() -> None:
    names = {w["name"] for w in table()["pythons"]["3.13"]["runtime"]}
    # What the serving path dlopens or imports on the GPU.
    for needed in ("triton", "flashinfer-python", "nvidia-nccl-cu13", "nvidia-ml-py"):
        assert needed in names


def _sri(hexdigest: str) -> str:
    import base64

    return "sha256-" + base64.b64encode(bytes.fromhex(hexdigest)).decode()


def test_pins_nix_reads_the_same_artifacts() -> None:
    got = eval_json(
        f"let p = import {REPO}/nix/pins.nix {{ inherit lib; }}; in "
        "{ inherit (p) vllmVersion torchVersion; wheel = p.vllmWheel.url; "
        'n = builtins.length (p.closureFor { pythonVersion = "3.13"; }).runtime; }'
    )
    pins = json.loads(PINS.read_text())
    assert got["vllmVersion"] == "0.28.0" == pins["vllm_version"]
    assert got["torchVersion"] == "2.13.0"
    assert got["wheel"] == pins["artifacts"]["vllm-wheel-cuda-x86_64"]["url"]
    assert got["n"] == len(table()["pythons"]["3.13"]["runtime"])


def test_pins_nix_refuses_an_unlocked_python() -> None:
    proc = eval_json(
        f"(import {REPO}/nix/pins.nix {{ inherit lib; }}).closureFor "
        '{ pythonVersion = "3.9"; }',
        check=False,
    )
    assert proc.returncode != 0
    assert "no wheel set for Python 3.9" in proc.stderr
