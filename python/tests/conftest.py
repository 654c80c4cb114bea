"""Fixtures every tier shares: a generated demo model, one real vLLM CPU server, and a tiny
generated Qwen3 checkpoint for the model-directory checks (unit and e2e_cpu).

``cpu_server`` is started the way a user starts the CPU tier: ``qwen3090 serve --device cpu``
with the knobs as environment variables (``MODEL``, ``PREFIX_CACHE=1``, ``PORT``) and an API
key in ``VLLM_API_KEY``. One boot per pytest session (about a minute on an idle machine);
every test area reuses it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from qwen3090.localserver import RunningServer, reserve_port, start_server
from tests.support.tinymodel import write_tiny_qwen3

# The real vLLM 0.28.0 trees (pristine and patched) every patch-tier test compares.
pytest_plugins = ["tests.support.vllm_trees"]

# The spine's port range is 18100-18199; the shared server takes the first free of these
# (reserved with a lock file, so concurrent pytest sessions never share one).
CPU_SERVER_PORTS = range(18110, 18120)
CPU_SERVER_BOOT_TIMEOUT_S = float(os.environ.get("QWEN3090_TEST_BOOT_TIMEOUT", "900"))
SERVED_MODEL_NAME = "qwen3.8-27b"


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated tiny model (the default demo architecture), once per session."""
    from qwen3090.demo_model import write_demo_model

    path = tmp_path_factory.mktemp("demo") / "model"
    write_demo_model(path)
    return path


def serve_env(model_dir: Path, port: int, api_key: str) -> dict[str, str]:
    """The environment of the shared server: inherited, plus the knobs as env variables."""
    from qwen3090.knobs import NAMES

    # A developer's shell must not change what the tests serve.
    env = {k: v for k, v in os.environ.items() if k not in NAMES}
    env.update(
        {
            "MODEL": str(model_dir),
            "PREFIX_CACHE": "1",
            "PORT": str(port),
            "VLLM_API_KEY": api_key,
            # The pool is pinned by the CPU rule set; this keeps it at 1 GiB even if a
            # developer's shell sets something larger.
            "VLLM_CPU_KVCACHE_SPACE": "1",
        }
    )
    return env


@pytest.fixture(scope="session")
def cpu_server(
    demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """One real vLLM CPU server on the demo model, started through ``qwen3090 serve``."""
    lease = reserve_port(CPU_SERVER_PORTS)
    port = lease.port
    api_key = "test-" + secrets.token_hex(8)
    log_path = tmp_path_factory.mktemp("cpu-server") / "server.log"
    argv = [sys.executable, "-m", "qwen3090", "serve", "--device", "cpu", "--no-gate"]
    server = start_server(argv, serve_env(demo_model_dir, port, api_key), port, log_path)
    try:
        boot = server.wait_healthy(CPU_SERVER_BOOT_TIMEOUT_S)
        # /health is unauthenticated: make sure the server answering is this one.
        assert server.process.poll() is None, f"the server exited; see {log_path}"
        req = urllib.request.Request(
            f"{server.base_url}/v1/models", headers={"Authorization": f"Bearer {api_key}"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            served = [m["id"] for m in json.load(resp)["data"]]
        assert served == [SERVED_MODEL_NAME], served
        yield RunningServer(
            base_url=server.base_url,
            api_key=api_key,
            model=SERVED_MODEL_NAME,
            model_dir=demo_model_dir,
            log_path=log_path,
            server=server,
            boot_seconds=boot,
        )
    finally:
        server.stop()
        lease.release()


@pytest.fixture(scope="session")
def tiny_model_master(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete three-shard Qwen3 dir; never modified (tests copy it)."""
    return write_tiny_qwen3(tmp_path_factory.mktemp("tiny-master") / "Qwen3-tiny")


@pytest.fixture
def tiny_model(tiny_model_master: Path, tmp_path: Path) -> Path:
    """A fresh copy of the generated model dir, for a test to damage."""
    dest = tmp_path / "models" / "Qwen3-tiny"
    shutil.copytree(tiny_model_master, dest)
    return dest
