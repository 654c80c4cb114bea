#!/usr/bin/env python3
"""Serve the demo model through ``qwen3090 serve`` on the GPU and exercise it; write a JSON record.

    python3 exercise_server.py --model DIR --out RESULT.json --log SERVER.log \
        --spec mtp --budget-s 420 [--boot-timeout-s 300]
    python3 exercise_server.py --model DIR --out RESULT.json --log SERVER.log \
        --spec dflash2 --draft DRAFTER_DIR --budget-s 420

Run by serve_on_device.sh on the lent machine (see there for the environment). The server is
started the way a user starts it: the knobs as environment variables, ``qwen3090 serve``. Each
step adds its findings to the record, which is rewritten after every step, so a run cut short
still says how far it got. Nothing here asserts: test_serve_on_device.py (SPEC=mtp) and
test_serve_dflash2.py (SPEC=dflash2) read the record.

SPEC=dflash2 runs up to three server lives with the DFlash2 drafter (dflash2_drafter.py), one
per lookup setting (DFLASH2_LIVES), each running the same greedy copy task (copy_task.py), as
long as the budget leaves room for another life; the lives it had no time for are recorded.

--ctx long (issue 21) serves SPEC=dflash2's CTX=long row instead (int8 KV on TRITON_ATTN) in
three lives (LONG_LIVES): with the split-KV verify pass, with the stock kernel, and with the
split pass's Hopper kernel turned off by the probe (the Triton pass a 3090 runs). Each runs
the copy task, then a prompt near the context limit decoded with logprobs, twice: the second
time from the prefix cache (long_verify).

--kv kvarn (issue 24) serves one life on the KVarN cache as the planner's rows give it:
``CTX=huge`` single-user (without a speculator, or with MTP), or ``--profile batch`` with
``KV=kvarn`` (64 seats, async scheduling). EXTRA_ARGS carries only what the lent machine
needs (the Triton GDN prefill): the cache dtype, block size and context come from the plan.
The MTP tier's steps run, then long greedy completions whose logprobs must stay finite
(kvarn_steps), and in batch a burst of concurrent requests (seat_burst).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import secrets
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    from tests.gpu import copy_task
except ImportError:  # the bundle: copy_task.py beside this script, whose dir is on the path
    import copy_task  # type: ignore[import-not-found,no-redef]

SERVED = "qwen3.8-27b"
PORT = 18031
# The server's own log lines the record keeps (first matches, in order).
LOG_PATTERNS = {
    "exec": r"^qwen3090: exec ",
    "platform": r"Automatically detected platform|platform cuda",
    "attention_backend": r"Using (AttentionBackendEnum\.)?\w+ backend|attention backend",
    "gdn": r"GDN|gdn_prefill|Gated ?DeltaNet",
    "kv_available": r"Available KV cache memory",
    "kv_size": r"GPU KV cache size",
    "concurrency": r"Maximum concurrency",
    "cudagraph_profile": r"CUDA graph memory profiling|cudagraph memory|CUDA graph pool memory",
    "graph_capture": r"Capturing CUDA graphs|Graph capturing finished|cudagraph",
    "kv_groups": r"KV cache group|kv_cache_groups|hybrid|block_size|page size",
    "spec": r"[Ss]peculative|MTP|mtp|acceptance|Drafter|drafter",
    "spec_decode_attention": r"spec-decode attention",
    "probe": r"gpue2e-probe: ",
    "dflash2": r"DFlash2|dflash2|DFLASH2",
    "lookup": r"lookup drafting|VLLM_DFLASH2_LOOKUP",
    "kvarn": r"KVARN|KVarN|kvarn",
    # The backend's warning that tiles lost their staging rows (kvarn_attn.py _report_lost).
    "kvarn_lost": r"KVARN: \d+ open tile\(s\) lost",
    "jit_after_warmup": r"Triton kernel JIT compilation during inference",
    "errors": r"Traceback|Error|error:|RuntimeError|ImportError|ModuleNotFound",
}
KEEP_PER_PATTERN = 12


def log(msg: str) -> None:
    print(f"exercise: {msg}", file=sys.stderr, flush=True)


class Record:
    """The JSON record, rewritten on every change."""

    def __init__(self, path: Path, base: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = base
        self.save()

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.save()

    def attempt(self, label: str) -> Attempt:
        self.data.setdefault("attempts", []).append({"label": label})
        self.save()
        return Attempt(self, self.data["attempts"][-1])

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, sort_keys=True, default=str) + "\n")
        tmp.replace(self.path)


class Attempt:
    """One server life's part of the record."""

    def __init__(self, record: Record, data: dict[str, Any]) -> None:
        self.record = record
        self.data = data

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.record.save()



def request(base: str, path: str, body: dict[str, Any] | None, key: str,
            timeout: float = 120) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read().decode()
            return int(resp.status), json.loads(raw) if raw.startswith(("{", "[")) else raw
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode(errors="replace")[-4000:]


def metric(text: str, name: str) -> float | None:
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith((name + "{", name + " "))]
    return sum(values) if values else None


