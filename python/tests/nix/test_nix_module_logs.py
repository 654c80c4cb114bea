"""services.qwen3090 hands the exporter the server's boot log (issue 19, item 7).

The server unit points vLLM's own logging at a JSON config rendered by the module: stdout (the
journal) plus /var/log/qwen3090/server.log; an ExecStartPre rotates that file; the exporter
unit reads it (--server-log) and keeps its largest-pool reference (--state-dir). Evaluated with
nixpkgs' lib (NIXPKGS_LIB, see tests/support/nixeval.py); the rendered logging config is fed
to the venv's real vLLM. The rotation script itself: test_log_rotation.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from qwen3090.bootlog import parse_boot_log
from tests.support.nixeval import REPO, eval_json, eval_module, eval_module_error, exec_argv

pytestmark = pytest.mark.nix

HARNESS = REPO / "checks" / "eval-module.nix"
SERVER_LOG = "/var/log/qwen3090/server.log"
LIMIT = 16 * 1024 * 1024


def _logging_config(configuration: str = "{ services.qwen3090.enable = true; }") -> Any:
    """The JSON file VLLM_LOGGING_CONFIG_PATH names, parsed. The stand-in writeText of the
    harness keeps its text: the file's content, as the unit will read it."""
    env_value = eval_json(
        f"let v = (import {HARNESS} {{ inherit lib; configuration = {configuration}; }})"
        ".config.systemd.services.qwen3090.environment.VLLM_LOGGING_CONFIG_PATH; "
        "in if builtins.isAttrs v then { inherit (v) name text; } else { notAFile = v; }"
    )
    assert "text" in env_value, (
        f"VLLM_LOGGING_CONFIG_PATH should name a file rendered with pkgs.writeText: {env_value}"
    )
    assert env_value["name"].endswith(".json")
    return json.loads(env_value["text"])


def test_logging_config_keeps_stdout_and_adds_the_server_log() -> None:
    config = _logging_config()
    handlers = config["handlers"]
    streams = [h for h in handlers.values() if h["class"] == "logging.StreamHandler"]
    files = [h for h in handlers.values() if h["class"] == "logging.FileHandler"]
    assert [h["stream"] for h in streams] == ["ext://sys.stdout"]
    assert [h["filename"] for h in files] == [SERVER_LOG]
    vllm = config["loggers"]["vllm"]
    assert sorted(vllm["handlers"]) == sorted(handlers)
    assert vllm["propagate"] is False and vllm["level"] == "INFO"
    # vLLM's own formatter for both: the exporter parses what the journal shows.
    for handler in handlers.values():
        formatter = config["formatters"][handler["formatter"]]
        assert formatter["class"] == "vllm.logging_utils.NewLineFormatter"


def test_logging_level_follows_vllm_logging_level() -> None:
    config = _logging_config(
        '{ services.qwen3090 = { enable = true; environment.VLLM_LOGGING_LEVEL = "DEBUG"; }; }'
    )
    assert config["loggers"]["vllm"]["level"] == "DEBUG"


def test_a_logging_config_of_the_users_own_is_refused() -> None:
    summary = eval_module(
        '{ services.qwen3090 = { enable = true; '
        'environment.VLLM_LOGGING_CONFIG_PATH = "/etc/mine.json"; }; }'
    )
    assert any(
        "VLLM_LOGGING_CONFIG_PATH" in m and SERVER_LOG in m for m in summary["failedAssertions"]
    )


def test_the_server_unit_owns_the_log_directory() -> None:
    summary = eval_module("{ services.qwen3090.enable = true; }")
    sc = summary["units"]["qwen3090"]["serviceConfig"]
    assert sc["LogsDirectory"] == "qwen3090"
    assert summary["failedAssertions"] == []


