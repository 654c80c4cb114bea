"""Patch tier for ``patches/qwen3_5-text-only-imports.patch``.

Stock vLLM 0.28.0 cannot load either Qwen3.5 model class without torchvision: ``qwen3_5``
imports ``qwen3_vl`` (and through ``qwen2_5_vl`` also ``qwen2_vl``), and both import
``smart_resize`` from transformers' ``image_processing_qwen2_vl``, whose first lines import
torchvision. The stock error, recorded: ``ModuleNotFoundError: No module named 'torchvision'``
raised in ``transformers/models/qwen2_vl/image_processing_qwen2_vl.py`` while importing
``vllm/model_executor/models/qwen3_vl.py``. The patch moves those imports to where an image is
sized, so the classes load and the torchvision-backed module stays unimported.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.patch

ARCHS = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration")

# Loads the model classes the way vLLM does when it serves them (the registry's lazy entry
# imports the module), and reports what failed and which modules the import pulled in.
PROBE = """
import importlib.util, json, sys, traceback
out = {"torchvision_installed": importlib.util.find_spec("torchvision") is not None}
import vllm
out["vllm_file"] = vllm.__file__
from vllm.model_executor.models.registry import ModelRegistry
out["classes"] = {}
out["errors"] = {}
for arch in ARCHS:
    try:
        cls = ModelRegistry.models[arch].load_model_cls()
        out["classes"][arch] = cls.__module__ + "." + cls.__qualname__
    except Exception as exc:
        frames = [f.filename.replace("\\\\", "/") for f in traceback.extract_tb(exc.__traceback__)]
        out["errors"][arch] = {"error": f"{type(exc).__name__}: {exc}", "files": frames}
out["imported"] = sorted(
    m for m in sys.modules
    if m.split(".")[0] == "torchvision" or m.endswith(".image_processing_qwen2_vl")
)
print("PROBE " + json.dumps(out))
"""


def _probe(tree: Path, run_in_tree: Callable[..., Any]) -> dict[str, Any]:
    code = f"ARCHS = {ARCHS!r}\n{PROBE}"
    proc = run_in_tree(tree, code)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    out: dict[str, Any] = json.loads(lines[-1][len("PROBE "):])
    assert out["vllm_file"].startswith(str(tree)), out["vllm_file"]
    if out["torchvision_installed"]:
        pytest.skip("torchvision is installed here; the patch is for an environment without it "
                    "(PyPI's torchvision breaks beside the CPU torch, so the CPU tier has none)")
    return out


def test_stock_cannot_load_qwen3_5_without_torchvision(
    pristine_cpu_tree: Path, run_in_tree: Callable[..., Any]
) -> None:
    out = _probe(pristine_cpu_tree, run_in_tree)
    assert out["classes"] == {}
    for arch in ARCHS:
        err = out["errors"][arch]
        assert err["error"] == "ModuleNotFoundError: No module named 'torchvision'", err
        files = err["files"]
        # The chain this patch cuts: qwen3_5 -> qwen3_vl -> transformers' image processor.
        assert any(f.endswith("vllm/model_executor/models/qwen3_5.py") for f in files), files
        assert any(f.endswith("vllm/model_executor/models/qwen3_vl.py") for f in files), files
        assert files[-1].endswith("transformers/models/qwen2_vl/image_processing_qwen2_vl.py")


def test_patched_loads_qwen3_5_without_the_image_processor(
    patched_cpu_tree: Path, run_in_tree: Callable[..., Any]
) -> None:
    out = _probe(patched_cpu_tree, run_in_tree)
    assert out["errors"] == {}
    assert out["classes"] == {
        arch: f"vllm.model_executor.models.qwen3_5.{arch}" for arch in ARCHS
    }
    assert out["imported"] == []


def test_manifest_provides_the_feature(patched_cpu_tree: Path) -> None:
    from qwen3090.manifest import load_manifest

    manifest = load_manifest(patched_cpu_tree / "vllm" / "_qwen3090" / "manifest.json")
    assert "qwen3_5-text-only" in manifest.provided_features
    entry = next(p for p in manifest.patches if p.name == "qwen3_5-text-only-imports")
    assert sorted(entry.files) == [
        "vllm/model_executor/models/qwen2_vl.py",
        "vllm/model_executor/models/qwen3_vl.py",
    ]
