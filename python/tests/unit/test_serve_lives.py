"""serve_lives.sh, the GPU tier's driver of several server lives in one device call.

The lives themselves need the lent H200; here a stand-in serve_on_device.sh beside a copy of
the driver records what each life was given, so what is checked is the driver's own work:
knobs reach their life, each life writes under its own folder, the tarball is rewritten after
every life and a failed life neither stops the next nor hides its exit status.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

DRIVER = Path(__file__).resolve().parents[1] / "gpu" / "serve_lives.sh"

# Writes its knobs into $OUT/result.json and exits with $RC (default 0).
STAND_IN = """#!/usr/bin/env bash
mkdir -p "$OUT"
printf '{"spec": "%s", "shape": "%s"}\\n' "${SPEC:-}" "${SHAPE:-}" > "$OUT/result.json"
echo "life log" >&2
# KILL=1: the device call cut at its limit, the driver killed mid-life.
[ "${KILL:-0}" = 1 ] && kill -9 "$PPID"
exit "${RC:-0}"
"""


def _drive(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    shutil.copy2(DRIVER, bundle / "serve_lives.sh")
    (bundle / "serve_on_device.sh").write_text(STAND_IN)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return subprocess.run(["bash", str(bundle / "serve_lives.sh"), *args], cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "OUT": str(out)},
                          capture_output=True, text=True, timeout=60)


def _members(tgz: Path) -> dict[str, bytes]:
    with tarfile.open(tgz) as tar:
        return {m.name.removeprefix("./"): tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar.getmembers() if m.isfile()}


def test_each_life_gets_its_knobs_and_folder_and_a_failure_is_recorded(tmp_path: Path) -> None:
    run = _drive(tmp_path, "t", "huge|SPEC=off SHAPE=27b", "mtp|SPEC=mtp RC=3", "plain")
    assert run.returncode == 0, run.stderr
    files = _members(tmp_path / "out" / "t.tgz")
    assert files["huge/result.json"] == b'{"spec": "off", "shape": "27b"}\n'
    assert files["mtp/result.json"] == b'{"spec": "mtp", "shape": ""}\n'
    assert files["plain/result.json"] == b'{"spec": "", "shape": ""}\n'
    assert files["mtp.stderr"] == b"life log\n"
    times = files["times.txt"].decode().splitlines()
    assert [line.split()[:2] for line in times] == [["huge", "rc=0"], ["mtp", "rc=3"],
                                                    ["plain", "rc=0"]]
    # Nothing but the tarball is left in $OUT (a call returns at most eight files).
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["t.tgz"]


def test_a_call_cut_mid_life_still_returns_the_lives_before(tmp_path: Path) -> None:
    run = _drive(tmp_path, "t", "first|SPEC=off", "cut|KILL=1", "never|SPEC=mtp")
    assert run.returncode == -9
    files = _members(tmp_path / "out" / "t.tgz")
    assert files["first/result.json"] == b'{"spec": "off", "shape": ""}\n'
    assert not any(name.startswith(("cut/", "never")) for name in files), sorted(files)


@pytest.mark.parametrize("life", ["../up|SPEC=off", ".hidden", "|SPEC=off"])
def test_a_life_name_that_is_no_plain_folder_is_refused(tmp_path: Path, life: str) -> None:
    run = _drive(tmp_path, "t", life)
    assert run.returncode == 2
    assert "bad life name" in run.stderr


def test_no_life_is_a_usage_error(tmp_path: Path) -> None:
    run = _drive(tmp_path, "t")
    assert run.returncode == 2
    assert "usage" in run.stderr
