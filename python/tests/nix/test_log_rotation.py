"""modules/qwen3090/rotate-log.sh, the server unit's ExecStartPre, on real files; and the
exporter's boot-log follower across the rotation it does.

The unit runs the script (through writeShellScript, i.e. bash) before every start: a log over
the limit moves to server.log.1, replacing the older copy, and an empty server.log is left,
so the exporter never finds the file missing and starts over on the new one.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from qwen3090.bootlog import BootLogFollower
from tests.support.nixeval import REPO

pytestmark = pytest.mark.nix

ROTATE = REPO / "modules" / "qwen3090" / "rotate-log.sh"
LIMIT = 16 * 1024 * 1024
SHELLS = ["sh", "bash"]


def _rotate(log: Path, limit: int = LIMIT, shell: str = "sh") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [shell, str(ROTATE), str(log), str(limit)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("shell", SHELLS)
def test_rotation_moves_a_large_log_aside_and_keeps_one_copy(tmp_path: Path, shell: str) -> None:
    log = tmp_path / "server.log"
    with log.open("wb") as fh:
        fh.write(b"INFO boot one\n")
        fh.truncate(LIMIT + 1)  # sparse: 16 MiB + 1 byte without writing them
    old = tmp_path / "server.log.1"
    old.write_text("the boot before\n")
    done = _rotate(log, shell=shell)
    assert done.returncode == 0, done.stderr
    assert old.stat().st_size == LIMIT + 1
    assert old.read_bytes().startswith(b"INFO boot one\n")
    # A fresh, empty file: the exporter never finds the log missing.
    assert log.is_file() and log.stat().st_size == 0
    assert "moved to" in done.stdout


@pytest.mark.parametrize("shell", SHELLS)
def test_rotation_leaves_a_log_at_the_limit_alone(tmp_path: Path, shell: str) -> None:
    log = tmp_path / "server.log"
    with log.open("wb") as fh:
        fh.write(b"INFO boot\n")
        fh.truncate(LIMIT)
    done = _rotate(log, shell=shell)
    assert done.returncode == 0, done.stderr
    assert log.stat().st_size == LIMIT
    assert not (tmp_path / "server.log.1").exists()
    small = tmp_path / "small.log"
    small.write_text("INFO one line\n")
    assert _rotate(small, shell=shell).returncode == 0
    assert small.read_text() == "INFO one line\n"


def test_rotation_creates_a_missing_log_and_refuses_bad_arguments(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    assert _rotate(log).returncode == 0
    assert log.is_file() and log.stat().st_size == 0
    bad = subprocess.run(
        ["sh", str(ROTATE), str(log), "16MiB"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "'16MiB'" in bad.stderr
    assert subprocess.run(["sh", str(ROTATE)], capture_output=True, timeout=60).returncode == 2


def _boot(tokens: int) -> str:
    return (
        "INFO 12-01 10:00:00 [api_utils.py:1] non-default args: {'port': 18020}\n"
        "INFO 12-01 10:00:01 [core.py:1] Initializing a V1 LLM engine (v0.28.0) with config\n"
        f"INFO 12-01 10:00:30 [kv_cache_utils.py:1] GPU KV cache size: {tokens:,} tokens\n"
    )


def test_the_follower_starts_over_on_the_rotated_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    limit = 4096
    log.write_text(_boot(100_000) + "INFO padding\n" * 400)
    follower = BootLogFollower(log)
    first = follower.poll()
    assert first is not None and first.kv_cache_tokens == 100_000
    assert _rotate(log, limit=limit).returncode == 0
    assert (tmp_path / "server.log.1").is_file()
    # The next boot writes more than the old file held before the exporter polls again: the
    # size alone would not show the change, the new inode does.
    log.write_text(_boot(90_000) + "INFO later\n" * 800)
    assert log.stat().st_size > limit
    facts = follower.poll()
    assert facts is not None and facts.kv_cache_tokens == 90_000
    # Polled between the rotation and the next boot: an empty log, no stale pool.
    follower = BootLogFollower(log)
    assert follower.poll() is not None
    assert _rotate(log, limit=limit).returncode == 0
    empty = follower.poll()
    assert empty is not None and empty.kv_cache_tokens is None
