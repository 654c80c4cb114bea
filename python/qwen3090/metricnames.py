"""Names shared by the exporter, the Prometheus rules and the scrape configuration.

The rules in ``modules/prometheus/rules.yml`` and the NixOS module's scrape jobs refer to
these strings; the tests check that the three agree, so a rename here that is not made there
fails CI instead of silently leaving an alert that matches nothing.
"""

from __future__ import annotations

# Scrape jobs (``job`` label). The rules' ``up{job=...}`` alerts select on them.
JOB_VLLM = "qwen3090-vllm"
JOB_EXPORTER = "qwen3090-exporter"

# Default ports: the server's is the profiles' PORT default (18020); the exporter sits beside it.
DEFAULT_SERVER_PORT = 18020
DEFAULT_EXPORTER_PORT = 18021

# vLLM 0.28.0's own counters and gauges (v1/metrics/loggers.py), as scraped: prometheus_client
# appends ``_total`` to counters.
VLLM_PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"
VLLM_PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"
VLLM_PROMPT_TOKENS = "vllm:prompt_tokens_total"
VLLM_PROMPT_TOKENS_CACHED = "vllm:prompt_tokens_cached_total"
VLLM_PREEMPTIONS = "vllm:num_preemptions_total"
VLLM_KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
# A gauge set to 1 whose labels are the engine's CacheConfig (block_size, kv_cache_size_tokens...).
VLLM_CACHE_CONFIG_INFO = "vllm:cache_config_info"

# What the exporter exports. Everything carries the ``qwen3090_`` namespace.
CANARY_SUCCESS = "qwen3090_canary_success"
CANARY_PROBES = "qwen3090_canary_probes"  # counter: exposed with _total
CANARY_FAILURES = "qwen3090_canary_failures"  # counter with a ``reason`` label
CANARY_FAILURE_REASON = "qwen3090_canary_failure_reason"  # gauge: 1 for the latest reason
CANARY_LAST_PROBE = "qwen3090_canary_last_probe_timestamp_seconds"
CANARY_LAST_SUCCESS = "qwen3090_canary_last_success_timestamp_seconds"
CANARY_TTFT = "qwen3090_canary_ttft_seconds"
CANARY_LATENCY = "qwen3090_canary_latency_seconds"
CANARY_COMPLETION_TOKENS = "qwen3090_canary_completion_tokens"
CANARY_DECODE_RATE = "qwen3090_canary_decode_tokens_per_second"
CANARY_INTERVAL = "qwen3090_canary_interval_seconds"
CANARY_PREFIX_PROBES = "qwen3090_canary_prefix_probes"  # counter with a ``result`` label
CANARY_PREFIX_SHARED = "qwen3090_canary_prefix_shared_tokens"
CANARY_PREFIX_CACHED = "qwen3090_canary_prefix_cached_tokens"
# Counters with a ``server`` label (host:port of the server probed), so the rules can take the
# canary's own tokens out of vLLM's prefix-cache counters of the same instance.
CANARY_PREFIX_PROMPT_TOKENS = "qwen3090_canary_prefix_prompt_tokens"
CANARY_PREFIX_CACHED_TOKENS = "qwen3090_canary_prefix_hit_tokens"
SERVER_UP = "qwen3090_server_up"
SERVER_HEALTH_UP = "qwen3090_server_health_up"
HEALTH_CANARY_DISAGREEMENT = "qwen3090_health_canary_disagreement"
BUILD_INFO = "qwen3090_build"  # Info metric: exposed as qwen3090_build_info

BOOT_LOG_READABLE = "qwen3090_boot_log_readable"
BOOT_KV_CACHE_TOKENS = "qwen3090_boot_kv_cache_tokens"
BOOT_KV_CACHE_TOKENS_BEST = "qwen3090_boot_kv_cache_tokens_best"
BOOT_MAX_CONCURRENCY = "qwen3090_boot_max_concurrency"
BOOT_MAX_MODEL_LEN = "qwen3090_boot_max_model_len_tokens"
BOOT_ENGINE_INIT_SECONDS = "qwen3090_boot_engine_init_seconds"
BOOT_TORCH_COMPILE_SECONDS = "qwen3090_boot_torch_compile_seconds"
BOOT_COMPILE_CACHE_WARM = "qwen3090_boot_compile_cache_warm"
BOOT_COMPILE_CACHE_LOAD_FAILED = "qwen3090_boot_compile_cache_load_failed"
# Kernel JIT compiles vLLM's monitor logged after warm-up (gotcha 45): the total, and per kernel
# (a ``kernel`` label: a kernel function's name, bounded by the code that runs).
BOOT_JIT_COMPILES = "qwen3090_boot_jit_compiles"
BOOT_JIT_KERNEL_COMPILES = "qwen3090_boot_jit_kernel_compiles"

# The bounded set of values of the failure counter's ``reason`` label.
FAILURE_REASONS = (
    "connection",
    "timeout",
    "unauthorized",
    "http_error",
    "stream_error",
    "protocol",
)

# The bounded set of values of the prefix canary's ``result`` label (canary.judge_prefix).
PREFIX_RESULTS = ("hit", "miss", "short", "blind", "failed")
