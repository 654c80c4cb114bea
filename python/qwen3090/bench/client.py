"""A small stdlib HTTP client for OpenAI-compatible servers (vLLM's extensions included)."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from qwen3090.errors import Qwen3090Error

JSON = dict[str, Any]


@dataclass
class StreamResult:
    """One streamed chat completion, timed on this side of the wire."""

    text: str
    reasoning: str
    finish_reason: str | None
    usage: JSON
    ttft_s: float | None  # first token of content or reasoning
    wall_s: float


@dataclass
class Client:
    server: str  # http://host:port, with or without a trailing /v1
    model: str
    api_key: str | None = None
    timeout_s: float = 600.0
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def root(self) -> str:
        url = self.server.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url

    def _request(self, method: str, path: str, body: Mapping[str, Any] | None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **self.headers}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return urllib.request.Request(self.root + path, data=data, method=method, headers=headers)

    def _open(self, req: urllib.request.Request) -> Any:
        try:
            return urllib.request.urlopen(req, timeout=self.timeout_s)
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:500]
            raise Qwen3090Error(
                f"{req.get_method()} {req.full_url} answered {err.code}: {detail}",
                fix="check --server, --api-key and --model",
            ) from err
        except urllib.error.URLError as err:
            raise Qwen3090Error(
                f"cannot reach {req.full_url}: {err.reason}",
                fix="is the server up? check --server",
            ) from err

    def post(self, path: str, body: Mapping[str, Any]) -> JSON:
        with self._open(self._request("POST", path, body)) as resp:
            out: JSON = json.loads(resp.read())
            return out

    def get_text(self, path: str) -> str:
        with self._open(self._request("GET", path, None)) as resp:
            text: str = resp.read().decode()
            return text

    def metrics(self) -> str | None:
        """The Prometheus exposition text, or None when the server has no /metrics."""
        try:
            return self.get_text("/metrics")
        except Qwen3090Error:
            return None

    def count_chat_tokens(
        self, messages: list[JSON], chat_template_kwargs: Mapping[str, Any] | None = None
    ) -> int:
        """The prompt length the engine will see: the chat-templated token count."""
        body: JSON = {
            "model": self.model,
            "messages": messages,
            "add_generation_prompt": True,
        }
        if chat_template_kwargs:
            body["chat_template_kwargs"] = dict(chat_template_kwargs)
        return int(self.post("/tokenize", body)["count"])

    def chat(self, messages: list[JSON], **params: Any) -> JSON:
        return self.post(
            "/v1/chat/completions", {"model": self.model, "messages": messages, **params}
        )

    def completion(self, prompt: str, **params: Any) -> JSON:
        return self.post("/v1/completions", {"model": self.model, "prompt": prompt, **params})

    def _sse(self, path: str, body: JSON) -> Iterator[JSON]:
        with self._open(self._request("POST", path, body)) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    return
                yield json.loads(payload)

    def chat_stream(self, messages: list[JSON], **params: Any) -> StreamResult:
        body: JSON = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            **params,
        }
        text: list[str] = []
        reasoning: list[str] = []
        usage: JSON = {}
        finish: str | None = None
        ttft: float | None = None
        start = time.perf_counter()
        for event in self._sse("/v1/chat/completions", body):
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                piece = delta.get("content") or ""
                thought = delta.get("reasoning_content") or delta.get("reasoning") or ""
                if (piece or thought) and ttft is None:
                    ttft = time.perf_counter() - start
                text.append(piece)
                reasoning.append(thought)
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
        wall = time.perf_counter() - start
        return StreamResult("".join(text), "".join(reasoning), finish, usage, ttft, wall)


def cached_tokens(usage: Mapping[str, Any]) -> int | None:
    """Prompt tokens served from the prefix cache (needs --enable-prompt-tokens-details)."""
    details = usage.get("prompt_tokens_details") or {}
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return int(value) if isinstance(value, int) else None


def cache_config_info(metrics_text: str | None) -> dict[str, str]:
    """The labels of vLLM's ``vllm:cache_config_info`` gauge (block size, dtype, ...)."""
    info: dict[str, str] = {}
    for line in (metrics_text or "").splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = line[line.index("{") + 1 : line.rindex("}")]
            for m in re.finditer(r'(\w+)="([^"]*)"', labels):
                info[m.group(1)] = m.group(2)
    return info
