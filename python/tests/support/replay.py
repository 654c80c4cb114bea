"""The nix-replay tier's plumbing: the pinned wheels (fetched by the table's sha256 into a cache
outside the repository), and the build scripts of nix/build run as the derivations run them.

Nothing here describes a build step: each step is the script the .nix file calls, given local
paths instead of store paths.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
BUILD = REPO / "nix" / "build"
TABLE = REPO / "nix" / "closure" / "table.json"
DECISIONS = BUILD / "decisions.json"
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
# nixpkgs' python3Packages.installer is 0.7.0; the replay installs with the same release.
INSTALLER = "installer==0.7.0"
INSTALLER_SHA256 = "05d1933f0a5ba7d8d6296bb6d5018e7c94fa473ceb10cf198a92ccea19c27b53"


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "qwen3090"


def table() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(TABLE.read_text())
    return data


def wheel_set(part: str) -> list[dict[str, str]]:
    entries: list[dict[str, str]] = table()["pythons"][PYTHON][part]
    return entries


def decisions() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DECISIONS.read_text())
    return data


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(entries: Sequence[dict[str, str]]) -> list[Path]:
    """Each wheel from the cache, downloading (with progress) what is not there yet."""
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    paths = []
    for n, entry in enumerate(entries, 1):
        want = base64.b64decode(entry["hash"].removeprefix("sha256-")).hex()
        dest = wheels / entry["file"]
        if not dest.exists():
            print(f"[nix-replay] fetching {n}/{len(entries)} {entry['file']}", flush=True)
            part = dest.with_name(dest.name + ".part")
            with urllib.request.urlopen(entry["url"], timeout=300) as r, part.open("wb") as f:
                shutil.copyfileobj(r, f, 1 << 20)
            got = sha256_of(part)
            if got != want:
                part.unlink()
                raise AssertionError(f"{entry['file']}: sha256 {got}, table.json says {want}")
            part.rename(dest)
        paths.append(dest)
    return paths


def installer_wheel() -> Path:
    """The `installer` wheel nixpkgs' build puts on PYTHONPATH, here from PyPI by pip."""
    wheels = cache_dir() / "wheels"
    dest = wheels / "installer-0.7.0-py3-none-any.whl"
    if not dest.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels),
             INSTALLER],
            check=True,
        )
    assert sha256_of(dest) == INSTALLER_SHA256, f"{dest}: unexpected sha256"
    return dest


def run(argv: Sequence[str], env: dict[str, str] | None = None,
        timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=timeout)


def install_closure(prefix: Path, wheels: Sequence[Path], decisions_file: Path = DECISIONS,
                    compile_bytecode: bool = True) -> subprocess.CompletedProcess[str]:
    """nix/python-closure.nix's installPhase: closure.py with `installer` on PYTHONPATH."""
    env = {**os.environ, "PYTHONPATH": str(installer_wheel())}
    argv = [sys.executable, str(BUILD / "closure.py"), "install", "--prefix", str(prefix),
            "--decisions", str(decisions_file), "--jobs", str(os.cpu_count() or 1)]
    if not compile_bytecode:
        argv.append("--no-compile")
    return run([*argv, *map(str, wheels)], env=env)


def resolve(root: Path, derivation: str, libs: Sequence[Path] = (),
            decisions_file: Path = DECISIONS) -> subprocess.CompletedProcess[str]:
    """What auto-patchelf decides over ``root`` with the derivation's decisions."""
    argv = [sys.executable, str(BUILD / "deps.py"), "check", "--root", str(root),
            "--decisions", str(decisions_file), "--derivation", derivation]
    for lib in libs:
        argv += ["--lib", str(lib)]
    return run(argv)


def site_packages(prefix: Path) -> Path:
    return prefix / "lib" / f"python{PYTHON}" / "site-packages"



@dataclass
class Replayed:
    work: Path
    closure: Path  # the venv prefix python-closure.nix's installPhase creates
    closure_log: str
    test_tools: Path  # checks.python-tests' testTools (the `test` wheel set)
    vllm_site: Path
    vllm_log: str
    wrapper: Path  # nix/qwen3090.nix's $out
    tools: Path  # stands for stdenv.cc/bin + which/bin
    coreutils: Path


