"""Boot facts read from a vLLM server log: KV pool, concurrency, compile time, cache state and
the kernel compiles left to the requests.

These numbers decide how a deployment behaves for its whole life and are printed once, at
boot: the KV pool in tokens and the concurrency it buys (gotcha 2: a dirty GPU or a cold
compile cache shrinks the pool silently), the torch.compile time, and whether the compiled
artifact came from the persistent cache (seeds/004: a cold boot pays minutes). The exporter
turns them into gauges so a shrunken pool or a lost cache shows on a dashboard.

A kernel JIT-compiled while serving stalls the request that needs it (gotcha 45). vLLM 0.28.0's
JIT monitor (``utils/jit_monitor.py``, activated by the CUDA worker once warm-up is over; the
CPU worker never activates it) logs a warning per compile it sees after that point: one per
kernel name by default, every compile with ``--jit-monitor-verbose``. Those lines are counted
from the activation on. The log cannot say which request paid a compile: the engine logs no
request boundary at the default level, and uvicorn's access line for a stream is written when
the response starts, before any token is generated.

The line formats are vLLM 0.28.0's (``v1/core/kv_cache_utils.py``, ``v1/engine/core.py``,
``compilation/backends.py``, ``compilation/decorators.py``, ``compilation/monitor.py``); the
CPU build prints the same "GPU KV cache size" wording. A log holding several boots (a service
appending to one file) reports the last boot: each engine start resets the facts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

log = logging.getLogger("qwen3090.bootlog")

_BOOT_START = re.compile(r"Initializing a V1 LLM engine \(v(?P<version>[^)\s]+)\)")
# The API server prints its non-default arguments before the engine starts (api_utils.py);
# the same arguments mean the same pool, so they key "this build's warm pool".
_ENGINE_ARGS = re.compile(r"non-default args: (?P<args>\{.*\})\s*$")
_KV_TOKENS = re.compile(r"GPU KV cache size: (?P<tokens>[\d,]+) tokens")
_MAX_CONCURRENCY = re.compile(
    r"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<ratio>[\d.]+)x"
)
_ENGINE_INIT = re.compile(
    r"init engine \(profile, create kv cache, warmup model\) took (?P<s>[\d.]+) s"
    r"(?: \(compilation: (?P<c>[\d.]+) s)?"
)
_TORCH_COMPILE = re.compile(r"torch\.compile took (?P<s>[\d.]+) s in total")
# Evidence that a compiled artifact was loaded instead of built...
_LOADED = re.compile(
    r"Directly load the compiled graph\(s\) for compile range"
    r"|Directly load AOT compilation from path"
)
# ...and that something was compiled at this boot (a fresh build saves its AOT artifact).
_COMPILED = re.compile(
    r"Compiling a graph for compile range .* takes [\d.]+ s"
    r"|saved AOT compiled function to"
)
# The CPU build of 0.28.0 cannot load its own AOT artifact on a restart ('function' object has
# no attribute 'finalize_loading') and recompiles: the cache is present but not used.
_LOAD_FAILED = re.compile(r"Compiling model again due to a load failure")
# utils/jit_monitor.py: printed once warm-up is done, then one warning per monitored compile
# ("Triton kernel", "CuTeDSL" or "TileLang"), the kernel's name before " (details)" (verbose
# mode) or ". This causes a latency spike".
_JIT_MONITOR = re.compile(r"Kernel JIT monitor activated; monitored JIT compilations")
_JIT_COMPILE = re.compile(
    r"(?:Triton kernel|CuTeDSL|TileLang) JIT compilation during inference: "
    r"(?P<kernel>.+?)(?: \(|\. This causes a latency spike)"
)


@dataclass(frozen=True)
class BootFacts:
    """What one boot's log said; None (or False) for what it did not say."""

    vllm_version: str | None = None
    engine_args: str | None = None
    """The server's non-default arguments as logged (the API key is redacted by vLLM)."""
    kv_cache_tokens: int | None = None
    max_model_len: int | None = None
    max_concurrency: float | None = None
    engine_init_seconds: float | None = None
    torch_compile_seconds: float | None = None
    compile_loaded: bool = False
    compile_compiled: bool = False
    compile_load_failed: bool = False
    jit_monitor_active: bool = False
    """vLLM's JIT monitor said it is watching: warm-up is over."""
    jit_kernels: tuple[tuple[str, int], ...] = ()
    """(kernel, compiles) the monitor logged after warm-up, kernels in first-seen order."""

    @property
    def jit_compiles(self) -> int | None:
        """Kernel compiles logged while serving; None where no monitor was active (the CPU
        build, or a log cut before warm-up ended), so that no compile is not mistaken for
        nobody counting."""
        return sum(n for _k, n in self.jit_kernels) if self.jit_monitor_active else None

    @property
    def compile_cache_warm(self) -> bool | None:
        """True: the compiled graphs came from the cache; False: this boot compiled; None:
        the log says neither (eager mode, or a log cut before compilation)."""
        if self.compile_compiled or self.compile_load_failed:
            return False
        if self.compile_loaded:
            return True
        return None


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _count(kernels: tuple[tuple[str, int], ...], kernel: str) -> tuple[tuple[str, int], ...]:
    """``kernels`` with one more compile of ``kernel``."""
    if all(k != kernel for k, _n in kernels):
        return (*kernels, (kernel, 1))
    return tuple((k, n + 1 if k == kernel else n) for k, n in kernels)


