"""The gate on a real NVIDIA card: runs ``tests/gpu/gate_on_device.py`` where a GPU exists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).resolve().with_name("gate_on_device.py")


def _has_nvidia_gpu() -> bool:
    from qwen3090.gpuprobe import NoNvidiaGpu, open_probe

    try:
        open_probe(0).close()
    except NoNvidiaGpu:
        return False
    return True


def test_gate_on_a_real_card() -> None:
    if not _has_nvidia_gpu():
        pytest.skip("no NVIDIA GPU here (NVML and nvidia-smi both absent); run on the lent H200")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--reps", "3", "--smi-reps", "1"],
        capture_output=True, text=True, timeout=900, check=False,
    )
    print(done.stdout[-6000:])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