def last_life(path: Path) -> list[str]:
    """The log lines of the last server life in ``path`` (from its last ``qwen3090: exec``)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    starts = [i for i, line in enumerate(lines) if line.startswith("qwen3090: exec ")]
    return lines[starts[-1]:] if starts else lines


def scan_log(lines: list[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {k: [] for k in LOG_PATTERNS}
    for line in lines:
        for key, pattern in LOG_PATTERNS.items():
            if len(found[key]) < KEEP_PER_PATTERN and re.search(pattern, line):
                found[key].append(line[:600])
    return found


# An exception line of a traceback; the generic "it failed" lines vLLM adds after the root
# cause are not the wall.
_EXC = re.compile(r"\b([A-Za-z_.]*(?:Error|Exception)): (.+)$")
_PYDANTIC = re.compile(r"Value error, (.+?) \[type=value_error")
_GENERIC = (
    "Engine core initialization failed", "validation error for", "Error raised in subprocess"
)


def find_wall(lines: list[str]) -> dict[str, str] | None:
    """The first root-cause exception of the server life, with the vLLM frame nearest to it."""
    frame = ""
    for line in lines:
        if " WARNING " in line:
            continue
        m_frame = re.search(r'File "([^"]*/vllm/[^"]+)", line (\d+), in (\w+)', line)
        if m_frame:
            path = m_frame.group(1)
            frame = f"{path[path.rindex('/vllm/') + 1:]}:{m_frame.group(2)} {m_frame.group(3)}"
        m = _EXC.search(line)
        if m and not any(g in line for g in _GENERIC):
            return {"exception": m.group(1), "message": m.group(2)[:500], "frame": frame}
        # A config validator's refusal: pydantic words it "Value error, MESSAGE [type=...".
        m = _PYDANTIC.search(line)
        if m:
            return {"exception": "ValueError", "message": m.group(1)[:500], "frame": frame}
    return None


_POOL = {
    "attention_block_size_tokens": (r"Setting attention block size to (\d+) tokens", int),
    "mamba_page_padding_pct": (r"Padding mamba page size by ([\d.]+)%", float),
    "kv_padding_layers": (r"Add (\d+) padding layers", int),
    "kv_padding_max_waste_pct": (r"may waste at most ([\d.]+)% KV cache memory", float),
    "cudagraph_profile_sizes": (r"Profiling CUDA graph memory: (.+)$", str),
    "cudagraph_pool_memory": (r"CUDA graph pool memory: (.+)$", str),
    "model_loading_gib": (r"Model loading took ([\d.]+) GiB", float),
    "kv_available_gib": (r"Available KV cache memory: ([\d.]+) GiB", float),
    "kv_cache_tokens": (r"GPU KV cache size: ([\d,]+) tokens", str),
    "max_concurrency": (r"Maximum concurrency for .*: ([\d.]+)x", float),
    "graph_capture": (r"Graph capturing finished in (.+)$", str),
    "torch_compile_s": (r"torch\.compile took ([\d.]+) s in total", float),
    "warmup_s": (r"Initial profiling/warmup run took ([\d.]+) s", float),
    "spec_decode_attention_workspace": (r"spec-decode attention: (.+scratch.+)$", str),
}


def pool_numbers(lines: list[str]) -> dict[str, Any]:
    """The sizing figures the engine logged (first occurrence of each)."""
    out: dict[str, Any] = {}
    for key, (pattern, kind) in _POOL.items():
        for line in lines:
            m = re.search(pattern, line)
            if m:
                out[key] = kind(m.group(1))
                break
    out["attention_backends"] = [
        m.group(1) for line in lines
        for m in [re.search(r"Using (?:AttentionBackendEnum\.)?(\w+)(?: attention)? backend", line)]
        if m
    ]
    return out


def jit_facts(lines: list[str]) -> dict[str, Any]:
    """The JIT compiles vLLM's monitor logged after warm-up, as the exporter counts them."""
    from qwen3090.bootlog import parse_boot_log

    facts = parse_boot_log("\n".join(lines))
    return {"monitor_active": facts.jit_monitor_active, "kernels": dict(facts.jit_kernels)}


_CAPTURE = re.compile(r"Capturing CUDA graphs \((\w+)\):.*?\d+/(\d+) \[")


def graph_captures(lines: list[str]) -> dict[str, int]:
    """How many CUDA graphs the runner captured per mode (its progress bars' totals)."""
    totals: dict[str, int] = {}
    for line in lines:
        for mode, total in _CAPTURE.findall(line):
            totals[mode] = max(totals.get(mode, 0), int(total))
    return totals


# The engine core's line when the stop signal reaches it: what fails after it is the
# shutdown (the API server's output handler raises EngineDeadError once the core has gone).
_STOPPED = re.compile(r"received signal=SIG(?:INT|TERM)")


def describe_log(lines: list[str]) -> dict[str, Any]:
    """What the record keeps of one server life's log: the wall is the first failure before
    the stop signal; the first one after it is kept apart, as ``after_stop``."""
    stop = next((i for i, line in enumerate(lines) if _STOPPED.search(line)), len(lines))
    return {"log": scan_log(lines), "log_tail": [line[:600] for line in lines[-60:]],
            "wall": find_wall(lines[:stop]), "after_stop": find_wall(lines[stop:]),
            "pool": pool_numbers(lines), "jit": jit_facts(lines),
            "graphs": graph_captures(lines)}


