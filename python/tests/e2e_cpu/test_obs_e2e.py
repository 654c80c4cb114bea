"""End to end: a real vLLM 0.28.0 CPU server, the exporter and a real Prometheus scraping both.

One server boot carries every check, because the last ones break its engine (so it cannot be
the shared ``cpu_server``):

1. Prometheus scrapes both jobs of the shipped scrape configuration; the canary succeeds.
2. Every vLLM series the rules use exists on the live server; the exporter's live output
   passes ``promtool check metrics``; its boot facts equal the server log's.
3. Unrelated long prompts: queries continue, nothing hits, and the zero-hit alert's
   expression is true in Prometheus.
4. Long prompts sent twice: the recorded hit ratio and cached-token share read back > 0, and
   the zero-hit expression goes false. On the hybrid demo model in align mode some prompt
   lengths get no hit at all (gotcha 44's geometry lottery), so several lengths are sent and
   what each got is printed.
5. The engine core is stopped (SIGSTOP, a hung engine): /health keeps answering 200 while the
   canary fails, so the disagreement metric and the engine-dead expression turn true. It is
   resumed and the canary recovers.
6. The engine core is killed (SIGKILL) with VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 so the API
   process stays up: the canary flips to 0 within interval + timeout, the API keeps
   answering (/health says 503 once vLLM notices), and the engine-dead alert goes pending.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qwen3090.bootlog import parse_boot_log
from tests.support.obs_stack import (
    RULES,
    ExporterProc,
    PrometheusProc,
    Server,
    find_engine_core,
    http_get,
    http_post_json,
    render_prometheus_config,
    rule_exprs,
    start_cpu_server,
    start_exporter,
    start_prometheus,
    tool,
    wait_until,
)

pytestmark = pytest.mark.e2e_cpu

SERVER_PORT = 18510
EXPORTER_PORT = 18511
PROMETHEUS_PORT = 18512
INTERVAL_S = 2.0
TIMEOUT_S = 4.0

WORDS = [
    "river", "stone", "cloud", "lantern", "orchard", "copper", "meadow", "violin", "harbor",
    "thistle", "canyon", "ember", "glacier", "pepper", "saddle", "willow", "quartz", "falcon",
    "biscuit", "tundra", "marble", "pilot",
]  # fmt: skip


def _words(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _chat(server: Server, text: str) -> dict[str, object]:
    status, body = http_post_json(
        f"{server.base_url}/v1/chat/completions",
        {
            "model": server.model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 2,
            "temperature": 0,
        },
        api_key=server.api_key,
        timeout_s=300,
    )
    assert status == 200, body
    usage = body["usage"]
    assert isinstance(usage, dict)
    return usage


def _check_stack_up(server: Server, exporter: ExporterProc, prom: PrometheusProc) -> None:
    prom.wait_values(
        'up{job=~"qwen3090-vllm|qwen3090-exporter"}',
        lambda v: v == [1.0, 1.0],
        "both scrape jobs up",
        60,
    )
    prom.wait_values("qwen3090_canary_success", lambda v: v == [1.0], "canary success", 60)


def _check_names_and_format(server: Server, exporter: ExporterProc) -> None:
    import re

    vllm_text = http_get(f"{server.base_url}/metrics")[1].decode()
    exported = {line.split("{")[0].split(" ")[0] for line in vllm_text.splitlines() if line}
    used = set(re.findall(r"\bvllm:[a-z0-9_]+", RULES.read_text()))
    assert used - exported == set(), "series the rules use that vLLM 0.28.0 does not export"

    text = exporter.metrics_text()
    lint = subprocess.run(
        [tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert lint.returncode == 0 and not (lint.stdout + lint.stderr).strip(), lint.stdout
    facts = parse_boot_log(server.log_path.read_text(errors="replace"))
    assert facts.kv_cache_tokens is not None and facts.kv_cache_tokens > 0
    assert exporter.sample("qwen3090_boot_kv_cache_tokens") == facts.kv_cache_tokens
    assert exporter.sample("qwen3090_boot_max_concurrency") == facts.max_concurrency
    decode = exporter.sample("qwen3090_canary_decode_tokens_per_second")
    tokens = exporter.sample("qwen3090_canary_completion_tokens")
    assert decode is not None and decode > 0 and tokens == 16.0
    print(
        f"[obs] boot: KV pool {facts.kv_cache_tokens} tokens, concurrency "
        f"{facts.max_concurrency}x at {facts.max_model_len}, engine init "
        f"{facts.engine_init_seconds} s, compile cache warm {facts.compile_cache_warm}; "
        f"canary decode {decode:.1f} tok/s over {tokens:.0f} usage tokens"
    )


def _wrong_key_is_not_a_dead_engine(server: Server, workdir: Path) -> None:
    bad = workdir / "bad-key"
    bad.write_text("not-the-key\n")
    argv = [
        sys.executable, "-m", "qwen3090", "exporter", "--once",
        "--server", server.base_url, "--api-key-file", str(bad),
    ]  # fmt: skip
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert 'qwen3090_canary_failures_total{reason="unauthorized"} 1.0' in proc.stdout
    assert "qwen3090_health_canary_disagreement 0.0" in proc.stdout


def _prefix_canary_hits(server: Server) -> None:
    """Issue 19 item 8: the prefix canary's second request is served from the cache."""
    argv = [
        sys.executable, "-m", "qwen3090", "exporter", "--once", "--prefix-every", "1",
        "--server", server.base_url, "--api-key-file", str(server.api_key_file),
        "--timeout", "60",
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    values = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in proc.stdout.splitlines()
        if line.startswith("qwen3090_canary_prefix")
    }
    judged = {
        result: values[f'qwen3090_canary_prefix_probes_total{{result="{result}"}}']
        for result in ("hit", "miss", "short", "blind", "failed")
    }
    # Judged: the server reported cached_tokens and a block size, and the probe shared two
    # blocks or more. Which of hit and miss depends on the prompt's length against the
    # demo model's 640-token blocks in align mode (gotcha 44's lottery, see the README).
    assert judged["hit"] + judged["miss"] == 1.0, (judged, proc.stderr)
    shared = values["qwen3090_canary_prefix_shared_tokens"]
    cached = values["qwen3090_canary_prefix_cached_tokens"]
    assert 0 <= cached <= shared and (cached > 0) == (judged["hit"] == 1.0)
    outcome = "hit" if judged["hit"] else "MISS (gotcha 44)"
    print(f"[obs] prefix canary: {shared:.0f} tokens shared, {cached:.0f} cached: {outcome}")


