"""The server's log in a file of its own, for the exporter, while stdout still goes to the
journal: vLLM 0.28.0's ``VLLM_LOGGING_CONFIG_PATH`` with a second (file) handler.

This is the way the NixOS unit is meant to give ``qwen3090 exporter --server-log`` its file
(issue 19, item 7; see modules/prometheus/README.md): reading the journal needs privileges
the exporter should not have, and ``StandardOutput=append:`` would take the log out of the
journal. The API server and the engine core are separate processes; both must write their
boot lines to the file, and the boot-log parser must read them without the process prefix
vLLM adds on stdout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwen3090.bootlog import parse_boot_log
from tests.support.obs_stack import start_cpu_server

pytestmark = pytest.mark.e2e_cpu

SERVER_PORT = 18513


def logging_config(log_file: Path) -> dict[str, object]:
    """vLLM's "vllm" logger to stdout (as by default) and appended to ``log_file``."""
    plain = {"format": "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"}
    console = {"class": "logging.StreamHandler", "formatter": "plain", "stream": "ext://sys.stdout"}
    to_file = {"class": "logging.FileHandler", "formatter": "plain", "filename": str(log_file)}
    vllm = {"handlers": ["console", "file"], "level": "INFO", "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": plain},
        "handlers": {"console": console, "file": to_file},
        "loggers": {"vllm": vllm},
    }


def test_a_logging_config_gives_the_exporter_a_file_and_keeps_stdout(
    demo_model_dir: Path, tmp_path: Path
) -> None:
    log_file = tmp_path / "logs" / "server.log"
    log_file.parent.mkdir()
    config = tmp_path / "vllm-logging.json"
    config.write_text(json.dumps(logging_config(log_file)))
    server = start_cpu_server(
        demo_model_dir, SERVER_PORT, tmp_path, {"VLLM_LOGGING_CONFIG_PATH": str(config)}
    )
    try:
        boot_s = server.wait_healthy(900)
    finally:
        server.stop()
    from_file = parse_boot_log(log_file.read_text())
    from_stdout = parse_boot_log(server.log_path.read_text())
    print(f"[obs] healthy after {boot_s:.0f} s; file: {from_file}")
    # The engine core's lines (pool, compilation) reached the file as well as the API's.
    assert from_file.kv_cache_tokens is not None and from_file.kv_cache_tokens > 0
    assert from_file.engine_args is not None and "'enable_prefix_caching': True" in (
        from_file.engine_args
    )
    assert from_file.compile_cache_warm is not None
    # And stdout (the journal under systemd) still says the same.
    assert from_stdout.kv_cache_tokens == from_file.kv_cache_tokens
    assert from_stdout.engine_args == from_file.engine_args
