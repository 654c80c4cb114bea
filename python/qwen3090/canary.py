"""One real chat request against a vLLM server, measured the way seeds/004 measures decode.

``/health`` only says the API process is alive: an engine that died of OOM mid-request
(gotchas 16, 34, 35) or hangs leaves it answering 200 while every request fails. The canary
therefore sends a small streamed chat completion and reports:

- TTFT: from sending the request to the first chunk that carries generated text;
- wall: from sending the request to the end of the stream;
- decode tok/s = ``usage.completion_tokens / (wall - ttft)``, with the token count from the
  server's own ``usage`` (requested with ``stream_options.include_usage``). Counting SSE
  chunks is wrong: with speculative decoding one chunk carries several tokens, and a chunk
  may carry none (seeds/004).

Only the standard library is used, so the exporter runs without vLLM or an HTTP client package.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

DEFAULT_PROMPT = "Reply with one short sentence about the weather."


@dataclass(frozen=True)
class CanaryResult:
    """The outcome of one canary request. ``reason`` is one of metricnames.FAILURE_REASONS."""

    ok: bool
    reason: str | None = None
    detail: str = ""
    ttft_s: float | None = None
    wall_s: float | None = None
    completion_tokens: int | None = None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """completion_tokens / (wall - ttft); None when the server gave no usage or the
        generation window is empty (a one-chunk answer)."""
        if self.completion_tokens is None or self.ttft_s is None or self.wall_s is None:
            return None
        window = self.wall_s - self.ttft_s
        if window <= 0:
            return None
        return self.completion_tokens / window


@dataclass(frozen=True)
class HealthResult:
    """``reachable``: the API process answered HTTP at all; ``healthy``: /health said 200."""

    reachable: bool
    healthy: bool
    status: int | None = None


class _Endpoint:
    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port
        self.prefix = parts.path.rstrip("/")

    def connect(self, timeout_s: float) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout_s)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def check_health(base_url: str, timeout_s: float = 5.0) -> HealthResult:
    """GET /health (never guarded by the API key in vLLM 0.28.0)."""
    ep = _Endpoint(base_url)
    conn = ep.connect(timeout_s)
    try:
        conn.request("GET", f"{ep.prefix}/health")
        resp = conn.getresponse()
        resp.read()
        return HealthResult(reachable=True, healthy=resp.status == 200, status=resp.status)
    except (OSError, http.client.HTTPException):
        return HealthResult(reachable=False, healthy=False)
    finally:
        conn.close()


def discover_model(base_url: str, api_key: str | None, timeout_s: float = 5.0) -> str | None:
    """The first served model name from /v1/models, or None when it cannot be read."""
    ep = _Endpoint(base_url)
    conn = ep.connect(timeout_s)
    try:
        conn.request("GET", f"{ep.prefix}/v1/models", headers=_headers(api_key))
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            return None
        data = json.loads(body)
        models = data.get("data") if isinstance(data, dict) else None
        if isinstance(models, list) and models and isinstance(models[0], dict):
            name = models[0].get("id")
            return name if isinstance(name, str) else None
        return None
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        conn.close()


def _has_text(chunk: dict[str, Any]) -> bool:
    """True when a stream chunk carries generated text (content or reasoning) or ends a choice.

    vLLM's first chunk carries only the role with an empty content, so it does not count.
    """
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            for key in ("content", "reasoning_content", "reasoning"):
                value = delta.get(key)
                if isinstance(value, str) and value:
                    return True
        if choice.get("finish_reason"):
            return True
    return False


def probe_chat(
    base_url: str,
    *,
    model: str,
    api_key: str | None = None,
    prompt: str = DEFAULT_PROMPT,
    max_tokens: int = 16,
    timeout_s: float = 30.0,
) -> CanaryResult:
    """Send one streamed chat completion and measure it; never raises for server failures."""
    ep = _Endpoint(base_url)
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            # A fixed number of generated tokens makes successive decode rates comparable.
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    headers = _headers(api_key)
    headers["Accept"] = "text/event-stream"
    deadline_start = time.monotonic()
    conn = ep.connect(timeout_s)
    ttft: float | None = None
    usage_tokens: int | None = None
    done = False
    try:
        start = time.perf_counter()
        conn.request("POST", f"{ep.prefix}/v1/chat/completions", body=body, headers=headers)
        resp = conn.getresponse()
        if resp.status in (401, 403):
            resp.read()
            return CanaryResult(False, "unauthorized", f"HTTP {resp.status}")
        if resp.status != 200:
            text = resp.read(500).decode("utf-8", errors="replace")
            return CanaryResult(False, "http_error", f"HTTP {resp.status}: {text}")
        while True:
            if time.monotonic() - deadline_start > timeout_s:
                return CanaryResult(False, "timeout", f"stream not finished in {timeout_s} s")
            raw = resp.readline()
            if not raw:
                break
            line = raw.decode("utf-8", errors="replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[len("data:") :].strip()
            if payload == "[DONE]":
                done = True
                break
            try:
                chunk = json.loads(payload)
            except ValueError:
                return CanaryResult(False, "protocol", f"undecodable chunk: {payload[:200]}")
            if not isinstance(chunk, dict):
                return CanaryResult(False, "protocol", f"unexpected chunk: {payload[:200]}")
            if "error" in chunk:
                return CanaryResult(False, "stream_error", json.dumps(chunk["error"])[:300])
            if ttft is None and _has_text(chunk):
                ttft = time.perf_counter() - start
            usage = chunk.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                usage_tokens = usage["completion_tokens"]
        wall = time.perf_counter() - start
    except TimeoutError:
        return CanaryResult(False, "timeout", f"no answer within {timeout_s} s")
    except (OSError, http.client.HTTPException) as err:
        return CanaryResult(False, "connection", f"{type(err).__name__}: {err}")
    finally:
        conn.close()
    if not done:
        return CanaryResult(False, "protocol", "stream ended without [DONE]")
    if ttft is None:
        return CanaryResult(False, "protocol", "no generated text in the stream")
    return CanaryResult(True, ttft_s=ttft, wall_s=wall, completion_tokens=usage_tokens, detail="ok")