def exercise(rec: Attempt, base: str, key: str, spec: str) -> None:
    """The client side: every step records what it saw; an exception stops the rest."""
    from openai import OpenAI

    status, models = request(base, "/v1/models", None, key)
    rec.set("models", {"status": status,
                       "ids": [m["id"] for m in models["data"]] if status == 200 else models})

    client = OpenAI(base_url=base + "/v1", api_key=key, timeout=120)
    chat = client.chat.completions.create(
        model=SERVED, messages=[{"role": "user", "content": "Say hello to the river."}],
        max_tokens=48, temperature=0,
    )
    msg = chat.choices[0].message
    rec.set("chat", {
        "ok": True,
        "completion_tokens": chat.usage.completion_tokens if chat.usage else None,
        "finish_reason": chat.choices[0].finish_reason,
        "content_chars": len(msg.content or ""),
        "reasoning_chars": len(getattr(msg, "reasoning", None) or ""),
    })

    _, before = request(base, "/metrics", None, key)
    prompt = " ".join(f"line {i}: the river passes the garden bridge." for i in range(300))
    body = {"model": SERVED, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 4, "temperature": 0}
    s1, first = request(base, "/v1/chat/completions", body, key)
    s2, second = request(base, "/v1/chat/completions", body, key)
    _, after = request(base, "/metrics", None, key)
    rec.set("prefix_cache", {
        "status": [s1, s2],
        "prompt_tokens": second["usage"]["prompt_tokens"] if s2 == 200 else None,
        "cached_tokens": ((second["usage"].get("prompt_tokens_details") or {})
                          .get("cached_tokens") if s2 == 200 else None),
        "hits_metric_delta": _delta(before, after, "vllm:prefix_cache_hits_total"),
        "queries_metric_delta": _delta(before, after, "vllm:prefix_cache_queries_total"),
        "error": None if s1 == 200 and s2 == 200 else [first, second],
    })

    # Structured output under the speculator: the choice grammar terminates after one word,
    # so every verify window that carries drafts past it exercises xgrammar-spec-terminated.
    runs = []
    for seed in range(6):
        s, out = request(base, "/v1/chat/completions", {
            "model": SERVED, "messages": [{"role": "user", "content": f"yes or no? ({seed})"}],
            "max_tokens": 16, "temperature": 1.0, "seed": seed,
            "structured_outputs": {"choice": ["yes", "no"]},
            "chat_template_kwargs": {"enable_thinking": False},
        }, key)
        content = out["choices"][0]["message"].get("content") if s == 200 else None
        runs.append({"status": s, "content": content,
                     "finish_reason": out["choices"][0]["finish_reason"] if s == 200 else None,
                     "error": None if s == 200 else str(out)[:800]})
    s, out = request(base, "/v1/chat/completions", {
        "model": SERVED, "messages": [{"role": "user", "content": "Give an answer object."}],
        "max_tokens": 64, "temperature": 0,
        # vLLM 0.28.0 reads disable_any_whitespace from the server's config only (a request's
        # is ignored), so a random-weight model may fill its tokens with JSON whitespace.
        "structured_outputs": {"json": {
            "type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
            "required": ["answer"], "additionalProperties": False}},
        "chat_template_kwargs": {"enable_thinking": False},
    }, key)
    schema_run = {"status": s, "content": out["choices"][0]["message"].get("content")
                  if s == 200 else None, "error": None if s == 200 else str(out)[:800]}
    rec.set("structured_output", {"choice_runs": runs, "json_schema_run": schema_run})

    # Decode-heavy requests, a few at once, so verify steps replay the captured graphs.
    s, out = request(base, "/v1/completions", {
        "model": SERVED, "prompt": ["The garden bridge", "A river", "Memory and cache"],
        "max_tokens": 96, "temperature": 0, "ignore_eos": True,
    }, key)
    _, final = request(base, "/metrics", None, key)
    rec.set("decode", {
        "status": s,
        "completion_tokens": out["usage"]["completion_tokens"] if s == 200 else None,
        "error": None if s == 200 else str(out)[:800],
        "spec_draft_tokens": metric(str(final), "vllm:spec_decode_num_draft_tokens_total"),
        "spec_accepted_tokens": metric(str(final), "vllm:spec_decode_num_accepted_tokens_total"),
        "spec_drafts": metric(str(final), "vllm:spec_decode_num_drafts_total"),
        "spec": spec,
    })


# The KVarN lives' knobs: the planner's rows, nothing of the engine's flags by hand (the
# plan names no attention backend there; vLLM's selector finds KVARN the only one that
# accepts the dtype, for the MTP drafter's layer too).
KVARN_KNOBS = {"single-user": {"CTX": "huge"}, "batch": {"KV": "kvarn"}}
# The batch life's burst: concurrent requests (more seats than a single-user plan has, fewer
# than batch's 64), each with a prompt of 2 to 10 tiles (short enough that the prefills
# finish early and the seats decode together) and decoded across two tile boundaries.
BURST = 48
BURST_TOKENS = 256


def kvarn_steps(rec: Attempt, base: str, key: str, spec: str) -> None:
    """The KVarN life: the MTP tier's steps, then prompts that close and open tiles.

    Each prompt is several 128-token tiles long and is decoded greedily far enough to close
    the open tile; every sampled token's logprob must be finite (a NaN from a never-written
    slot or a fully masked chunk would surface here), and the same prompt twice (the second
    from the prefix cache's tiles) must decode the same tokens."""
    exercise(rec, base, key, spec)
    runs = []
    for n, lines in enumerate((40, 90, 170)):
        prompt = " ".join(f"entry {i} of list {n}: the bridge holds." for i in range(lines))
        outs = [greedy(base, key, prompt, 160) for _ in range(2)]
        same = all(o["status"] == 200 for o in outs) and outs[0]["text"] == outs[1]["text"]
        runs.append({"runs": outs, "repeat_identical": same})
    rec.set("kvarn_long", runs)