class BootLogParser:
    """Feeds log lines one at a time; ``facts`` is what the latest boot has said so far."""

    def __init__(self) -> None:
        self.facts = BootFacts()
        self._engine_args: str | None = None

    def feed(self, line: str) -> None:
        if m := _ENGINE_ARGS.search(line):
            # Printed before the engine's own start line: a new boot begins here.
            self._engine_args = m["args"]
            self.facts = BootFacts(engine_args=self._engine_args)
            return
        if m := _BOOT_START.search(line):
            self.facts = BootFacts(vllm_version=m["version"], engine_args=self._engine_args)
            return
        f = self.facts
        if m := _KV_TOKENS.search(line):
            f = replace(f, kv_cache_tokens=_int(m["tokens"]))
        if m := _MAX_CONCURRENCY.search(line):
            f = replace(f, max_model_len=_int(m["len"]), max_concurrency=float(m["ratio"]))
        if m := _ENGINE_INIT.search(line):
            f = replace(f, engine_init_seconds=float(m["s"]))
            if m["c"] is not None and f.torch_compile_seconds is None:
                # The same total torch.compile line reports; used only when that line is absent.
                f = replace(f, torch_compile_seconds=float(m["c"]))
        if m := _TORCH_COMPILE.search(line):
            f = replace(f, torch_compile_seconds=float(m["s"]))
        if _LOADED.search(line):
            f = replace(f, compile_loaded=True)
        if _COMPILED.search(line):
            f = replace(f, compile_compiled=True)
        if _LOAD_FAILED.search(line):
            f = replace(f, compile_load_failed=True)
        if _JIT_MONITOR.search(line):
            f = replace(f, jit_monitor_active=True)
        elif f.jit_monitor_active and (m := _JIT_COMPILE.search(line)):
            f = replace(f, jit_kernels=_count(f.jit_kernels, m["kernel"]))
        self.facts = f


def parse_boot_log(text: str) -> BootFacts:
    """The facts of the last boot in a whole log."""
    parser = BootLogParser()
    for line in text.splitlines():
        parser.feed(line)
    return parser.facts


class BootLogFollower:
    """Reads a growing server log incrementally (the server keeps appending while it runs).

    A file that was replaced (another inode: rotated, as the NixOS unit's rotate-log.sh does
    before a start) or that shrank (truncated) is read again from the start. The inode, not
    the size alone: a new file that has already grown past the old offset is still new.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._parser = BootLogParser()
        self._offset = 0
        self._partial = b""
        self._identity: tuple[int, int] | None = None

    def poll(self) -> BootFacts | None:
        """New lines parsed; the current facts, or None when the file cannot be read."""
        try:
            with self.path.open("rb") as fh:
                # The identity of the file opened, not of the path: it may be replaced meanwhile.
                st = os.fstat(fh.fileno())
                identity = (st.st_dev, st.st_ino)
                if identity != self._identity or st.st_size < self._offset:
                    self._parser = BootLogParser()
                    self._offset = 0
                    self._partial = b""
                    self._identity = identity
                fh.seek(self._offset)
                chunk = fh.read()
        except OSError:
            return None
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        # The last element is an unfinished line (or b""): keep it for the next poll.
        self._partial = lines.pop()
        for raw in lines:
            self._parser.feed(raw.decode("utf-8", errors="replace"))
        return self._parser.facts


def pool_key(series_digest: str, engine_args: str | None) -> str:
    """What makes two boots' pools comparable: the same patch series and the same server
    arguments (a deliberate change of GPU_UTIL, KV_MEM or the seats is a new reference, not a
    shrink). Hashed, so the state file holds no model path."""
    text = f"{series_digest}\n{engine_args or ''}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class PoolMemory:
    """The largest KV pool, in tokens, that a boot of each build and configuration logged.

    Gotchas 2 and 48: a boot with a cold compile cache (every new series digest starts with
    one) or a GPU still being released keeps a smaller pool for its whole life. The largest
    pool seen for the same key is what this build reaches warm, so a boot below it has shrunk.
    Persisted as JSON under ``path`` when one is given, so the reference survives restarts of
    the exporter and of the server; kept in memory only otherwise.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._best: dict[str, int] = {}
        if path is not None:
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                data = {}
            if isinstance(data, dict):
                self._best = {
                    k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, int)
                }

    def record(self, key: str, tokens: int) -> int:
        """Remember ``tokens`` for ``key``; the largest pool recorded for it."""
        best = self._best.get(key)
        if best is not None and best >= tokens:
            return best
        self._best[key] = tokens
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps(self._best, indent=1, sort_keys=True) + "\n")
                tmp.replace(self.path)
            except OSError as err:
                # The gauge still holds the value; only a restart would forget it.
                log.warning("cannot save the KV pool reference to %s: %s", self.path, err)
        return tokens