def _host_tool_dir(target: Path, names: list[str]) -> Path:
    """A directory holding only ``names`` (links to this host's programs): what a Nix package's
    bin directory would give the wrapper, and nothing else."""
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        found = shutil.which(name)
        if found is None:
            pytest.fail(f"the replay needs `{name}` on this machine (Debian: build-essential)")
        (target / name).symlink_to(found)
    return target


def replayed_session() -> Iterator[Replayed]:
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        pytest.skip("the closure is x86_64 Linux wheels")
    work = cache_dir() / "nix-replay-work"
    keep = bool(os.environ.get("QWEN3090_KEEP_REPLAY"))
    done = work / "replayed.json"
    if keep and done.is_file():
        # A development aid: QWEN3090_KEEP_REPLAY=1 keeps the work directory and reuses it.
        saved: dict[str, str] = json.loads(done.read_text())
        yield Replayed(
            work=Path(saved["work"]), closure=Path(saved["closure"]),
            closure_log=saved["closure_log"], test_tools=Path(saved["test_tools"]),
            vllm_site=Path(saved["vllm_site"]), vllm_log=saved["vllm_log"],
            wrapper=Path(saved["wrapper"]), tools=Path(saved["tools"]),
            coreutils=Path(saved["coreutils"]),
        )
        return
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        runtime = [e for e in wheel_set("runtime") if e["name"] != "vllm"]
        (vllm_entry,) = [e for e in wheel_set("runtime") if e["name"] == "vllm"]
        print(f"[nix-replay] {len(runtime) + 1} runtime wheels for Python {PYTHON}")
        wheels = fetch(runtime)
        (vllm_wheel,) = fetch([vllm_entry])
        test_wheels = fetch(wheel_set("test"))

        closure = work / "closure"
        print("[nix-replay] installing the closure (nix/build/closure.py)", flush=True)
        closure_proc = install_closure(closure, wheels)
        closure_log = closure_proc.stdout + closure_proc.stderr
        test_tools = work / "test-tools"
        proc = install_closure(test_tools, test_wheels, compile_bytecode=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr

        vllm_site = work / "vllm" / "lib" / f"python{PYTHON}" / "site-packages"
        print("[nix-replay] installing the patched vLLM (nix/build/patched_vllm.py)", flush=True)
        vllm_proc = run([
            str(closure / "bin" / "python"), str(BUILD / "patched_vllm.py"), "install",
            "--wheel", str(vllm_wheel), "--site", str(vllm_site),
            "--series-src", str(REPO), "--jobs", str(os.cpu_count() or 1),
        ])
        tools = _host_tool_dir(work / "tools", ["cc", "c++", "gcc", "g++", "as", "ld", "which"])
        coreutils = _host_tool_dir(work / "coreutils", ["mkdir", "ln"])
        wrapper = work / "qwen3090"
        site = site_packages(closure)
        proc = run([
            str(closure / "bin" / "python"), str(BUILD / "wrapper.py"), "install",
            "--out", str(wrapper), "--src", str(REPO),
            "--python", str(closure / "bin" / "python"),
            "--site-rel", f"lib/python{PYTHON}/site-packages",
            "--vllm-site", str(vllm_site),
            "--manifest", str(vllm_site / "vllm" / "_qwen3090" / "manifest.json"),
            "--shell", "/bin/bash", "--coreutils", str(coreutils),
            "--cc", str(tools / "cc"), "--cxx", str(tools / "c++"),
            "--cuda-home", str(site / "nvidia" / "cu13"), "--tool-path", str(tools),
        ])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        result = Replayed(work, closure, closure_log, test_tools, vllm_site,
                          vllm_proc.stdout + vllm_proc.stderr, wrapper, tools, coreutils)
        if keep:
            done.write_text(json.dumps({k: str(v) for k, v in vars(result).items()}))
        yield result
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