def test_prometheus_reads_prefix_cache_and_dead_engine(
    demo_model_dir: Path, tmp_path: Path
) -> None:
    tool("prometheus")
    exprs = rule_exprs()
    zero_hit = exprs["Qwen3090PrefixCacheHitRatioZero"]
    engine_dead = exprs["Qwen3090EngineDead"]
    ratio = "instance_model:vllm_prefix_cache_hits_per_queries:ratio_rate5m"
    share = "instance_model:vllm_prompt_tokens_cached_per_prompt_tokens:ratio_rate5m"

    server = start_cpu_server(
        demo_model_dir, SERVER_PORT, tmp_path, {"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"}
    )
    exporter: ExporterProc | None = None
    prom: PrometheusProc | None = None
    try:
        boot_s = server.wait_healthy(900)
        print(f"[obs] vLLM CPU server (qwen3090 serve) healthy after {boot_s:.0f} s")
        # The prefix canary off here: step 3 needs a server that found nothing at all; it
        # runs on its own after step 4.
        exporter = start_exporter(
            server, EXPORTER_PORT, tmp_path, INTERVAL_S, TIMEOUT_S, ("--prefix-every", "0")
        )
        config = render_prometheus_config(
            f"127.0.0.1:{SERVER_PORT}", f"127.0.0.1:{EXPORTER_PORT}", "1s", RULES
        )
        prom = start_prometheus(config, PROMETHEUS_PORT, tmp_path)

        # 1-2. scraped, named, formatted.
        _check_stack_up(server, exporter, prom)
        _check_names_and_format(server, exporter)
        _wrong_key_is_not_a_dead_engine(server, tmp_path)

        # 3. Queries without hits: four unrelated long prompts.
        for seed in range(4):
            usage = _chat(server, _words(1000 + seed, 600))
            print(f"[obs] unrelated prompt {seed}: {usage}")
        prom.wait_values(ratio, lambda v: v == [0.0], "hit ratio 0 under unrelated prompts", 30)
        prom.wait_values(zero_hit, lambda v: len(v) == 1, "zero-hit alert expression true", 30)

        # 4. The same long prompts twice, at several lengths (gotcha 44's lottery).
        hits = 0
        for words in (1000, 600, 450):
            text = f"repeat {words}: " + _words(words, words)
            first, second = _chat(server, text), _chat(server, text)
            details = second.get("prompt_tokens_details")
            cached = details.get("cached_tokens") if isinstance(details, dict) else None
            hits += int(cached or 0)
            print(
                f"[obs] prompt of {first['prompt_tokens']} tokens sent twice: second request "
                f"cached {cached} tokens"
            )
        got = prom.wait_values(ratio, lambda v: len(v) == 1 and v[0] > 0, "hit ratio > 0", 30)
        cached_share = prom.wait_values(share, lambda v: len(v) == 1 and v[0] > 0, "share", 30)
        assert 0 < got[0] <= 1 and 0 < cached_share[0] <= 1
        prom.wait_values(zero_hit, lambda v: v == [], "zero-hit alert expression false", 30)
        print(
            f"[obs] Prometheus: hit ratio {got[0]:.3f}, cached-token share "
            f"{cached_share[0]:.3f} (usage reported {hits} cached tokens in total)"
        )

        _prefix_canary_hits(server)

        # 5. A hung engine: /health 200, the canary fails, they disagree.
        engine = find_engine_core(server.proc.pid)
        os.kill(engine, signal.SIGSTOP)
        try:
            wait_until(
                "the exporter to report a /health-canary disagreement",
                lambda: exporter.sample("qwen3090_health_canary_disagreement") == 1.0,
                INTERVAL_S + TIMEOUT_S + 10,
            )
            health_hung = http_get(f"{server.base_url}/health")[0]
            assert health_hung == 200, "a stopped engine core: /health should still say 200"
            prom.wait_values(
                "qwen3090_health_canary_disagreement", lambda v: v == [1.0], "disagreement", 20
            )
            prom.wait_values(engine_dead, lambda v: len(v) == 1, "engine-dead (hung)", 20)
            print("[obs] SIGSTOP of EngineCore: /health 200, canary failing, disagreement 1")
        finally:
            os.kill(engine, signal.SIGCONT)
        wait_until(
            "the canary to recover after SIGCONT",
            lambda: exporter.sample("qwen3090_canary_success") == 1.0,
            60,
        )

        # 6. A killed engine behind a live API process.
        os.kill(engine, signal.SIGKILL)
        killed_at = time.monotonic()
        flip_s = wait_until(
            "the canary to fail after the engine core was killed",
            lambda: exporter.sample("qwen3090_canary_success") == 0.0,
            INTERVAL_S + TIMEOUT_S + 10,
            step_s=0.2,
        )
        assert flip_s <= INTERVAL_S + TIMEOUT_S, f"canary flipped after {flip_s:.1f} s"
        assert server.proc.poll() is None, "the API process exited with its engine"
        health_dead = http_get(f"{server.base_url}/health")[0]
        # Measured on vLLM 0.28.0: /health turns 503 once the client notices the dead
        # engine core; it is the API process answering at all that marks it "up".
        assert health_dead == 503, health_dead
        prom.wait_values("qwen3090_canary_success", lambda v: v == [0.0], "canary 0", 20)
        prom.wait_values("qwen3090_server_up", lambda v: v == [1.0], "API still up", 20)
        prom.wait_values(engine_dead, lambda v: len(v) == 1, "engine-dead (killed)", 20)
        prom.wait_values(
            'ALERTS{alertname="Qwen3090EngineDead"}', lambda v: len(v) == 1, "alert pending", 20
        )
        print(
            f"[obs] SIGKILL of EngineCore: canary 0 after {flip_s:.1f} s (interval "
            f"{INTERVAL_S} s), /health {health_dead}, API process alive, engine-dead alert "
            f"pending {time.monotonic() - killed_at:.1f} s after the kill"
        )
    finally:
        for proc in (prom, exporter, server):
            if proc is not None:
                proc.stop()
