"""Start, wait for and stop a local vLLM server process (tests, benchmarks, the demo).

The server runs in its own session (process group): vLLM forks an engine-core process and,
on CPU, workers, and ``stop()`` must take all of them down, not just the parent. ``stop()``
sends SIGINT first (vLLM drains and exits 0 on it), then SIGKILL to the group after a grace
period.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from qwen3090.errors import Qwen3090Error


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class LocalServer:
    """A started server process; ``base_url`` is ``http://127.0.0.1:PORT``."""

    def __init__(
        self, process: subprocess.Popen[bytes], port: int, log_path: Path, started: float
    ) -> None:
        self.process = process
        self.port = port
        self.log_path = log_path
        self.base_url = f"http://127.0.0.1:{port}"
        self.started = started
        """``time.monotonic()`` just before the process was spawned."""

    def health_status(self) -> int | None:
        """The HTTP status of GET /health, or None when nothing answers."""
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as err:
            return int(err.code)
        except (urllib.error.URLError, OSError):
            return None

    def wait_healthy(self, timeout_s: float, poll_s: float = 1.0) -> float:
        """Seconds from the spawn until /health answered 200 (to ``poll_s``); raises if the
        process dies or ``timeout_s`` from the spawn runs out."""
        start = self.started
        while True:
            if self.health_status() == 200:
                return time.monotonic() - start
            code = self.process.poll()
            if code is not None:
                raise Qwen3090Error(
                    f"the server exited with code {code} before /health answered; log "
                    f"{self.log_path}:\n{_tail(self.log_path)}",
                    fix="read the log above",
                )
            if time.monotonic() - start > timeout_s:
                raise Qwen3090Error(
                    f"the server on port {self.port} was not healthy after {timeout_s:.0f} s; "
                    f"log {self.log_path}:\n{_tail(self.log_path)}",
                    fix="read the log above, or allow a longer timeout",
                )
            time.sleep(poll_s)

    def stop(self, grace_s: float = 30.0) -> int | None:
        """Stop the server and every process of its group; returns its exit code."""
        if self.process.poll() is None:
            self._signal_group(signal.SIGINT)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.process.wait(timeout=30)
        # Children (engine core, workers) can outlive the parent; the group goes with it.
        self._signal_group(signal.SIGKILL)
        return self.process.returncode

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class PortLease:
    """A port reserved for this process: an exclusive lock file per port, because vLLM binds
    its port only after a minute of start-up, and a second test session probing in that
    minute would otherwise pick the same "free" port and talk to the wrong server."""

    def __init__(self, port: int, handle: int) -> None:
        self.port = port
        self._handle = handle

    def release(self) -> None:
        if self._handle >= 0:
            os.close(self._handle)  # closing drops the lock
            self._handle = -1


def reserve_port(candidates: Iterable[int]) -> PortLease:
    """The first of ``candidates`` that no other process has reserved and nothing listens on."""
    lock_dir = Path(tempfile.gettempdir())
    for port in candidates:
        handle = os.open(lock_dir / f"qwen3090-port-{port}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(handle)
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                os.close(handle)
                continue
        return PortLease(port, handle)
    raise Qwen3090Error(
        "no free port among the candidates", fix="stop servers left running from earlier runs"
    )


def start_server(
    argv: Sequence[str], env: Mapping[str, str], port: int, log_path: Path
) -> LocalServer:
    """Start ``argv`` (which must serve on ``port``) with exactly ``env``, logging to
    ``log_path``; returns at once (call ``wait_healthy``)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        started = time.monotonic()
        process = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return LocalServer(process, port, log_path, started)


@dataclass(frozen=True)
class RunningServer:
    """A healthy server with what a client needs (the ``cpu_server`` test fixture's type)."""

    base_url: str
    api_key: str
    model: str
    """The served model name (what requests put in "model")."""
    model_dir: Path
    log_path: Path
    server: LocalServer
    boot_seconds: float
    """Seconds from start to /health 200."""
