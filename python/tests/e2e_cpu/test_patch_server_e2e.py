"""End to end on the CPU tier, through the shared ``cpu_server`` (the patched tree, served
with an API key): api-key-scope and xgrammar-spec-terminated seen from a client."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Protocol

import pytest

pytestmark = pytest.mark.e2e_cpu

# Paths a Prometheus scraper or an orchestrator probes; everything else needs the key.
OPEN_PATHS = ("/health", "/ping", "/version", "/metrics")
# Stock 0.28.0 answered all of these without a key (it guards only /v1, /v2, /inference and
# /cohere); /v1/models is the control that was always guarded.
GUARDED = (
    ("POST", "/tokenize"),
    ("GET", "/docs"),
    ("GET", "/openapi.json"),
    ("GET", "/load"),
    ("GET", "/v1/models"),
)


class Server(Protocol):
    base_url: str
    api_key: str
    model: str


def _request(server: Server, method: str, path: str, body: dict[str, Any] | None = None,
             key: str | None = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.base_url.rstrip("/") + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=180) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _body(server: Server, method: str, path: str) -> dict[str, Any] | None:
    if method == "POST" and path == "/tokenize":
        return {"model": server.model, "prompt": "hello"}
    return None


@pytest.mark.parametrize("path", OPEN_PATHS)
def test_probe_paths_stay_open(cpu_server: Server, path: str) -> None:
    status, _ = _request(cpu_server, "GET", path)
    assert status == 200, path


@pytest.mark.parametrize(("method", "path"), GUARDED)
def test_everything_else_needs_the_key(cpu_server: Server, method: str, path: str) -> None:
    body = _body(cpu_server, method, path)
    assert _request(cpu_server, method, path, body)[0] == 401
    assert _request(cpu_server, method, path, body, key="not-the-key")[0] == 401
    assert _request(cpu_server, method, path, body, key=cpu_server.api_key)[0] == 200


def test_json_schema_with_ignore_eos_completes(cpu_server: Server) -> None:
    """The grammar terminates after ``"ok"`` and the stop token; ``ignore_eos`` keeps the
    request going, so the grammar sees tokens after termination. Stock 0.28.0 rejects them
    and fails the request (HTTP 500, "grammar rejected tokens" in the log)."""
    body = {
        "model": cpu_server.model,
        "messages": [{"role": "user", "content": "Answer in JSON."}],
        "max_tokens": 16,
        "temperature": 0,
        "ignore_eos": True,
        # The prompt then closes the think block, so the grammar applies from the first
        # token whether or not the server runs a reasoning parser.
        "chat_template_kwargs": {"enable_thinking": False},
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "answer", "schema": {"enum": ["ok"]}}},
    }
    status, text = _request(cpu_server, "POST", "/v1/chat/completions", body,
                            key=cpu_server.api_key)
    assert status == 200, text
    choice = json.loads(text)["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"].startswith('"ok"')
