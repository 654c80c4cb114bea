"""patches/aot-cache-load.patch: a warm boot loads vLLM's saved AOT artifact on the CPU build.

Stock vLLM 0.28.0 calls ``finalize_loading`` on whatever the artifact deserializes to; only its
own VLLM_COMPILE backend produces an object with that method. The CPU platform compiles in
DYNAMO_TRACE_ONCE mode with the stock inductor backend, whose artifact comes back as a plain
function, so every warm boot logged a load failure and compiled again (issue 8). The probe
saves such an artifact and loads it through vLLM's own loader, once on the pristine vLLM and
once on a copy with the series applied.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.patch

REPO = Path(__file__).resolve().parents[3]
PROBE = Path(__file__).with_name("aot_probe.py")


def _pristine_vllm() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="module")
def patched_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("patched-vllm")
    shutil.copytree(_pristine_vllm(), root / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    tool = REPO / "python" / "qwen3090" / "patchtool.py"
    done = subprocess.run(
        [sys.executable, str(tool), "apply", "--root", str(root), "--patches",
         str(REPO / "patches"), "--no-compile"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def _probe(tmp_path: Path, pythonpath: Path | None) -> dict[str, object]:
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    done = subprocess.run(
        [sys.executable, str(PROBE), str(tmp_path / "artifact")],
        capture_output=True, text=True, env=env, check=False, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    result["log"] = done.stdout + done.stderr  # vLLM logs to stdout
    return result


def test_stock_vllm_fails_to_load_the_cpu_artifact(tmp_path: Path) -> None:
    result = _probe(tmp_path, None)
    assert str(result["vllm"]).startswith(str(_pristine_vllm()))
    assert result["loaded"] is False
    assert "has no attribute 'finalize_loading'" in str(result["log"])


def test_patched_vllm_loads_it_and_computes_the_same(tmp_path: Path, patched_root: Path) -> None:
    result = _probe(tmp_path, patched_root)
    assert str(result["vllm"]).startswith(str(patched_root))
    assert result["loaded"] is True
    assert result["matches_eager"] is True
    assert "load failure" not in str(result["log"])