# The long-context step: a prompt this close to CTX=huge's 200,000-token limit, decoded for
# LONG_DECODE tokens; a short prompt decoded as long beside it, for the ratio.
LONG_CONTEXT_TOKENS = 196_000
LONG_DECODE = 128


def long_prompt(base: str, key: str, tokens: int) -> tuple[str, int]:
    """A prompt of at most ``tokens`` tokens (counted by the server's own tokenizer)."""
    def count(text: str) -> int:
        s, out = request(base, "/tokenize", {"model": SERVED, "prompt": text}, key,
                         timeout=300)
        if s != 200:
            raise RuntimeError(f"/tokenize answered {s}: {str(out)[:400]}")
        return int(out["count"])

    def lines(n: int) -> str:
        return " ".join(f"page {i} of the archive: shelf {i % 97} holds it." for i in range(n))

    per_line = count(lines(400)) / 400
    n = int(tokens / per_line)
    while (got := count(lines(n))) > tokens:
        n -= int((got - tokens) / per_line) + 1
    return lines(n), got


def long_context(rec: Attempt, base: str, key: str) -> None:
    """One prompt near the context limit: its prefill alone (max_tokens 1), then the same
    prompt decoded for LONG_DECODE tokens (the prefix cache holds all but its last block),
    and a short prompt decoded as long: statuses, finite logprobs, seconds and the ratio."""
    text, tokens = long_prompt(base, key, LONG_CONTEXT_TOKENS)
    out: dict[str, Any] = {"prompt_tokens": tokens}
    for name, prompt, n in (("short", " ".join(["the ledger balances."] * 200), LONG_DECODE),
                            ("prefill", text, 1), ("decode", text, LONG_DECODE)):
        t0 = time.monotonic()
        step = greedy(base, key, prompt, n, timeout=600)
        out[name] = {**step, "seconds": round(time.monotonic() - t0, 2)}
        rec.set("long_context", out)


# The KVARN builder reads its lost-tile counter back at most every LOST_REPORT_S (5 s), from
# a copy the check before made: a life's last losses reach the log only after two more
# checks, each one a build more than 5 s after the one before.
LOST_FLUSH_WAIT_S = 6.0


def lost_tile_flush(rec: Attempt, base: str, key: str) -> None:
    """Two short requests, each after LOST_FLUSH_WAIT_S of quiet, so that the log holds
    every tile the life lost before the stop signal (test_serve_kvarn.py reads it)."""
    status = []
    for _ in range(2):
        time.sleep(LOST_FLUSH_WAIT_S)
        status.append(greedy(base, key, "the ledger balances.", 2)["status"])
    rec.set("lost_flush", {"status": status, "wait_s": LOST_FLUSH_WAIT_S})


def kvarn_huge_steps(rec: Attempt, base: str, key: str, spec: str) -> None:
    """The CTX=huge KVarN life: kvarn_steps, then the long-context step."""
    kvarn_steps(rec, base, key, spec)
    long_context(rec, base, key)
    lost_tile_flush(rec, base, key)


def kvarn_batch_steps(rec: Attempt, base: str, key: str, spec: str) -> None:
    """The batch KVarN life: kvarn_steps, then the seat burst."""
    kvarn_steps(rec, base, key, spec)
    seat_burst(rec, base, key)
    lost_tile_flush(rec, base, key)


SPEC_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
}


def greedy(base: str, key: str, prompt: str, max_tokens: int,
           timeout: float = 120) -> dict[str, Any]:
    """One greedy completion with logprobs: status, sizes (the prefix cache's share too),
    non-finite logprobs, text."""
    s, out = request(base, "/v1/completions", {
        "model": SERVED, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, "logprobs": 1,
    }, key, timeout=timeout)
    if s != 200:
        return {"status": s, "error": str(out)[:800]}
    choice = out["choices"][0]
    lps = [x for x in choice["logprobs"]["token_logprobs"] if x is not None]
    return {
        "status": s,
        "prompt_tokens": out["usage"]["prompt_tokens"],
        "completion_tokens": out["usage"]["completion_tokens"],
        "cached_tokens": (out["usage"].get("prompt_tokens_details") or {}).get("cached_tokens"),
        "logprobs": len(lps),
        "nonfinite_logprobs": sum(1 for x in lps if not math.isfinite(x)),
        "min_logprob": min(lps) if lps else None,
        "text": choice["text"],
    }


def seat_burst(rec: Attempt, base: str, key: str) -> None:
    """BURST distinct multi-tile prompts at once (each seat opens and closes tiles of its
    own), then the same prompts one at a time: every request 200 with finite logprobs, and
    the concurrent greedy texts equal to the lone ones."""
    prompts = [" ".join(f"seat {n} row {i}: the ledger balances." for i in range(14 + n))
               for n in range(BURST)]
    together: list[dict[str, Any]] = [{} for _ in prompts]

    def one(i: int) -> None:
        together[i] = greedy(base, key, prompts[i], BURST_TOKENS)

    running: list[float] = []
    done = threading.Event()

    def watch() -> None:  # how many seats the engine ran at once, polled while it works
        while not done.wait(0.25):
            _, text = request(base, "/metrics", None, key)
            value = metric(str(text), "vllm:num_requests_running")
            if value is not None:
                running.append(value)

    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(BURST)]
    watcher = threading.Thread(target=watch)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    burst_s = time.monotonic() - t0
    done.set()
    watcher.join()
    t0 = time.monotonic()
    alone = [greedy(base, key, p, BURST_TOKENS) for p in prompts]
    alone_s = time.monotonic() - t0
    rec.set("seat_burst", {
        "requests": BURST,
        "seconds": round(burst_s, 1),
        "alone_seconds": round(alone_s, 1),
        "status": [r.get("status") for r in together],
        "alone_status": [r.get("status") for r in alone],
        "prompt_tokens": [r.get("prompt_tokens") for r in together],
        "completion_tokens": sum(r.get("completion_tokens") or 0 for r in together),
        "nonfinite_logprobs": sum(r.get("nonfinite_logprobs") or 0 for r in together + alone),
        "identical_to_alone": sum(1 for a, b in zip(together, alone, strict=True)
                                  if a.get("status") == 200 and a.get("text") == b.get("text")),
        "max_running": max(running, default=None),
        "errors": [r["error"] for r in together + alone if "error" in r][:3],
    })


