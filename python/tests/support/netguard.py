"""Run the qwen3090 CLI with every outgoing socket connection logged and refused.

Usage: python netguard.py LOGFILE [qwen3090 args...]. The log gets one line per attempt, so a
test can assert that a command made no network call (and, on the download path, that it
did try: the proof that the guard sees the hub client's connections at all).
"""

from __future__ import annotations

import socket
import sys

_log = open(sys.argv[1], "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the process


def _refuse(self: object, address: object) -> None:
    _log.write(f"{address!r}\n")
    _log.flush()
    raise ConnectionRefusedError(111, "network disabled by the test")


def _refuse_ex(self: object, address: object) -> int:
    _log.write(f"{address!r}\n")
    _log.flush()
    return 111


socket.socket.connect = _refuse  # type: ignore[method-assign]
socket.socket.connect_ex = _refuse_ex  # type: ignore[method-assign]

from qwen3090.cli import main  # noqa: E402 - after the guard is in place

sys.exit(main(sys.argv[2:]))
