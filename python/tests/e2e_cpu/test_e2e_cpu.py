"""End to end on the CPU tier: ``qwen3090 serve --device cpu`` with the knobs as environment
variables (PREFIX_CACHE=1, MODEL, PORT, VLLM_API_KEY), a generated demo model, real vLLM 0.28.0.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from typing import Any

import pytest

from qwen3090.localserver import RunningServer

pytestmark = pytest.mark.e2e_cpu


def _request(
    server: RunningServer, path: str, body: dict[str, Any] | None = None, *, key: str | None = None
) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(server.base_url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            raw = resp.read().decode()
            return int(resp.status), json.loads(raw) if raw.startswith(("{", "[")) else raw
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode(errors="replace")


def _metric(text: str, name: str) -> float:
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    ]
    assert values, f"{name} not on /metrics"
    return sum(values)


def test_health_answers_200(cpu_server: RunningServer) -> None:
    status, _ = _request(cpu_server, "/health")
    assert status == 200


def test_chat_completion_answers(cpu_server: RunningServer) -> None:
    status, body = _request(
        cpu_server,
        "/v1/chat/completions",
        {"model": cpu_server.model, "messages": [{"role": "user", "content": "hello"}],
         "max_tokens": 8, "temperature": 0},
        key=cpu_server.api_key,
    )
    assert status == 200, body
    assert body["model"] == "qwen3.8-27b"
    assert body["usage"]["completion_tokens"] > 0
    message = body["choices"][0]["message"]
    # The qwen3 reasoning parser splits <think> output; either field carries the text.
    assert (message.get("content") or "") + (message.get("reasoning") or "") != ""


def test_api_key_is_enforced(cpu_server: RunningServer) -> None:
    body = {"model": cpu_server.model, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1}
    status_without, _ = _request(cpu_server, "/v1/chat/completions", body)
    status_wrong, _ = _request(cpu_server, "/v1/chat/completions", body, key="not-the-key")
    status_with, _ = _request(cpu_server, "/v1/chat/completions", body, key=cpu_server.api_key)
    assert status_without == 401
    assert status_wrong == 401
    assert status_with == 200


def test_served_with_the_plan_the_resolver_made(cpu_server: RunningServer) -> None:
    log = cpu_server.log_path.read_text(errors="replace")
    exec_line = next(line for line in log.splitlines() if line.startswith("qwen3090: exec "))
    assert "--enable-prefix-caching" in exec_line
    assert "--mamba-cache-mode align" in exec_line
    assert "--mamba-ssm-cache-dtype float32" in exec_line
    assert re.search(r"--served-model-name qwen3\.8-27b\b", exec_line)


def test_repeated_long_prompt_hits_the_prefix_cache(cpu_server: RunningServer) -> None:
    _, before_text = _request(cpu_server, "/metrics")
    hits_before = _metric(str(before_text), "vllm:prefix_cache_hits_total")
    prompt = " ".join(f"line {i}: the river passes the garden bridge." for i in range(200))
    body = {"model": cpu_server.model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 2}
    status1, first = _request(cpu_server, "/v1/chat/completions", body, key=cpu_server.api_key)
    status2, second = _request(cpu_server, "/v1/chat/completions", body, key=cpu_server.api_key)
    assert status1 == 200 and status2 == 200
    assert first["usage"]["prompt_tokens"] > 512  # several 128-token blocks
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    assert cached <= second["usage"]["prompt_tokens"]
    _, after_text = _request(cpu_server, "/metrics")
    assert _metric(str(after_text), "vllm:prefix_cache_hits_total") >= hits_before + cached
