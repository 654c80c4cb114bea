"""Run a selection of vLLM 0.28.0's own tests (from the pinned sdist) against one vLLM tree.

The sdist's ``tests/`` and ``pyproject.toml`` (its pytest settings and markers) are unpacked
into a work directory of their own: run from the sdist root, its ``vllm/`` would shadow the
tree under test. Each side runs in a fresh pytest process whose ``PYTHONPATH`` puts the tree
first and the work directory next (vLLM's tests import ``tests.utils`` and friends).

Offline: ``ModelConfig()`` defaults to a Hub model, and without ``HF_HUB_OFFLINE`` the Hub
client retries a connection that cannot succeed with growing sleeps, so one such test stalls
for minutes; offline it fails at once (on both trees). ``--timeout`` (pytest-timeout) bounds
every test anyway, and each side has a wall-clock limit.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tarfile
from collections.abc import Collection, Sequence
from pathlib import Path

from tests.support.upstream.upstream_compare import SideOutcomes

HERE = Path(__file__).resolve().parent
PLUGIN = "upstream_outcomes"
# Loaded first: it decides which CPU kernels vLLM loads (upstream_cpu_kernels.py says why).
KERNELS_PLUGIN = "upstream_cpu_kernels"
TEST_TIMEOUT_S = 60
FAIL_CAP = 3
# Per side (pristine, patched); the selection grew with the series (kvarn-backend: ~115 files,
# whose pristine side took ~20 min on a 2-core CI machine, and 26 min on a 2-core machine with
# AVX2 only, its kernels _C_AVX2), so the bound has room over it.
SIDE_TIMEOUT_S = 2700


def unpack_tests(sdist: Path, dest: Path) -> Path:
    """Extract ``<sdist>/tests/`` and ``pyproject.toml`` into ``dest``; returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist, "r:gz") as tf:
        chosen = []
        for info in tf.getmembers():
            parts = info.name.split("/")
            wanted = (len(parts) >= 3 and parts[1] == "tests") or parts[1:] == ["pyproject.toml"]
            if len(parts) >= 2 and wanted and (info.isfile() or info.isdir()):
                info.name = "/".join(parts[1:])
                chosen.append(info)
        tf.extractall(dest, members=chosen, filter="data")
    if not (dest / "tests" / "conftest.py").is_file():
        raise FileNotFoundError(f"{sdist} holds no tests/conftest.py: is the vllm-sdist pin an "
                                "sdist of vLLM with its test suite?")
    return dest


def side_env(tree: Path, workdir: Path, outcomes: Path, cache: Path) -> dict[str, str]:
    """The environment of one side: offline, CPU, caches of its own, no pytest leftovers."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "VLLM_", "HF_", "TRANSFORMERS_"))}
    env.update({
        "PYTHONPATH": os.pathsep.join([str(tree), str(workdir), str(HERE)]),
        "VLLM_TARGET_DEVICE": "cpu",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        # Some parametrizations iterate over sets (tests/models/test_initialization.py): with
        # a random hash seed each xdist worker collects another order and xdist refuses.
        "PYTHONHASHSEED": "0",
        # A side must not load what the other side compiled (aot-cache-load patches loading).
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "UPSTREAM_OUTCOMES": str(outcomes),
        "UPSTREAM_FAIL_CAP": str(FAIL_CAP),
    })
    return env


def run_side(name: str, tree: Path, workdir: Path, files: Sequence[str],
             only: Collection[str] | None = None, workers: int = 2) -> tuple[SideOutcomes, str]:
    """Run ``files`` (paths relative to ``workdir``) against ``tree``, or of them only the test
    ids ``only``: the outcomes and the log."""
    outcomes = workdir.parent / f"{name}-outcomes.json"
    log = workdir.parent / f"{name}.log"
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", KERNELS_PLUGIN,
            "-p", PLUGIN, "-q",
            "--timeout", str(TEST_TIMEOUT_S), "--continue-on-collection-errors", "-rfE"]
    if workers > 1:
        argv += ["-n", str(workers)]
    argv += list(files)
    env = side_env(tree, workdir, outcomes, workdir.parent / f"{name}-cache")
    if only is not None:
        only_file = workdir.parent / f"{name}-only.json"
        only_file.write_text(json.dumps(sorted(only)), encoding="utf-8")
        env["UPSTREAM_ONLY"] = str(only_file)
    with log.open("w", encoding="utf-8") as out:
        # A session of its own, so a side past its limit is ended with its xdist workers and
        # whatever servers its tests started.
        proc = subprocess.Popen(argv, cwd=workdir, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = proc.wait(timeout=SIDE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            returncode = None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # leftovers: servers a test did not stop
    text = log.read_text(encoding="utf-8", errors="replace")
    # 0: all passed, 1: some failed; anything else (interrupted, internal or usage error, no
    # test collected) means the side did not run as meant.
    if returncode not in (0, 1) or not outcomes.is_file():
        status = f"ran past {SIDE_TIMEOUT_S} s" if returncode is None else f"exited {returncode}"
        raise RuntimeError(f"the {name} run of vLLM's tests {status}; the end of {log}:\n"
                           f"{text[-4000:]}")
    return SideOutcomes.load(outcomes), text