def spec_delta(before: Any, after: Any) -> dict[str, Any]:
    """What the speculator did between two /metrics reads, and tokens per step from it."""
    out: dict[str, Any] = {k: _delta(before, after, name) for k, name in SPEC_COUNTERS.items()}
    out["tokens_per_step"] = copy_task.tokens_per_step(out["accepted"], out["drafts"])
    per_pos: dict[str, float] = {}
    for text, sign in ((str(after), 1.0), (str(before), -1.0)):
        for m in re.finditer(r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*'
                             r'position="(\d+)"[^}]*\} ([\d.e+-]+)$', text, re.M):
            per_pos[m.group(1)] = per_pos.get(m.group(1), 0.0) + sign * float(m.group(2))
    out["accepted_per_position"] = {k: per_pos[k] for k in sorted(per_pos, key=int)}
    return out


def completion(base: str, key: str, prompt: str, max_tokens: int, logprobs: bool = False,
               timeout: float = 150, keep_prompt: bool = True) -> dict[str, Any]:
    """One greedy completion with its token ids (the same request in every life); with
    ``logprobs``, each sampled token's logprob too."""
    t0 = time.monotonic()
    body: dict[str, Any] = {
        "model": SERVED, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, "return_token_ids": True,
    }
    if logprobs:
        body["logprobs"] = 1
    s, out = request(base, "/v1/completions", body, key, timeout=timeout)
    seconds = round(time.monotonic() - t0, 2)
    if s != 200:
        return {"status": s, "error": str(out)[-1500:], "seconds": seconds}
    choice = out["choices"][0]
    got: dict[str, Any] = {
        "status": s, "error": None, "seconds": seconds,
        "finish_reason": choice.get("finish_reason"),
        "prompt_token_ids": choice.get("prompt_token_ids") if keep_prompt else None,
        "prompt_tokens": out["usage"]["prompt_tokens"],
        "cached_tokens": (out["usage"].get("prompt_tokens_details") or {}).get("cached_tokens"),
        "output_token_ids": choice.get("token_ids"),
        "completion_tokens": out["usage"]["completion_tokens"],
        "text_head": (choice.get("text") or "")[:300],
    }
    if logprobs:
        got["token_logprobs"] = (choice.get("logprobs") or {}).get("token_logprobs")
    return got


def margins(base: str, key: str, prompt_ids: list[int], output_ids: list[int]) -> dict[str, Any]:
    """The target's own top-1 minus top-2 logprob at each output position, from one prefill of
    prompt + output: where two lives' greedy outputs part, this says whether the target was
    at a near-tie there (a verify block of another shape may round it the other way)."""
    s, out = request(base, "/v1/completions", {
        "model": SERVED, "prompt": list(prompt_ids) + list(output_ids), "max_tokens": 1,
        "temperature": 0, "prompt_logprobs": 2,
    }, key, timeout=120)
    if s != 200:
        return {"status": s, "error": str(out)[-1500:]}
    rows = out["choices"][0].get("prompt_logprobs") or []
    gaps: list[float | None] = []
    agree = 0
    for pos, token in enumerate(output_ids, start=len(prompt_ids)):
        row = rows[pos] if pos < len(rows) else None
        if not row:
            gaps.append(None)
            continue
        entries = sorted(row.items(), key=lambda kv: -float(kv[1]["logprob"]))
        top = [float(v["logprob"]) for _, v in entries]
        gaps.append(round(top[0] - top[1], 5) if len(top) > 1 else None)
        agree += int(entries[0][0]) == token
    return {"status": s, "error": None, "output_margins": gaps,
            "prefill_argmax_agrees": agree / len(output_ids) if output_ids else None}


