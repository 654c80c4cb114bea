"""Which card the gate watches: the one CUDA_VISIBLE_DEVICES gives the server (issue 19, item 6).

The mapping from CUDA's numbering to NVML's is a pure function over the cards' identities, so
every rule runs here without a GPU; the end-to-end cases run the real ``qwen3090 gate`` over
an ``nvidia-smi`` that prints the real CSV format for two cards (as in test_gate_smi_wsl.py).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from qwen3090.gpuprobe import GpuIdentity, GpuSelectionError, server_gpu, smi_gpus

pytestmark = pytest.mark.unit

UUID0 = "GPU-8c1ab3f5-4e0d-2b7a-91c6-3f5d0e2a7b44"
UUID1 = "GPU-0f3e9a21-77c4-1d2e-a5b8-6c0d4e1f2a93"
TWIN = (
    GpuIdentity(0, UUID0, "NVIDIA GeForce RTX 3090"),
    GpuIdentity(1, UUID1, "NVIDIA GeForce RTX 3090"),
)
# A small desktop card on the first slot, the 3090 on the second: fastest-first puts the
# 3090 first for CUDA, while NVML calls it 1.
MIXED = (
    GpuIdentity(0, UUID0, "NVIDIA T400"),
    GpuIdentity(1, UUID1, "NVIDIA GeForce RTX 3090"),
)


def test_unset_is_cuda_device_0() -> None:
    assert server_gpu(None, None, TWIN).index == 0
    assert server_gpu(None, None, TWIN[:1]).index == 0


def test_the_first_visible_index_is_the_servers_card() -> None:
    assert server_gpu("1", None, TWIN).index == 1
    assert server_gpu("1,0", "PCI_BUS_ID", TWIN).index == 1
    assert server_gpu(" 0 , 1", None, TWIN).index == 0
    chosen = server_gpu("1", "PCI_BUS_ID", MIXED)
    assert chosen.index == 1 and "CUDA_VISIBLE_DEVICES=1" in chosen.how


def test_a_uuid_or_its_unique_prefix_names_the_card_in_any_order() -> None:
    assert server_gpu(UUID1, None, MIXED).index == 1
    assert server_gpu("GPU-0f3e", None, MIXED).index == 1
    assert server_gpu(f"{UUID0.lower()},1", None, MIXED).index == 0
    with pytest.raises(GpuSelectionError, match="no card has a UUID starting with GPU-ffff"):
        server_gpu("GPU-ffff", None, TWIN)
    both = (TWIN[0], GpuIdentity(1, "GPU-8c1a0000", "NVIDIA GeForce RTX 3090"))
    with pytest.raises(GpuSelectionError, match="2 cards have"):
        server_gpu("GPU-8c1a", None, both)


def test_an_index_on_mixed_cards_under_fastest_first_is_refused() -> None:
    for order in (None, "", "FASTEST_FIRST"):
        with pytest.raises(GpuSelectionError) as err:
            server_gpu("0", order, MIXED)
        assert "NVIDIA T400" in err.value.message and "fastest first" in err.value.message
        assert err.value.fix is not None
        assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in err.value.fix and "GPU-" in err.value.fix
    # Unset CUDA_VISIBLE_DEVICES is CUDA's device 0, just as ambiguous.
    with pytest.raises(GpuSelectionError, match="cannot be told"):
        server_gpu(None, None, MIXED)


def test_nothing_visible_is_no_card() -> None:
    for visible in ("", "-1", " , 0"):
        chosen = server_gpu(visible, None, TWIN)
        assert chosen.index is None and "CUDA sees no GPU" in chosen.how


def test_mig_out_of_range_garbage_and_unknown_order_are_refused() -> None:
    with pytest.raises(GpuSelectionError, match="MIG instance"):
        server_gpu("MIG-4f0e1a2b-0c3d-5e6f-7a8b-9c0d1e2f3a4b", None, TWIN)
    with pytest.raises(GpuSelectionError, match="no GPU 2; this machine has 2"):
        server_gpu("2", "PCI_BUS_ID", TWIN)
    with pytest.raises(GpuSelectionError, match="neither an index nor a GPU- UUID"):
        server_gpu("gpu0", None, TWIN)
    with pytest.raises(GpuSelectionError, match="CUDA_DEVICE_ORDER='pci_bus_id'"):
        server_gpu("0", "pci_bus_id", TWIN)


def _two_card_smi(tmp_path: Path, names: tuple[str, str], used: tuple[int, int]) -> Path:
    """An ``nvidia-smi`` that lists two cards: a 21.9 GiB vLLM on the first, the second idle."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    gpu = tmp_path / "gpu.csv"
    gpu.write_text(
        f"0, {UUID0}, {names[0]}, {used[0]}, 24576, Disabled, Disabled\n"
        f"1, {UUID1}, {names[1]}, {used[1]}, 24576, Disabled, Disabled\n"
    )
    apps = tmp_path / "apps.csv"
    apps.write_text(f"{UUID0}, 4242, python3, 21840\n")
    script = bindir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f'  --query-gpu=*) cat "{gpu}" ;;\n'
        f'  --query-compute-apps=*) cat "{apps}" ;;\n'
        '  *) echo "unexpected: $*" >&2; exit 9 ;;\n'
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bindir


