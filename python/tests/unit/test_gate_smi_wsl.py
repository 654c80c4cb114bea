"""The nvidia-smi source on real-format CSV, WSL2 detection, and ``qwen3090 gate`` end to end.

No GPU here, so ``nvidia-smi`` itself is a script that prints what the real tool prints for
the same query (format taken from the driver's CSV output: ``--format=csv,noheader,nounits``),
reading the card's state from a file the test rewrites. The gate, the probe, the subprocess
calls and the CLI around it are the real code.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from qwen3090.errors import Qwen3090Error
from qwen3090.gpuprobe import (
    QUERY_APPS_FIELDS,
    QUERY_GPU_FIELDS,
    NvidiaSmiProbe,
    parse_compute_apps,
    parse_query_gpu,
)
from qwen3090.wsl import detect_wsl

pytestmark = pytest.mark.unit

UUID0 = "GPU-8c1ab3f5-4e0d-2b7a-91c6-3f5d0e2a7b44"
UUID1 = "GPU-0f3e9a21-77c4-1d2e-a5b8-6c0d4e1f2a93"

# Two cards; the first drives a desktop.
QUERY_GPU_TEXT = (
    f"0, {UUID0}, NVIDIA GeForce RTX 3090, 23112, 24576, Enabled, Enabled\n"
    f"1, {UUID1}, NVIDIA GeForce RTX 3090, 4, 24576, Disabled, Disabled\n"
)
QUERY_APPS_TEXT = (
    f"{UUID0}, 31337, /home/u/venv/bin/python3, 21840\n"
    f"{UUID0}, 2048, /usr/lib/xorg/Xorg, [N/A]\n"
    f"{UUID1}, 999, python3, 310\n"
)


def test_query_gpu_fields_parse() -> None:
    rows = parse_query_gpu(QUERY_GPU_TEXT)
    assert [r.index for r in rows] == [0, 1]
    assert rows[0].uuid == UUID0 and rows[0].name == "NVIDIA GeForce RTX 3090"
    assert (rows[0].used_mib, rows[0].total_mib, rows[0].display_active) == (23112, 24576, True)
    assert rows[1].display_active is False


def test_query_gpu_unknown_display_and_name_with_comma() -> None:
    rows = parse_query_gpu(f"0, {UUID0}, Weird, Card, 10, 100, [N/A], [Not Supported]\n")
    assert rows[0].name == "Weird, Card"
    assert rows[0].display_active is None


def test_query_gpu_without_memory_is_an_error() -> None:
    with pytest.raises(ValueError, match="no memory figures"):
        parse_query_gpu(f"0, {UUID0}, X, [N/A], [N/A], Disabled, Disabled\n")


def test_compute_apps_parse_including_wddm_na() -> None:
    apps = parse_compute_apps(QUERY_APPS_TEXT)
    assert [(a.pid, a.name, a.used_mib) for a in apps] == [
        (31337, "/home/u/venv/bin/python3", 21840),
        (2048, "/usr/lib/xorg/Xorg", None),
        (999, "python3", 310),
    ]
    assert parse_compute_apps("") == []
    assert parse_compute_apps("No running processes found\n") == []


def _fake_smi(tmp_path: Path) -> tuple[Path, Path]:
    """An ``nvidia-smi`` on PATH that answers the two queries from files in ``state``."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    script = bindir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'state="{state}"\n'
        'case "$1" in\n'
        '  --query-gpu=*) cat "$state/gpu" ;;\n'
        '  --query-compute-apps=*) cat "$state/apps" ;;\n'
        '  *) echo "unexpected: $*" >&2; exit 9 ;;\n'
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bindir, state


def _set_state(state: Path, used: int, apps: str) -> None:
    # Written whole then renamed, like a reading of the real card: never half a line.
    for name, text in (
        ("gpu", f"0, {UUID0}, NVIDIA GeForce RTX 3090, {used}, 24576, Disabled, Disabled\n"),
        ("apps", apps),
    ):
        tmp = state / f".{name}"
        tmp.write_text(text)
        tmp.replace(state / name)


def test_probe_runs_the_real_queries(tmp_path: Path) -> None:
    bindir, state = _fake_smi(tmp_path)
    _set_state(state, 21900, f"{UUID0}, 4242, python3, 21840\n{UUID1}, 7, other, 5\n")
    probe = NvidiaSmiProbe(0, executable=str(bindir / "nvidia-smi"))
    s = probe.sample()
    assert s.source == "nvidia-smi" and s.used_mib == 21900 and s.total_mib == 24576
    # Only the processes on this card's uuid.
    assert [(p.pid, p.used_mib) for p in s.processes] == [(4242, 21840)]
    assert QUERY_GPU_FIELDS[0] == "index" and QUERY_APPS_FIELDS[0] == "gpu_uuid"