def exercise_copy(rec: Attempt, base: str, key: str, spec: str) -> None:
    """The SPEC=dflash2 life's client side: the copy task alone, then beside a request with
    nothing to copy (the lookup's decision is batch-wide); counters read around each."""
    status, models = request(base, "/v1/models", None, key)
    rec.set("models", {"status": status,
                       "ids": [m["id"] for m in models["data"]] if status == 200 else models})
    _, before = request(base, "/metrics", None, key)
    copy = completion(base, key, copy_task.copy_prompt(), copy_task.COPY_MAX_TOKENS)
    _, after = request(base, "/metrics", None, key)
    rec.set("copy", {**copy, "spec": spec_delta(before, after)})

    results: dict[str, dict[str, Any]] = {}
    jobs = {"copy": (copy_task.copy_prompt(), copy_task.COPY_MAX_TOKENS),
            "other": (copy_task.other_prompt(), copy_task.OTHER_MAX_TOKENS)}

    def run(name: str) -> None:
        try:
            results[name] = completion(base, key, *jobs[name])
        except Exception as exc:  # recorded, never raised from a thread
            results[name] = {"status": None, "error": repr(exc)[-1500:]}

    threads = [threading.Thread(target=run, args=(name,)) for name in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _, final = request(base, "/metrics", None, key)
    rec.set("mixed_batch", {**results, "spec": spec_delta(after, final)})
    if copy.get("output_token_ids"):
        rec.set("copy_margins", margins(base, key, copy["prompt_token_ids"],
                                        copy["output_token_ids"]))


def plan_of(env: dict[str, str], profile: str = "single-user") -> dict[str, Any]:
    """What ``qwen3090 plan`` resolves the life's knobs to (the environment the server gets)."""
    try:
        proc = subprocess.run([sys.executable, "-m", "qwen3090", "plan", "--json",
                               "--profile", profile], env=env,
                              capture_output=True, text=True, timeout=120)
        plan = json.loads(proc.stdout) if proc.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError) as exc:  # recorded, not fatal
        return {"error": repr(exc)[-3000:]}
    if plan is None:
        return {"error": (proc.stdout + proc.stderr)[-3000:]}
    argv = [str(a) for a in plan.get("argv", [])]
    specs = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--speculative-config"]
    return {"env": plan.get("env"), "warnings": plan.get("warnings"),
            "async_scheduling": "--no-async-scheduling" not in argv,
            "speculative_config": specs[-1] if specs else None, "argv": argv[1:]}


# The three lives: lookup off (the baseline), lookup with the adaptive block (the most code
# never run before: the scheduler acting on the count), lookup with the fixed block; in this
# order, so that a budget with room for two lives still covers the adaptive path.
# ASYNC_SCHED=0 in all three: the adaptive block needs it (gotchas 18, 19), and the same
# scheduling in every life leaves the lookup the only difference between their outputs.
DFLASH2_LIVES = (
    ("lookup=0", {"LOOKUP": "0"}),
    ("lookup=1 adaptive=1", {"LOOKUP": "1", "LOOKUP_ADAPTIVE": "1"}),
    ("lookup=1 adaptive=0", {"LOOKUP": "1", "LOOKUP_ADAPTIVE": "0"}),
)
DFLASH_TOKENS = 15
# --ctx long (issue 21): the planner's SPEC=dflash2 CTX=long row (int8 per-token-head KV on
# TRITON_ATTN, 131,072 tokens) served with the split-KV verify pass the plan turns on, with
# vLLM's stock kernel (SPEC_ATTN=0), and with the Hopper pass turned off by the probe
# (GPUE2E_SPLIT=triton, probe/sitecustomize.py: the portable Triton pass a 3090 runs). The
# same requests in each, so that greedy tokens and logprobs compare and seconds read side by
# side. The plan's own row names the backend and the cache, so EXTRA_ARGS leaves both out.
LONG_LIVES = (
    ("ctx=long split", {"CTX": "long", "LOOKUP": "1", "LOOKUP_ADAPTIVE": "0"}),
    ("ctx=long stock", {"CTX": "long", "LOOKUP": "1", "LOOKUP_ADAPTIVE": "0",
                        "SPEC_ATTN": "0"}),
    ("ctx=long split triton", {"CTX": "long", "LOOKUP": "1", "LOOKUP_ADAPTIVE": "0",
                               "GPUE2E_SPLIT": "triton"}),
)
# The long-context step of those lives: a prompt near the row's 131,072-token limit (so the
# verify batches split the context into many segments), decoded greedily with logprobs.
LONG_VERIFY_TOKENS = 120_000
LONG_VERIFY_DECODE = 128
# A later long life starts only with this much of the budget left (a boot of the 27B's widths
# on warm compile caches, the copy task, the long prompt and the SIGINT).
LATER_LONG_LIFE_MIN_S = 170
# A later life starts only with this much of the budget left: a boot on warm compile caches,
# the copy task and the SIGINT.
LATER_LIFE_MIN_S = 90


def resume_lives(rec: Record, earlier: dict[str, Any]) -> None:
    """Carry the lives an earlier call served into this record, each marked with that call's
    start; only a record of the same patch series may be resumed (the lives must have run the
    same code)."""
    digest = (rec.data.get("manifest") or {}).get("series_digest")
    if digest is None or digest != (earlier.get("manifest") or {}).get("series_digest"):
        raise SystemExit(f"--resume: the earlier record's series is not this tree's ({digest})")
    kept = [{**a, "resumed_from_unix": earlier.get("started_unix")}
            for a in earlier.get("attempts", []) if (a.get("health") or {}).get("ok")]
    rec.set("attempts", kept)
    rec.set("resumed_from_unix", earlier.get("started_unix"))


def long_verify(rec: Attempt, base: str, key: str, spec: str) -> None:
    """The CTX=long lives' client side: the copy task (exercise_copy), then one prompt near
    the context limit decoded greedily, its tokens and logprobs kept for the comparison; then
    the same prompt again, which the prefix cache serves, so that its seconds are the decode's
    (the verify batches at ~120k tokens of context) rather than the prefill's."""
    exercise_copy(rec, base, key, spec)
    text, tokens = long_prompt(base, key, LONG_VERIFY_TOKENS)
    for name in ("long_verify", "long_repeat"):
        _, before = request(base, "/metrics", None, key)
        got = completion(base, key, text, LONG_VERIFY_DECODE, logprobs=True, timeout=600,
                         keep_prompt=False)
        _, after = request(base, "/metrics", None, key)
        rec.set(name, {**got, "counted_prompt_tokens": tokens,
                       "spec": spec_delta(before, after)})


