"""How vLLM should read the checkpoint: the stock loader, or the Run:ai streamer on low RAM.

The stock loader mmaps every shard and bets that page-cache reclaim keeps up; a 16 GB host
(~10 GiB free) died loading the 15.9 GiB checkpoint, and under a 10 GiB cgroup cap the stock
loader's peak was the cap to the byte (gotcha 41). The Run:ai streamer bounds its staging
window with ``memory_limit`` and was faster there too (6.3 s against 11.7 s).

Only the plain ``runai-model-streamer`` package is wanted: ``runai-model-streamer-s3``
imports boto3 at package import and breaks the loader on a box without it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
from pathlib import Path

GIB = 1 << 30
# The engine's own host footprint beside the checkpoint: 8.46 GB process peak under the
# streamer with a 2 GiB window (gotcha 41) leaves ~6.3 GB that is not the weights.
DEFAULT_MARGIN_BYTES = 6 * GIB
# The staging window: at least the largest single tensor (the bf16 embed_tokens of the 27B
# checkpoint is 2,542,796,800 bytes), never under the 2 GiB measured to load fine.
MIN_MEMORY_LIMIT_BYTES = 2 * GIB


def streamer_memory_limit(largest_tensor_bytes: int | None) -> int:
    return max(MIN_MEMORY_LIMIT_BYTES, largest_tensor_bytes or 0)


def load_format_args(
    checkpoint_bytes: int,
    available_ram_bytes: int,
    forced: bool | None,
    *,
    largest_tensor_bytes: int | None = None,
    margin_bytes: int = DEFAULT_MARGIN_BYTES,
) -> tuple[list[str], str | None]:
    """vLLM arguments for the loader, and the reason (None when the stock loader is used).

    ``forced``: True always streams, False never does, None decides from RAM: stream when
    the available RAM is below the checkpoint plus ``margin_bytes``.
    """
    limit = streamer_memory_limit(largest_tensor_bytes)
    args = [
        "--load-format", "runai_streamer",
        "--model-loader-extra-config", json.dumps({"memory_limit": limit}),
    ]
    if forced is True:
        return args, f"the Run:ai streamer was asked for (memory_limit {limit} bytes)"
    if forced is False:
        return [], None
    needed = checkpoint_bytes + margin_bytes
    if available_ram_bytes < needed:
        return args, (
            f"{available_ram_bytes / GIB:.1f} GiB of RAM available is less than the checkpoint "
            f"({checkpoint_bytes / GIB:.1f} GiB) plus {margin_bytes / GIB:.1f} GiB for the "
            f"engine: streaming the weights with a {limit / GIB:.2f} GiB window instead of "
            "letting the stock loader race page-cache eviction (gotcha 41)"
        )
    return [], None


def checkpoint_size(model_dir: Path) -> tuple[int, int]:
    """(bytes of all safetensors files, bytes of the largest single tensor) in ``model_dir``,
    read from the files' headers only."""
    from qwen3090.modelcheck import safetensors_header

    total = 0
    largest = 0
    for shard in sorted(model_dir.glob("*.safetensors")):
        total += shard.stat().st_size
        header, _ = safetensors_header(shard)
        for key, info in (header or {}).items():
            if key == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            largest = max(largest, int(end) - int(begin))
    return total, largest


def _cgroup_headroom(root: Path) -> int | None:
    # A cgroup v2 cap (a container, a systemd MemoryMax=) binds before the host's free RAM.
    try:
        limit = (root / "memory.max").read_text().strip()
        current = int((root / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None
    if limit == "max":
        return None
    try:
        return max(0, int(limit) - current)
    except ValueError:
        return None


def available_ram_bytes(
    meminfo: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")
) -> int:
    """MemAvailable, or the headroom under this process's cgroup v2 cap when that is less."""
    available: int | None = None
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    if available is None:  # kernels before 3.14 lack MemAvailable: free pages are the floor
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    headroom = _cgroup_headroom(cgroup)
    return available if headroom is None else min(available, headroom)


def streamer_problem() -> str | None:
    """Why the streamer cannot be used here, or None."""
    if importlib.util.find_spec("runai_model_streamer") is None:
        return (
            "the Run:ai streamer is not installed: pip install runai-model-streamer "
            "(not runai-model-streamer-s3)"
        )
    try:
        importlib.metadata.version("runai-model-streamer-s3")
    except importlib.metadata.PackageNotFoundError:
        return None
    return (
        "runai-model-streamer-s3 is installed: it imports boto3 at package import and breaks "
        "the loader where boto3 is absent; local files need only runai-model-streamer "
        "(pip uninstall runai-model-streamer-s3)"
    )
