"""nix/ and checks/ evaluated against a stand-in nixpkgs (stub-pkgs.nix): the wiring of the
derivations, what they install and run. Nothing is built; see README for the real build."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from nixeval import REPO, eval_json

pytestmark = pytest.mark.nix

STUB = Path(__file__).resolve().parent / "stub-pkgs.nix"


def built(python: str = "3.13") -> str:
    return (
        f'let pkgs = import {STUB} {{ inherit lib; pythonVersion = "{python}"; }}; '
        # A store-path string stands for the source: nothing is hashed or copied.
        'src = "/nix/store/00000000000000000000000000000000-source"; '
        f"built = import {REPO}/nix {{ inherit pkgs src; }}; "
        f"checks = import {REPO}/checks {{ inherit pkgs lib built src; "
        'nixosSystem = _: throw "not evaluated here"; nixosModule = { }; }; in '
    )


@pytest.fixture(scope="module")
def wiring() -> dict[str, Any]:
    result: dict[str, Any] = eval_json(
        built()
        + "{ closure = built.closure.drvAttrs; vllm = built.vllm.drvAttrs; "
        "vllmSrc = built.vllm.drvAttrs.src.args; "
        "manifest = built.vllm.manifest; q = built.qwen3090.drvAttrs; "
        "qexe = lib.getExe built.qwen3090; test = built.testTools.drvAttrs.pname; "
        "apps = built.apps; checkNames = builtins.attrNames checks; "
        # module-eval needs a real NixOS evaluation (checks/module-eval.nix); not here.
        "features = lib.mapAttrs (_: c: c.drvAttrs.requiredSystemFeatures or []) "
        '(removeAttrs checks [ "module-eval" ]); }'
    )
    return result


def table_urls(python: str, part: str) -> list[str]:
    table = json.loads((REPO / "nix" / "closure" / "table.json").read_text())
    return [w["url"] for w in table["pythons"][python][part] if w["name"] != "vllm"]


def test_closure_installs_every_pinned_wheel_but_vllm(wiring: dict[str, Any]) -> None:
    phase = wiring["closure"]["installPhase"]
    for url in table_urls("3.13", "runtime"):
        assert url.rsplit("/", 1)[1] in phase
    assert "vllm-0.28.0" not in phase
    assert "-m venv --without-pip" in phase
    assert "--invalidation-mode checked-hash" in phase
    assert wiring["closure"]["autoPatchelfIgnoreMissingDeps"] == [
        "libcuda.so.1",
        "libnvidia-ml.so.1",
    ]
    assert wiring["closure"]["dontStrip"] is True


def test_vllm_is_the_pinned_wheel_with_the_series_applied(wiring: dict[str, Any]) -> None:
    pins = json.loads((REPO / "python" / "qwen3090" / "pins.json").read_text())
    wheel = pins["artifacts"]["vllm-wheel-cuda-x86_64"]
    assert wiring["vllmSrc"]["url"] == wheel["url"]
    assert wiring["vllmSrc"]["sha256"] == wheel["sha256"]
    phase = wiring["vllm"]["installPhase"]
    unpack = phase.index("-m zipfile -e")
    apply = phase.index("python/qwen3090/patchtool.py apply")
    assert unpack < apply
    assert "--patches " in phase and "/patches" in phase
    assert wiring["manifest"].endswith("/site-packages/vllm/_qwen3090/manifest.json")


def test_wrapper_runs_on_the_closure_with_the_patched_vllm(wiring: dict[str, Any]) -> None:
    phase = wiring["q"]["installPhase"]
    assert f"--set QWEN3090_MANIFEST {wiring['manifest']}" in phase
    assert "--prefix PYTHONPATH" in phase
    assert "--suffix LD_LIBRARY_PATH : /run/opengl-driver/lib" in phase
    assert '"$out/bin/qwen3090" --add-flags "-m qwen3090"' in phase
    assert wiring["qexe"].endswith("/bin/qwen3090")
    assert wiring["test"] == "qwen3090-python-test"


def test_apps_serve_each_profile(wiring: dict[str, Any]) -> None:
    assert set(wiring["apps"]) == {"single-user", "batch"}
    for profile, app in wiring["apps"].items():
        assert app["type"] == "app"
        assert app["program"].endswith(f"/bin/qwen3090-{profile}")


def test_checks_and_gpu_features(wiring: dict[str, Any]) -> None:
    assert set(wiring["checkNames"]) >= {
        "verifier",
        "tokenizer",
        "module-eval",
        "python-tests",
        "gpu-gate",
        "gpu-serve-demo",
    }
    features = wiring["features"]
    assert features["gpu-gate"] == ["cuda"] and features["gpu-serve-demo"] == ["cuda"]
    assert features["verifier"] == [] and features["tokenizer"] == []


def test_tokenizer_check_refuses_a_dir_without_tokenizer() -> None:
    script = eval_json(built() + "checks.tokenizer.drvAttrs.buildCommand")
    assert "qwen3090 check model demo" in script
    assert "rm no-tokenizer/tokenizer.json" in script
    assert "if qwen3090 check model no-tokenizer" in script


def test_another_python_picks_its_own_wheels() -> None:
    phase = eval_json(built("3.11") + "built.closure.drvAttrs.installPhase")
    assert "torch-2.13.0-cp311-cp311" in phase
    assert "cp313" not in phase