def run_dflash2(args: argparse.Namespace, extra: str, deadline: float, rec: Record) -> None:
    """Up to three lives; each one the budget has no room for is recorded as skipped."""
    if args.draft is None:
        raise SystemExit("--spec dflash2 needs --draft DIR (dflash2_drafter.py writes it)")
    long_ctx = args.ctx == "long"
    lives, later_min = (LONG_LIVES, LATER_LONG_LIFE_MIN_S) if long_ctx else (
        DFLASH2_LIVES, LATER_LIFE_MIN_S)
    if long_ctx:
        extra = "--gdn-prefill-backend triton"
    # The drafter's attention backend is named, as for MTP: left out, it autoselects
    # FLASH_ATTN, whose FlashAttention-3 kernels do not travel (serve_on_device.sh).
    spec_cfg = json.dumps({"method": "dflash", "model": str(args.draft),
                           "num_speculative_tokens": DFLASH_TOKENS,
                           "attention_backend": "TRITON_ATTN"})
    extra += f" --speculative-config '{spec_cfg}'"
    base_knobs = {"DRAFT": str(args.draft), "DFLASH_TOKENS": str(DFLASH_TOKENS),
                  "ASYNC_SCHED": "0"}
    rec.set("dflash2", {"lives": [label for label, _ in lives], "skipped": [],
                        "ctx": args.ctx, "dflash_tokens": DFLASH_TOKENS,
                        "drafter_config": json.loads((args.draft / "config.json").read_text()),
                        "copy_max_tokens": copy_task.COPY_MAX_TOKENS})
    served = {a["label"] for a in rec.data.get("attempts", [])}
    for n, (label, knobs) in enumerate(lives):
        if label in served:  # kept from the --resume record
            continue
        left = deadline - time.monotonic()
        if n and left < later_min:
            rec.data["dflash2"]["skipped"].append(
                {"label": label, "reason": f"{left:.0f} s of the budget left, a life needs "
                 f"{later_min}"})
            rec.save()
            continue
        serve_once(args, "dflash2", extra, deadline, rec.attempt(label),
                   knobs={**base_knobs, **knobs},
                   work=long_verify if long_ctx else exercise_copy, stop_margin_s=35)


def _delta(before: Any, after: Any, name: str) -> float | None:
    a, b = metric(str(after), name), metric(str(before), name)
    return None if a is None or b is None else a - b


Work = Callable[[Attempt, str, str, str], None]


def model_shape(model: Path) -> dict[str, Any]:
    """The served model's widths (demo or shape27b.py) and its weights' bytes."""
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "linear_num_key_heads", "linear_num_value_heads", "intermediate_size",
            "mtp_num_hidden_layers")
    return {**{k: config.get(k) for k in keys},
            "attention_layers": config.get("layer_types", []).count("full_attention"),
            "weights_bytes": sum(f.stat().st_size for f in model.glob("*.safetensors"))}


