"""What the checks prevent, shown on the real vLLM 0.28.0 CPU build.

1. A dir without tokenizer.json: the check fails at once naming the dir; vLLM started on the
   same dir dies later with gotcha 32's misleading "ReasoningConfig" error (no boot: it fails
   in config validation).
2. The Run:ai streamer: the shared demo model loads through ``--load-format runai_streamer`` with
   the arguments ``qwen3090.loading`` emits, and answers a completion (the one full boot here).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from qwen3090.loading import checkpoint_size, load_format_args
from qwen3090.localserver import LocalServer, start_server
from qwen3090.modelcheck import check_model_dir

pytestmark = pytest.mark.e2e_cpu

PORT_NO_TOKENIZER = 18400
PORT_STREAMER = 18401


def _start_vllm(model: Path, port: int, extra: list[str], log: Path) -> LocalServer:
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_COLOR="0")
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
        "--reasoning-parser", "qwen3", "--max-model-len", "1024", "--max-num-seqs", "4",
        *extra,
    ]
    return start_server(argv, env, port, log)


def test_missing_tokenizer_is_caught_before_vllm_fails_on_it(
    tiny_model: Path, tmp_path: Path
) -> None:
    (tiny_model / "tokenizer.json").unlink()
    t0 = time.monotonic()
    problems = check_model_dir(tiny_model)
    check_s = time.monotonic() - t0
    assert len(problems) == 1 and problems[0].startswith(f"{tiny_model}: no tokenizer.json")

    log = tmp_path / "vllm-no-tokenizer.log"
    t0 = time.monotonic()
    server = _start_vllm(tiny_model, PORT_NO_TOKENIZER, [], log)
    try:
        rc = server.process.wait(timeout=400)
    finally:
        server.stop()
    vllm_s = time.monotonic() - t0
    text = log.read_text(errors="replace")
    assert rc != 0
    assert "ReasoningConfig: failed to tokenize reasoning strings" in text
    # What vLLM says names neither the tokenizer nor the directory (gotcha 32).
    line = next(ln for ln in text.splitlines() if "ReasoningConfig: failed" in ln)
    assert "tokenizer.json" not in line
    print(
        f"\nno tokenizer.json: qwen3090 check failed in {check_s * 1000:.0f} ms naming the dir; "
        f"vLLM exited {rc} after {vllm_s:.1f} s with: {line.split('Value error, ')[-1][:120]}"
    )


def test_demo_model_loads_through_the_runai_streamer(
    demo_model_dir: Path, tmp_path: Path
) -> None:
    total, largest = checkpoint_size(demo_model_dir)
    extra, reason = load_format_args(total, 0, True, largest_tensor_bytes=largest)
    assert reason is not None
    model_type = json.loads((demo_model_dir / "config.json").read_text())["model_type"]
    # The hybrid demo archs keep their recurrent state in float32 on CPU (demo_model's note).
    hybrid = [] if model_type == "qwen3" else ["--mamba-ssm-cache-dtype", "float32"]
    log = tmp_path / "vllm-runai.log"
    with _start_vllm(demo_model_dir, PORT_STREAMER, [*extra, *hybrid], log) as server:
        healthy = server.wait_healthy(540)
        body = json.dumps(
            {"model": str(demo_model_dir), "prompt": "hello world", "max_tokens": 4,
             "temperature": 0}
        ).encode()
        req = urllib.request.Request(
            f"{server.base_url}/v1/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            answer = json.load(r)
    text = log.read_text(errors="replace")
    assert "Loading safetensors using Runai Model Streamer" in text
    assert "'load_format': 'runai_streamer'" in text
    assert answer["choices"][0]["finish_reason"] == "length"
    print(
        f"\nrunai_streamer ({model_type} demo model, {total} bytes): /health after "
        f"{healthy:.1f} s; args {' '.join(extra)}"
    )