def _gate(bindir: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(
        [sys.executable, "-m", "qwen3090", "gate", "--source", "nvidia-smi", *args],
        env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )


def test_gate_cli_times_out_naming_the_holder(tmp_path: Path) -> None:
    bindir, state = _fake_smi(tmp_path)
    _set_state(state, 21900, f"{UUID0}, 4242, python3, 21840\n")
    done = _gate(bindir, "--timeout", "1", "--interval", "0.1")
    assert done.returncode == 3, done.stderr
    assert "pid 4242 (python3, 21840 MiB)" in done.stderr
    assert "21900 of 24576 MiB used" in done.stderr
    assert "raise --timeout / --threshold-mib" in done.stderr


def test_under_serve_the_gate_names_serve_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qwen3090 import gate
    from qwen3090.gpuprobe import NoNvidiaGpu

    empty = tmp_path / "empty"
    empty.mkdir()
    path = os.environ["PATH"]
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(NoNvidiaGpu) as err:
        gate.run_gate(gate.default_policy(), prefer="nvidia-smi")
    fix = err.value.fix or ""
    assert "--device cpu" in fix and "qwen3090 demo-model DIR" in fix
    assert "--plan-device" not in fix and "--device-index" not in fix
    bindir, state = _fake_smi(tmp_path)
    _set_state(state, 21900, f"{UUID0}, 4242, python3, 21840\n")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{path}")
    policy = gate.GatePolicy(timeout_s=0.3, interval_s=0.1)
    with pytest.raises(Qwen3090Error) as busy:
        gate.run_gate(policy, prefer="nvidia-smi")
    assert busy.value.exit_code == 3
    assert busy.value.fix is not None and "--no-gate" in busy.value.fix
    assert "--threshold-mib" not in busy.value.fix


def test_gate_cli_passes_once_the_holder_is_gone(tmp_path: Path) -> None:
    bindir, state = _fake_smi(tmp_path)
    _set_state(state, 21900, f"{UUID0}, 4242, python3, 21840\n")
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "qwen3090", "gate", "--source", "nvidia-smi", "--timeout", "60",
         "--interval", "0.1", "--samples", "3"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    # The gate's stderr is read as it comes: the card is released only once the gate has
    # said it is busy (a fixed sleep raced a slow start on a loaded machine: the release came
    # before the first poll and the gate never saw the holder).
    lines: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or ()), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not any("busy:" in line for line in lines) and time.monotonic() < deadline:
            assert proc.poll() is None, "the gate passed while the card was held"
            time.sleep(0.05)
        assert proc.poll() is None, "the gate passed while the card was held"
        _set_state(state, 310, "")
        released = time.monotonic()
        out = proc.stdout.read() if proc.stdout else ""
        proc.wait(timeout=30)
        waited = time.monotonic() - released
        reader.join(timeout=10)
        err = "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "GPU 0 (NVIDIA GeForce RTX 3090) is free: 310 of 24576 MiB used" in out
    assert "busy: compute process(es) pid 4242" in err
    print(f"nvidia-smi path: release to pass {waited:.2f} s (3 samples, 0.1 s interval)")


def test_no_gpu_is_one_line_unless_the_plan_is_cpu(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    env = dict(os.environ, PATH=str(empty))
    base = [sys.executable, "-m", "qwen3090", "gate", "--source", "nvidia-smi"]
    done = subprocess.run(base, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    # The message, then one fix line naming this command's own way out.
    message, fix = done.stderr.strip().split("\n")
    assert "no NVIDIA GPU" in message
    assert fix.strip().startswith("fix:") and "--plan-device cpu" in fix
    cpu = subprocess.run(
        [*base, "--plan-device", "cpu"], env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )
    assert cpu.returncode == 0 and "the plan is for the CPU" in cpu.stdout


WSL2_VERSION = (
    "Linux version 5.15.167.4-microsoft-standard-WSL2 (root@f9c826d3017f) (gcc (GCC) 11.2.0, "
    "GNU ld (GNU Binutils) 2.37) #1 SMP Tue Nov 5 00:21:55 UTC 2024\n"
)
METAL_VERSION = (
    "Linux version 6.8.0-45-generic (buildd@lcy02-amd64-115) (x86_64-linux-gnu-gcc-13 "
    "(Ubuntu 13.2.0-23ubuntu4) 13.2.0, GNU ld (GNU Binutils for Ubuntu) 2.42) #45-Ubuntu SMP\n"
)


def test_wsl2_detection(tmp_path: Path) -> None:
    version = tmp_path / "version"
    dxg = tmp_path / "dxg"
    version.write_text(WSL2_VERSION)
    info = detect_wsl(version, dxg)
    assert info.is_wsl2 and "Microsoft" in info.evidence[0]
    version.write_text(METAL_VERSION)
    assert not detect_wsl(version, dxg).is_wsl2
    dxg.touch()
    assert detect_wsl(version, dxg).is_wsl2
    assert not detect_wsl(tmp_path / "absent", tmp_path / "absent-dxg").is_wsl2


def test_a_source_failing_mid_wait_is_a_clean_error(tmp_path: Path) -> None:
    bindir, state = _fake_smi(tmp_path)
    _set_state(state, 21900, f"{UUID0}, 4242, python3, 21840\n")
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "qwen3090", "gate", "--source", "nvidia-smi", "--timeout", "60",
         "--interval", "0.1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        time.sleep(1.5)
        (state / "gpu").unlink()  # the next query fails, as nvidia-smi does when the driver goes
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2
    assert "reading GPU 0 through nvidia-smi failed" in err
    assert "Traceback" not in err
