"""nix/ and checks/ evaluated against a stand-in nixpkgs (stub-pkgs.nix): the wiring of the
derivations, what they install and run. Nothing is built; see README for the real build."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.nixeval import REPO, eval_json, nixpkgs_lib

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
    # The install step is nix/build/closure.py, the script the nix-replay tier runs.
    assert "/closure.py install --prefix \"$out\"" in phase
    assert "/decisions.json" in phase
    decisions = json.loads((REPO / "nix" / "build" / "decisions.json").read_text())
    ignored = sorted(k for k in decisions["closure"]["ignored"] if k != "_comment")
    assert sorted(wiring["closure"]["autoPatchelfIgnoreMissingDeps"]) == ignored
    assert "libcuda.so.1" in ignored
    inputs = sorted(p.rsplit("/", 1)[1].split("-", 1)[1] for p in wiring["closure"]["buildInputs"])
    assert inputs == ["gcc-lib", "zlib"]
    assert wiring["closure"]["dontStrip"] is True


def test_vllm_is_the_pinned_wheel_with_the_series_applied(wiring: dict[str, Any]) -> None:
    pins = json.loads((REPO / "python" / "qwen3090" / "pins.json").read_text())
    wheel = pins["artifacts"]["vllm-wheel-cuda-x86_64"]
    assert wiring["vllmSrc"]["url"] == wheel["url"]
    assert wiring["vllmSrc"]["sha256"] == wheel["sha256"]
    phase = wiring["vllm"]["installPhase"]
    # nix/build/patched_vllm.py unpacks the wheel and runs python/qwen3090/patchtool.py apply.
    assert "/patched_vllm.py install --wheel \"$src\"" in phase
    assert "--series-src /nix/store/" in phase
    assert wiring["vllm"]["autoPatchelfIgnoreMissingDeps"] == ["libcuda.so.1"]
    assert "/torch/lib" in wiring["vllm"]["preFixup"]
    assert wiring["manifest"].endswith("/site-packages/vllm/_qwen3090/manifest.json")


def test_wrapper_runs_on_the_closure_with_the_patched_vllm(wiring: dict[str, Any]) -> None:
    phase = wiring["q"]["installPhase"]
    # nix/build/wrapper.py writes the wrappers; the nix-replay tier runs and checks them.
    assert "/wrapper.py install --out \"$out\"" in phase
    assert f"--manifest {wiring['manifest']}" in phase
    for flag in ("--cc ", "--cxx ", "--cuda-home ", "--tool-path ", "--coreutils "):
        assert flag in phase
    assert "/nvidia/cu13" in phase
    assert wiring["qexe"].endswith("/bin/qwen3090")
    assert wiring["test"] == "qwen3090-python-test"


def test_apps_serve_each_profile(wiring: dict[str, Any]) -> None:
    assert set(wiring["apps"]) == {"single-user", "batch"}
    for profile, app in wiring["apps"].items():
        assert app["type"] == "app"
        assert app["program"].endswith(f"/bin/qwen3090-{profile}")


def test_checks_need_no_gpu(wiring: dict[str, Any]) -> None:
    # `nix flake check` on a builder without the `cuda` feature must not meet a GPU check.
    assert set(wiring["checkNames"]) == {"verifier", "tokenizer", "module-eval", "python-tests"}
    assert all(features == [] for features in wiring["features"].values())


def test_flake_keeps_gpu_checks_out_of_checks(tmp_path: Path) -> None:
    # The flake's outputs, evaluated with the stand-in nixpkgs as its input.
    fake_nixpkgs = tmp_path / "nixpkgs"
    fake_nixpkgs.mkdir()
    # It refuses CUDA settings: they do nothing for wheels but make nixpkgs rebuild.
    (fake_nixpkgs / "default.nix").write_text(
        f"{{ system, config ? {{ }} }}: "
        "assert config == { allowUnfree = true; } "
        '|| throw "nixpkgs config: ${builtins.toJSON config}"; '
        f"import {STUB} {{ lib = import {nixpkgs_lib()}; }}\n"
    )
    got = eval_json(
        f"let flake = import {REPO}/flake.nix; "
        f'nixpkgs = {{ inherit lib; outPath = "{fake_nixpkgs}"; }}; '
        "outputs = flake.outputs { self = outputs; inherit nixpkgs; }; "
        'sys = "x86_64-linux"; in { '
        "checks = lib.mapAttrs (_: c: c.drvAttrs.requiredSystemFeatures or []) "
        '(removeAttrs outputs.checks.${sys} [ "module-eval" ]); '
        "gpu = lib.mapAttrs (_: c: c.drvAttrs.requiredSystemFeatures) "
        "outputs.legacyPackages.${sys}.gpuChecks; }"
    )
    assert got["checks"] and all(f == [] for f in got["checks"].values())
    assert got["gpu"] == {"gpu-gate": ["cuda"], "gpu-serve-demo": ["cuda"]}


def test_python_tests_check_runs_in_the_whole_source() -> None:
    # The unit tests read ../patches/series and ../modules/prometheus/rules.yml: the check
    # copies the whole filtered source and runs in its python/ directory.
    script = eval_json(built() + "checks.python-tests.drvAttrs.buildCommand")
    assert "cp -r /nix/store/00000000000000000000000000000000-source source\n" in script
    assert "cd source/python\n" in script
    parts = eval_json(f"(import {REPO}/nix/sources.nix).src")
    assert {"modules", "patches", "python/qwen3090", "python/tests"} <= set(parts)


def test_tokenizer_check_refuses_a_dir_without_tokenizer() -> None:
    script = eval_json(built() + "checks.tokenizer.drvAttrs.buildCommand")
    assert "qwen3090 check model demo" in script
    assert "rm no-tokenizer/tokenizer.json" in script
    assert "if qwen3090 check model no-tokenizer" in script


def test_another_python_picks_its_own_wheels() -> None:
    phase = eval_json(built("3.11") + "built.closure.drvAttrs.installPhase")
    assert "torch-2.13.0-cp311-cp311" in phase
    assert "cp313" not in phase