def _vllm_python() -> str:
    """The venv's interpreter, when it can import vLLM (the tests run under it)."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip(f"{sys.executable} cannot import vllm (run the tests in the project's venv)")
    return sys.executable


def test_vllm_logs_through_the_rendered_config_to_stdout_and_the_file(tmp_path: Path) -> None:
    """vLLM 0.28.0's own logging setup (vllm/logger.py, at import) accepts the rendered JSON,
    and a boot line logged by a vllm logger lands in both places, in a form the exporter's
    boot-log parser reads."""
    python = _vllm_python()
    config = _logging_config()
    log_file = tmp_path / "server.log"
    # Only the file's place changes: /var/log/qwen3090 is not writable here.
    for handler in config["handlers"].values():
        if handler["class"] == "logging.FileHandler":
            handler["filename"] = str(log_file)
    config_file = tmp_path / "vllm-logging.json"
    config_file.write_text(json.dumps(config))
    pool_line = "GPU KV cache size: 123,456 tokens"
    script = (
        "from vllm.logger import init_logger\n"
        "log = init_logger('vllm.v1.core.kv_cache_utils')\n"
        f"log.info({pool_line!r})\n"
        "log.debug('below the level')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env["VLLM_LOGGING_CONFIG_PATH"] = str(config_file)
    proc = subprocess.run(
        [python, "-c", script], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    in_file = log_file.read_text()
    assert pool_line in proc.stdout, proc.stdout[-2000:]
    assert pool_line in in_file
    assert "below the level" not in in_file + proc.stdout
    (line,) = [x for x in in_file.splitlines() if pool_line in x]
    # vLLM's format: level, time, [file:line], message.
    assert line.startswith("INFO ") and "[<string>:3]" in line, line
    assert parse_boot_log(in_file).kv_cache_tokens == 123456
    assert parse_boot_log(proc.stdout).kv_cache_tokens == 123456


def test_the_rotation_runs_first_with_the_rendered_script() -> None:
    summary = eval_module("{ services.qwen3090.enable = true; }")
    pre = summary["units"]["qwen3090"]["serviceConfig"]["ExecStartPre"]
    rotate = exec_argv(pre[0])
    # Before the model check, so a start that fails the check still bounds the log.
    assert rotate[0].endswith("-qwen3090-rotate-log")
    assert rotate[1:] == [SERVER_LOG, str(LIMIT)]
    assert exec_argv(pre[1])[1:3] == ["check", "model"]
    # The rendered script is this repository's rotate-log.sh (the tests below run that file).
    module = (REPO / "modules" / "qwen3090" / "default.nix").read_text()
    assert "builtins.readFile ./rotate-log.sh" in module


def test_exporter_reads_the_server_log_and_keeps_its_state() -> None:
    summary = eval_module(
        "{ services.qwen3090 = { enable = true; exporter.enable = true; }; }"
    )
    server = summary["units"]["qwen3090"]["serviceConfig"]
    sc = summary["units"]["qwen3090-exporter"]["serviceConfig"]
    argv = exec_argv(sc["ExecStart"])
    assert argv[argv.index("--server-log") + 1] == SERVER_LOG
    assert argv[argv.index("--state-dir") + 1] == "/var/lib/qwen3090-exporter"
    assert sc["StateDirectory"] == "qwen3090-exporter"
    # The server's log directory is visible to the exporter, read-only, with the same mode.
    assert sc["LogsDirectory"] == server["LogsDirectory"] == "qwen3090"
    assert sc["LogsDirectoryMode"] == server["LogsDirectoryMode"]
    assert sc["ReadOnlyPaths"] == ["/var/log/qwen3090"]
    assert sc["User"] == server["User"]
    # And `qwen3090 exporter` itself takes these arguments.
    from qwen3090.cli import build_parser

    args = build_parser().parse_args(argv[1:])
    assert args.server_log == Path(SERVER_LOG)
    assert args.state_dir == Path("/var/lib/qwen3090-exporter")


def test_the_log_relaxation_is_commented() -> None:
    lines = (REPO / "modules" / "qwen3090" / "default.nix").read_text().splitlines()
    exporter_from = next(
        i for i, line in enumerate(lines) if "systemd.services.qwen3090-exporter" in line
    )
    (index,) = [
        i for i, line in enumerate(lines)
        if i > exporter_from and line.strip() == 'LogsDirectory = "qwen3090";'
    ]
    comment = "\n".join(lines[index - 6:index])
    assert "Relaxed" in comment and "DynamicUser" in comment


@pytest.mark.parametrize("option", ["port", "exporter.port"])
@pytest.mark.parametrize("value", [0, 70000])
def test_ports_outside_1_to_65535_are_refused(option: str, value: int) -> None:
    error = eval_module_error(
        # The exporter enabled, or its port is never read.
        "{ services.qwen3090 = { enable = true; exporter.enable = true; "
        f"{option} = {value}; }}; }}"
    )
    assert f"services.qwen3090.{option}" in error
    assert "between 1 and 65535" in error


def test_ports_at_the_ends_of_the_range_are_accepted() -> None:
    summary = eval_module(
        "{ services.qwen3090 = { enable = true; port = 1; exporter = "
        "{ enable = true; port = 65535; }; openFirewall = true; }; }"
    )
    assert summary["firewall"]["allowedTCPPorts"] == [1, 65535]
