"""`bench boot` once, at the minimal count (one cold boot, one warm), on the CPU tier.

About two minutes of CI on two cores; its printed numbers are the issue-8 measurement.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from qwen3090 import caches, cli

pytestmark = pytest.mark.e2e_cpu

PORT = 18602


def test_boot_cold_then_warm(
    demo_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    serve = importlib.util.find_spec("qwen3090.commands.serve") is not None
    out = tmp_path / "boot.json"
    argv = ["bench", "boot", "--model-dir", str(demo_model_dir), "--cold", "1", "--warm", "1",
            "--port", str(PORT), "--work-dir", str(tmp_path / "work"), "--out", str(out),
            "--timeout", "400"]  # fmt: skip
    if serve:
        argv += ["--engine", "serve"]
    else:
        # Until `qwen3090 serve` exists: vLLM directly, with what a hybrid demo model needs.
        argv += ["--engine", "vllm", "--server-arg=--mamba-ssm-cache-dtype",
                 "--server-arg=float32"]  # fmt: skip
    assert cli.main(argv) == 0
    with capsys.disabled():
        print("\n" + capsys.readouterr().out)
    doc = json.loads(out.read_text())
    rows = {r["kind"]: r for r in doc["rows"]}
    assert set(rows) == {"cold", "warm"}
    assert rows["cold"]["cache_files"] > 0
    assert rows["warm"]["cache_files"] >= rows["cold"]["cache_files"]
    assert rows["cold"]["init_s"] is not None and rows["warm"]["init_s"] is not None
    health = doc["summary"]["health_s"]
    assert health["warm_over_cold"] == pytest.approx(health["warm"] / health["cold"])
    # The AOT artifact loads on the warm boot exactly when the series fixes it.
    manifest = caches.find_manifest()
    fixed = manifest is not None and "aot-cache-load" in getattr(
        manifest, "provided_features", frozenset()
    )
    assert rows["warm"]["load_failure"] is (not fixed)
    assert rows["warm"]["aot_loaded"] is fixed
