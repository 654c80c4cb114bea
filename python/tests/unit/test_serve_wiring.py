"""What ``serve`` adds to the plan at run time: the loader rule (gotcha 41) and the cache
directories of this build (issue 8), checked on a real generated model dir."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qwen3090 import caches
from qwen3090.capabilities import STOCK
from qwen3090.manifest import find_installed_manifest
from qwen3090.plan import ServePlan
from qwen3090.serve import child_env, with_loader

pytestmark = pytest.mark.unit


def cpu_plan(model: Path, extra: str = "") -> ServePlan:
    from qwen3090.knobs import load_settings
    from qwen3090.plan import resolve

    env = {"MODEL": str(model), "EXTRA_ARGS": extra} if extra else {"MODEL": str(model)}
    settings = load_settings(config=None, environ=env, cli={"DEVICE": "cpu"})
    return resolve(settings, STOCK)


def test_streamer_on_request_adds_the_loader_to_args_and_argv(demo_model_dir: Path) -> None:
    plan, reason = with_loader(cpu_plan(demo_model_dir), STOCK, "on")
    assert reason is not None
    assert plan.flag("--load-format") == "runai_streamer"
    assert "--model-loader-extra-config" in plan.argv
    assert plan.argv[-4:] == plan.vllm_args[-4:]


def test_streamer_auto_leaves_a_small_model_on_the_stock_loader(demo_model_dir: Path) -> None:
    plan, reason = with_loader(cpu_plan(demo_model_dir), STOCK, "auto")
    assert reason is None
    assert plan.flag("--load-format") is None


def test_a_load_format_in_extra_args_wins(demo_model_dir: Path) -> None:
    plan, reason = with_loader(cpu_plan(demo_model_dir, "--load-format safetensors"), STOCK, "on")
    assert reason is None
    assert plan.flag("--load-format") == "safetensors"


def test_child_env_points_every_cache_at_this_build(tmp_path: Path, demo_model_dir: Path) -> None:
    base = {"QWEN3090_CACHE_DIR": str(tmp_path / "c"), "TRITON_CACHE_DIR": "/kept"}
    env = child_env(cpu_plan(demo_model_dir), base)
    key = caches.build_of(find_installed_manifest()).key
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path / "c"))
    assert key in env["VLLM_CACHE_ROOT"]
    assert Path(env["TORCHINDUCTOR_CACHE_DIR"]).is_dir()
    assert env["TRITON_CACHE_DIR"] == "/kept"  # what the caller set is never overridden


def test_serve_dry_run_reports_the_streamer(demo_model_dir: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"MODEL", "EXTRA_ARGS"}}
    env.update({"MODEL": str(demo_model_dir), "QWEN3090_CACHE_DIR": str(tmp_path)})
    out = subprocess.run(
        [sys.executable, "-m", "qwen3090", "serve", "--dry-run", "--device", "cpu",
         "--load-streamer", "on"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "runai_streamer" in out.stdout
    assert "loader: the Run:ai streamer was asked for" in out.stdout


def test_a_qwen3_5_model_needs_the_import_patch_without_torchvision(tmp_path: Path) -> None:
    import importlib.util

    from qwen3090.capabilities import Capabilities
    from qwen3090.demo_model import write_demo_model
    from qwen3090.errors import Qwen3090Error
    from qwen3090.serve import check_qwen3_5_imports

    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed: stock vLLM imports the Qwen3.5 classes")
    qwen3_5 = tmp_path / "qwen3_5"
    write_demo_model(qwen3_5, "qwen3_5")
    with pytest.raises(Qwen3090Error, match="torchvision"):
        check_qwen3_5_imports(qwen3_5, STOCK)
    check_qwen3_5_imports(qwen3_5, Capabilities(features=frozenset({"qwen3_5-text-only"})))
    qwen3_next = tmp_path / "qwen3_next"
    write_demo_model(qwen3_next, "qwen3_next")
    check_qwen3_5_imports(qwen3_next, STOCK)  # not a Qwen3.5 class: nothing to say