def serve_once(
    args: argparse.Namespace, spec: str, extra: str, deadline: float, rec: Attempt,
    knobs: dict[str, str] | None = None, work: Work | None = None, stop_margin_s: float = 60,
    profile: str = "single-user",
) -> bool:
    """One server life: start, exercise (``work``, default the MTP tier's steps), SIGINT.
    ``knobs`` adds knob variables; the server gets ``deadline`` less ``stop_margin_s`` to boot.
    Returns True when it became healthy."""
    from qwen3090.localserver import start_server

    key = "gpue2e-" + secrets.token_hex(6)
    env = dict(os.environ)
    env.update({
        "MODEL": str(args.model), "PREFIX_CACHE": "1", "SPEC": spec, "PORT": str(PORT),
        "VLLM_API_KEY": key,
        "EXTRA_ARGS": extra,
        **(knobs or {}),
    })
    log_path = Path(args.log).with_suffix(f".{len(rec.record.data['attempts'])}.log")
    argv = [sys.executable, "-m", "qwen3090", "serve", "--no-gate", "--profile", profile]
    shown = ("PREFIX_CACHE", "SPEC", "EXTRA_ARGS", *(knobs or {}))
    rec.set("serve", {"spec": spec, "argv": argv, "profile": profile,
                      "knobs": {k: env[k] for k in shown}})
    if knobs:
        rec.set("plan", plan_of(env, profile))
    log_path.unlink(missing_ok=True)  # a warm machine keeps the last call's files
    server = start_server(argv, env, PORT, log_path)
    healthy = False
    try:
        boot_limit = min(args.boot_timeout_s, deadline - time.monotonic() - stop_margin_s)
        try:
            boot = server.wait_healthy(boot_limit, poll_s=2.0)
            healthy = True
            rec.set("health", {"ok": True, "boot_seconds": round(boot, 1)})
            log(f"healthy after {boot:.0f} s")
        except Exception as exc:  # the wall: record exactly what stopped it
            rec.set("health", {"ok": False, "error": str(exc)[-6000:]})
            log(f"not healthy: {str(exc)[-400:]}")
        if healthy:
            try:
                (work or exercise)(rec, server.base_url, key, spec)
            except Exception:
                rec.set("exercise_error", traceback.format_exc()[-4000:])
                log("exercise failed:\n" + traceback.format_exc())
    finally:
        t = time.monotonic()
        code = server.stop(grace_s=45)
        rec.set("sigint", {"exit_code": code, "seconds": round(time.monotonic() - t, 1)})
        for key, value in describe_log(last_life(log_path)).items():
            rec.set(key, value)
    return healthy


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--spec", default="mtp")
    p.add_argument("--draft", type=Path, help="the DFlash2 drafter (--spec dflash2)")
    p.add_argument("--kv", choices=("default", "kvarn"), default="default",
                   help="kvarn: one life on the KVarN cache as the plan gives it (KVARN_KNOBS)")
    p.add_argument("--profile", choices=tuple(KVARN_KNOBS), default="single-user",
                   help="--kv kvarn: CTX=huge single-user (--spec off or mtp) or batch KV=kvarn")
    p.add_argument("--ctx", choices=("default", "long"), default="default",
                   help="--spec dflash2: long serves the CTX=long row (int8 KV) with the "
                   "split-KV verify pass and then with the stock kernel (LONG_LIVES)")
    p.add_argument("--budget-s", type=float, default=420)
    p.add_argument("--boot-timeout-s", type=float, default=300)
    p.add_argument("--base", type=Path, help="a JSON object to start the record from")
    p.add_argument("--resume", type=Path, metavar="RECORD",
                   help="--spec dflash2: keep the lives RECORD (an earlier call's result.json "
                   "of the same series) served, and run only the others")
    p.add_argument("--rescan", type=Path, metavar="LOG",
                   help="only re-read LOG (a returned server log) into the last attempt of --out")
    p.add_argument("--label", help="--rescan: the attempt LOG belongs to (default the last)")
    args = p.parse_args()
    if args.kv == "kvarn" and args.spec not in ("off", "mtp"):
        p.error(f"--kv kvarn: --spec {args.spec} is not served on it; use off or mtp")
    if args.ctx == "long" and (args.spec != "dflash2" or args.kv != "default"):
        p.error("--ctx long: the CTX=long lives serve SPEC=dflash2 on the plan's int8 cache")
    if args.profile == "batch" and (args.kv != "kvarn" or args.spec != "off"):
        p.error("--profile batch: only the KV=kvarn life, with --spec off (batch has no "
                "speculator)")
    if args.rescan:
        data = json.loads(args.out.read_text())
        attempt = next(a for a in reversed(data["attempts"])
                       if args.label in (None, a["label"]))
        attempt.update(describe_log(last_life(args.rescan)))
        attempt["rescanned_from"] = args.rescan.name
        args.out.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        return 0
    deadline = time.monotonic() + args.budget_s
    base = json.loads(args.base.read_text()) if args.base and args.base.exists() else {}
    rec = Record(args.out, {**base, "started_unix": int(time.time())})
    if args.resume:
        resume_lives(rec, json.loads(args.resume.read_text()))
    rec.set("model", model_shape(args.model))
    # TRITON_ATTN: FlashAttention-3's kernels do not travel (see serve_on_device.sh); the
    # Triton GDN prefill kernel instead of FlashInfer's, which is not on the machine.
    extra = "--attention-backend TRITON_ATTN --gdn-prefill-backend triton"
    if args.kv == "kvarn":
        batch = args.profile == "batch"
        knobs = KVARN_KNOBS[args.profile]
        label = " ".join(f"{k}={v}" for k, v in knobs.items()) + f" spec={args.spec}"
        serve_once(args, args.spec, "--gdn-prefill-backend triton", deadline,
                   rec.attempt(f"{args.profile} {label}"), knobs=knobs,
                   work=kvarn_batch_steps if batch else kvarn_huge_steps,
                   profile=args.profile)
        rec.set("finished_unix", int(time.time()))
        return 0
    if args.spec == "dflash2":
        run_dflash2(args, extra, deadline, rec)
        rec.set("finished_unix", int(time.time()))
        return 0
    if args.spec == "mtp":
        # --attention-backend governs the target only: the MTP drafter chose FLASH_ATTN by
        # itself on the H200 and called FlashAttention-3 (the first recorded run's wall).
        # The plan's speculative config, with the drafter's backend named.
        spec_cfg = json.dumps({"method": "mtp", "num_speculative_tokens": 4,
                               "draft_sample_method": "probabilistic",
                               "attention_backend": "TRITON_ATTN"})
        extra += f" --speculative-config '{spec_cfg}'"
    if serve_once(args, args.spec, extra, deadline, rec.attempt(f"spec={args.spec}")):
        rec.set("finished_unix", int(time.time()))
        return 0
    # The furthest working step: retry once, around what stopped the first start.
    first = rec.data["attempts"][0]
    error = json.dumps(first.get("wall")) + "\n".join(first.get("log_tail", []))
    if deadline - time.monotonic() < 150:
        rec.set("finished_unix", int(time.time()))
        return 0
    if re.search(r"dynamo|inductor|BackendCompilerFailed", error):
        # CUDA graphs without torch.compile: FULL decode graphs need no compiled pieces.
        cc = json.dumps({"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY",
                         "max_cudagraph_capture_size": 32,
                         "custom_ops": ["+rms_norm", "+silu_and_mul"]})
        serve_once(args, args.spec, f"{extra} --compilation-config '{cc}'", deadline,
                   rec.attempt(f"spec={args.spec} compile-mode=0"))
    elif args.spec != "off":
        serve_once(args, "off", extra, deadline, rec.attempt("spec=off"))
    rec.set("finished_unix", int(time.time()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