def _gate(bindir: Path, env_extra: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES",
                                                             "CUDA_DEVICE_ORDER")}
    env.update(env_extra, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(
        [sys.executable, "-m", "qwen3090", "gate", "--source", "nvidia-smi", "--timeout", "1",
         "--interval", "0.1", "--samples", "2", *args],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )


def test_the_gate_watches_the_card_cuda_visible_devices_names(tmp_path: Path) -> None:
    rtx = "NVIDIA GeForce RTX 3090"
    bindir = _two_card_smi(tmp_path, (rtx, rtx), (21900, 4))
    assert [g.index for g in smi_gpus(str(bindir / "nvidia-smi"))] == [0, 1]
    for visible in ("1", UUID1, "GPU-0f3e9a21,0"):
        done = _gate(bindir, {"CUDA_VISIBLE_DEVICES": visible})
        assert done.returncode == 0, done.stderr
        assert "GPU 1 (NVIDIA GeForce RTX 3090) is free: 4 of 24576 MiB" in done.stdout
        assert f"CUDA_VISIBLE_DEVICES={visible}: nvidia-smi GPU 1" in done.stdout
    # Unset: CUDA device 0, the busy card, as before.
    busy = _gate(bindir, {})
    assert busy.returncode == 3 and "pid 4242" in busy.stderr
    # An explicit --device-index still wins over the environment.
    picked = _gate(bindir, {"CUDA_VISIBLE_DEVICES": "1"}, "--device-index", "0")
    assert picked.returncode == 3, picked.stdout


def test_the_gate_refuses_an_ambiguous_index_naming_both_ways_out(tmp_path: Path) -> None:
    bindir = _two_card_smi(tmp_path, ("NVIDIA T400", "NVIDIA GeForce RTX 3090"), (900, 4))
    done = _gate(bindir, {"CUDA_VISIBLE_DEVICES": "0"})
    assert done.returncode == 2, done.stdout
    assert "cannot be told" in done.stderr
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in done.stderr and "--device-index" in done.stderr
    ordered = _gate(bindir, {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert ordered.returncode == 0 and "GPU 1 (NVIDIA GeForce RTX 3090)" in ordered.stdout
    hidden = _gate(bindir, {"CUDA_VISIBLE_DEVICES": ""})
    assert hidden.returncode != 0 and "CUDA sees no GPU" in hidden.stderr
    cpu = _gate(bindir, {"CUDA_VISIBLE_DEVICES": "-1"}, "--plan-device", "cpu")
    assert cpu.returncode == 0 and "nothing to gate" in cpu.stdout
