"""End to end on the CPU tier with the deployment's own architecture family: one real boot of a
``qwen3090 demo-model --arch qwen3_5`` model through ``qwen3090 serve --device cpu``, on the
patched vLLM tree (stock 0.28.0 cannot load Qwen3.5 without torchvision; see
test_text_only_imports.py). Hybrid Gated DeltaNet + attention, so PREFIX_CACHE=1 runs the
mamba-align prefix cache the real deployment depends on.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from qwen3090.knobs import NAMES
from qwen3090.localserver import LocalServer, reserve_port, start_server
from tests.support import patchtrees

pytestmark = pytest.mark.e2e_cpu

PORTS = range(18700, 18710)
BOOT_TIMEOUT_S = 900.0
SERVED = "qwen3.8-27b"
# A prompt of ~2750 tokens with this demo tokenizer: more than three attention blocks at the
# block size the hybrid page-size alignment picks (640 here). Align mode restores the recurrent
# state only from a snapshot at a block boundary, and some lengths land where none is usable
# (gotcha 44); this one is measured to hit 2560 tokens on the second request.
LONG_PROMPT = " ".join(f"line {i}: the river passes the garden bridge." for i in range(200))


@dataclass(frozen=True)
class Qwen35Server:
    base_url: str
    api_key: str
    log_path: Path
    server: LocalServer


def _knob_free_env(tree: Path, extra: dict[str, str]) -> dict[str, str]:
    env = patchtrees.tree_env(tree, extra)
    for name in NAMES:  # a developer's shell must not change what this test serves
        if name not in extra:
            env.pop(name, None)
    return env


@pytest.fixture(scope="module")
def qwen35_server(
    patched_cpu_tree: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Qwen35Server]:
    root = tmp_path_factory.mktemp("qwen35")
    model = root / "model"
    made = subprocess.run(
        [sys.executable, "-m", "qwen3090", "demo-model", str(model), "--arch", "qwen3_5"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert made.returncode == 0, made.stderr
    assert json.loads((model / "config.json").read_text())["architectures"] == [
        "Qwen3_5ForCausalLM"
    ]
    lease = reserve_port(PORTS)
    api_key = "test-" + secrets.token_hex(8)
    log_path = root / "server.log"
    env = _knob_free_env(patched_cpu_tree, {
        "MODEL": str(model),
        "PREFIX_CACHE": "1",
        "PORT": str(lease.port),
        "VLLM_API_KEY": api_key,
        "VLLM_CPU_KVCACHE_SPACE": "1",
    })
    argv = [sys.executable, "-m", "qwen3090", "serve", "--device", "cpu", "--no-gate"]
    server = start_server(argv, env, lease.port, log_path)
    try:
        boot = server.wait_healthy(BOOT_TIMEOUT_S)
        assert server.process.poll() is None, f"the server exited; see {log_path}"
        print(f"qwen3_5 demo model: /health 200 after {boot:.1f} s")
        yield Qwen35Server(server.base_url, api_key, log_path, server)
    finally:
        server.stop()
        lease.release()


def _chat(server: Qwen35Server, content: str, max_tokens: int) -> dict[str, Any]:
    body = {"model": SERVED, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0}
    req = urllib.request.Request(
        server.base_url + "/v1/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": f"Bearer {server.api_key}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            out: dict[str, Any] = json.load(resp)
            return out
    except urllib.error.HTTPError as err:
        raise AssertionError(f"HTTP {err.code}: {err.read().decode(errors='replace')}") from err


def test_serves_qwen3_5_with_the_cpu_rules(qwen35_server: Qwen35Server) -> None:
    log = qwen35_server.log_path.read_text(errors="replace")
    exec_line = next(line for line in log.splitlines() if line.startswith("qwen3090: exec "))
    # The CPU GDN kernel needs a 32-bit recurrent state; the vision tower stays off.
    assert "--mamba-ssm-cache-dtype float32" in exec_line
    assert "--language-model-only" in exec_line
    assert "--mamba-cache-mode align" in exec_line
    assert "image_processing_qwen2_vl" not in log  # no traceback through the image processor


def test_chat_completion_answers(qwen35_server: Qwen35Server) -> None:
    body = _chat(qwen35_server, "hello", 8)
    assert body["model"] == SERVED
    assert body["usage"]["completion_tokens"] > 0
    message = body["choices"][0]["message"]
    assert (message.get("content") or "") + (message.get("reasoning") or "") != ""


def test_repeated_long_prompt_hits_the_mamba_align_prefix_cache(
    qwen35_server: Qwen35Server,
) -> None:
    first = _chat(qwen35_server, LONG_PROMPT, 2)
    second = _chat(qwen35_server, LONG_PROMPT, 2)
    prompt_tokens = second["usage"]["prompt_tokens"]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    log = qwen35_server.log_path.read_text(errors="replace")
    sizes = re.findall(r"Setting attention block size to (\d+) tokens", log)
    assert sizes, "vLLM did not log the hybrid block size (the model is not hybrid?)"
    block = int(sizes[-1])
    assert first["usage"]["prompt_tokens"] == prompt_tokens > 3 * block
    # Hits come in whole blocks, and more than three of them.
    assert cached % block == 0 and 3 * block < cached <= prompt_tokens, (cached, block)
