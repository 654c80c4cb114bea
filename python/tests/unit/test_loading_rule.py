"""The low-RAM loading rule (gotcha 41) and the figures it is fed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwen3090.loading import (
    DEFAULT_MARGIN_BYTES,
    GIB,
    MIN_MEMORY_LIMIT_BYTES,
    available_ram_bytes,
    checkpoint_size,
    load_format_args,
    streamer_problem,
)

pytestmark = pytest.mark.unit

CHECKPOINT = 15_900_000_000  # the 27B W4A16 checkpoint of gotcha 41, ~15.9 GB
EMBED = 2_542_796_800  # its largest tensor, the bf16 embed_tokens


def _limit(args: list[str]) -> int:
    i = args.index("--model-loader-extra-config")
    config = json.loads(args[i + 1])
    assert set(config) == {"memory_limit"}
    return int(config["memory_limit"])


def test_low_ram_host_streams() -> None:
    # The reporter's 16 GB box had ~10 GiB free.
    args, reason = load_format_args(CHECKPOINT, 10 * GIB, None, largest_tensor_bytes=EMBED)
    assert args[:2] == ["--load-format", "runai_streamer"]
    assert _limit(args) == EMBED
    assert reason is not None and "gotcha 41" in reason


def test_roomy_host_keeps_the_stock_loader() -> None:
    assert load_format_args(CHECKPOINT, 64 * GIB, None) == ([], None)


@pytest.mark.parametrize("delta", [-1, 0])
def test_boundary_is_checkpoint_plus_margin(delta: int) -> None:
    available = CHECKPOINT + DEFAULT_MARGIN_BYTES + delta
    args, _ = load_format_args(CHECKPOINT, available, None)
    assert bool(args) == (delta < 0)


def test_forced_either_way() -> None:
    args, reason = load_format_args(CHECKPOINT, 512 * GIB, True)
    assert "runai_streamer" in args and reason is not None
    assert load_format_args(CHECKPOINT, 1 * GIB, False) == ([], None)


def test_memory_limit_never_below_two_gib_and_never_the_s3_package() -> None:
    args, _ = load_format_args(1000, 0, None, largest_tensor_bytes=10)
    assert _limit(args) == MIN_MEMORY_LIMIT_BYTES
    assert not any("s3" in a for a in args)


def test_checkpoint_size_reads_the_headers(tiny_model: Path) -> None:
    from safetensors import safe_open

    total, largest = checkpoint_size(tiny_model)
    shards = sorted(tiny_model.glob("*.safetensors"))
    assert total == sum(s.stat().st_size for s in shards)
    biggest = 0
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                t = f.get_tensor(key)
                biggest = max(biggest, t.numel() * t.element_size())
    assert largest == biggest


def test_available_ram_prefers_the_cgroup_cap(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 32000000 kB\nMemFree: 1000 kB\nMemAvailable: 20000000 kB\n")
    cg = tmp_path / "cg"
    cg.mkdir()
    assert available_ram_bytes(meminfo, cg) == 20_000_000 * 1024
    (cg / "memory.max").write_text("max\n")
    (cg / "memory.current").write_text("123\n")
    assert available_ram_bytes(meminfo, cg) == 20_000_000 * 1024
    (cg / "memory.max").write_text(f"{10 * GIB}\n")
    (cg / "memory.current").write_text(f"{2 * GIB}\n")
    assert available_ram_bytes(meminfo, cg) == 8 * GIB


def test_the_streamer_is_installed_without_the_s3_variant() -> None:
    # The CPU tier (dev.sh's cpu extra) installs runai-model-streamer; this must hold for the
    # e2e load test to mean anything.
    assert streamer_problem() is None
