"""WSL2 detection, and what running under it changes for this deployment."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# What WSL2 changes, each from a gotcha; printed by the gate and usable by the planner.
WSL2_CHANGES = (
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False: WSL2's paravirtual driver rejects "
    "the CUDA VMM calls expandable segments need during graph capture (gotcha 3)",
    "about 0.5 GiB less usable dedicated memory than the same card on bare metal; the "
    "default SPEC=dflash2 boot sits ~50 MiB under that line (gotcha 53)",
    "running out of VRAM does not fail: WDDM backs the overflow with host memory and steps "
    "run 2-6x slower with nothing in vLLM's log, so a KV_MEM above the profile default is "
    "a slowdown, not an error (gotchas 35, 53); watch the Windows GPU counters "
    "'Dedicated Usage' / 'Shared Usage'",
    "nvidia-smi and NVML cannot attribute memory to processes under WDDM: the gate sees "
    "used memory but may list no holders",
)


@dataclass(frozen=True)
class WslInfo:
    is_wsl2: bool
    evidence: tuple[str, ...]


def detect_wsl(
    proc_version: Path = Path("/proc/version"), dxg: Path = Path("/dev/dxg")
) -> WslInfo:
    """WSL2 shows in the kernel's version string ("...microsoft-standard-WSL2...") and in the
    ``/dev/dxg`` paravirtual GPU device; either is enough."""
    evidence: list[str] = []
    try:
        version = proc_version.read_text(errors="replace")
    except OSError:
        version = ""
    if "microsoft" in version.lower():
        evidence.append(f"{proc_version} names Microsoft's kernel")
    if dxg.exists():
        evidence.append(f"{dxg} exists (the WSL2 GPU paravirtualization device)")
    return WslInfo(bool(evidence), tuple(evidence))
