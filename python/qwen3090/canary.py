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
import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from qwen3090.metricnames import VLLM_CACHE_CONFIG_INFO

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


# --- the prefix-cache canary (gotcha 44) --------------------------------------------------------

# Filler of the shared prefix: plain sentences tokenize at a steady rate, so the number of
# sentences for a target token count can be scaled from what the server counted last time.
_FILLER = (
    "Line {i} of the reference passage: the canary repeats this passage word for word, so "
    "a working prefix cache serves it from memory the second time."
)
FILLER_TOKENS_GUESS = 32
"""Tokens per filler sentence before the server has counted one (Qwen tokenizers: ~30)."""


@dataclass(frozen=True)
class PrefixProbe:
    """Two chat requests of one conversation: the second repeats the whole first prompt (the
    shared prefix) and adds the first answer and a new question. ``shared_tokens`` is the
    first request's prompt_tokens; ``cached_tokens`` is the second's
    ``usage.prompt_tokens_details.cached_tokens``, None when the server does not report it
    (vLLM without ``--enable-prompt-tokens-details``)."""

    ok: bool
    detail: str = ""
    shared_tokens: int | None = None
    cached_tokens: int | None = None
    prompt_tokens_both: int = 0
    """Prompt tokens of both requests: what the probe added to vLLM's prefix-cache queries."""
    cached_tokens_both: int = 0
    """Cached tokens of both requests: what the probe added to vLLM's prefix-cache hits."""


def judge_prefix(probe: PrefixProbe, block_size: int | None) -> str:
    """One of metricnames.PREFIX_RESULTS for a probe.

    A miss is a second request that shared at least two cache blocks with the first and was
    served none of them from the cache. Two, because the block holding the prompt's last
    token is recomputed whatever the cache holds (and a speculator's margin can cost one
    more on hybrid models), so below two blocks a 0 can be correct.
    """
    if not probe.ok:
        return "failed"
    if probe.shared_tokens is None or probe.cached_tokens is None or not block_size:
        return "blind"
    if probe.shared_tokens < 2 * block_size:
        return "short"
    return "hit" if probe.cached_tokens > 0 else "miss"


def prefix_messages(nonce: str, sentences: int) -> list[dict[str, str]]:
    """The first request of a prefix probe: a fresh ``nonce`` first, so this probe's prefix
    was never cached before and only the probe's own first request can have cached it."""
    body = "\n".join(_FILLER.format(i=i) for i in range(sentences))
    return [
        {"role": "system", "content": f"Canary {nonce}. Answer in one short sentence."},
        {"role": "user", "content": f"{body}\n\nWhat does the passage say it is for?"},
    ]


def _post_json(
    base_url: str, path: str, body: dict[str, Any], api_key: str | None, timeout_s: float
) -> tuple[int, Any]:
    ep = _Endpoint(base_url)
    conn = ep.connect(timeout_s)
    try:
        conn.request("POST", f"{ep.prefix}{path}", body=json.dumps(body), headers=_headers(api_key))
        resp = conn.getresponse()
        raw = resp.read()
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, raw.decode("utf-8", errors="replace")[:300]
    finally:
        conn.close()


def _usage_ints(answer: Any) -> tuple[int | None, int | None, str]:
    """prompt_tokens, cached_tokens and the reply text of a chat completion."""
    if not isinstance(answer, dict):
        return None, None, ""
    usage = answer.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    prompt = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    text = ""
    choices = answer.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        if isinstance(message, dict) and isinstance(message.get("content"), str):
            text = message["content"]
    return (
        prompt if isinstance(prompt, int) else None,
        cached if isinstance(cached, int) else None,
        text,
    )


def probe_prefix(
    base_url: str,
    *,
    model: str,
    nonce: str,
    sentences: int,
    api_key: str | None = None,
    timeout_s: float = 30.0,
) -> PrefixProbe:
    """Send the two requests of a prefix probe; never raises for server failures."""
    messages = prefix_messages(nonce, sentences)
    params: dict[str, Any] = {"model": model, "max_tokens": 8, "temperature": 0}
    try:
        status, first = _post_json(
            base_url, "/v1/chat/completions", {**params, "messages": messages}, api_key, timeout_s
        )
        if status != 200:
            return PrefixProbe(False, f"first request: HTTP {status}")
        shared, first_cached, reply = _usage_ints(first)
        follow = [
            *messages,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "Say it again in other words."},
        ]
        status, second = _post_json(
            base_url, "/v1/chat/completions", {**params, "messages": follow}, api_key, timeout_s
        )
        if status != 200:
            return PrefixProbe(False, f"second request: HTTP {status}")
    except (OSError, http.client.HTTPException) as err:
        return PrefixProbe(False, f"{type(err).__name__}: {err}")
    second_prompt, cached, _ = _usage_ints(second)
    return PrefixProbe(
        True,
        "ok",
        shared,
        cached,
        prompt_tokens_both=(shared or 0) + (second_prompt or 0),
        cached_tokens_both=(first_cached or 0) + (cached or 0),
    )


def parse_block_size(metrics_text: str) -> int | None:
    """``block_size`` of vLLM's ``vllm:cache_config_info`` in a /metrics exposition."""
    for line in metrics_text.splitlines():
        if line.startswith(VLLM_CACHE_CONFIG_INFO + "{"):
            m = re.search(r'(?:^|[{,])block_size="(\d+)"', line)
            if m:
                return int(m.group(1))
    return None


def fetch_metrics(base_url: str, api_key: str | None, timeout_s: float = 5.0) -> str | None:
    """The server's /metrics exposition text, None when it cannot be read. A base URL that
    ends in /v1 (as OpenAI clients take it) means the server at its root."""
    url = base_url.rstrip("/")
    ep = _Endpoint(url[: -len("/v1")] if url.endswith("/v1") else url)
    conn = ep.connect(timeout_s)
    try:
        conn.request("GET", f"{ep.prefix}/metrics", headers=_headers(api_key))
        resp = conn.getresponse()
        text = resp.read().decode("utf-8", errors="replace")
        return text if resp.status == 200 else None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def read_block_size(base_url: str, api_key: str | None, timeout_s: float = 5.0) -> int | None:
    """The server's KV cache block size in tokens from its /metrics, None when unreadable."""
    text = fetch_metrics(base_url, api_key, timeout_s)
    return None if text is None else parse_block_size(text)
