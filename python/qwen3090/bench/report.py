"""Tables on stdout and JSON beside them, each stamped with the build, the compile-cache state
and the server's KV pool.

Gotcha 48: the autotuner's cached winners decide the kernels and therefore the trajectory of
greedy output, so a row without its cache state cannot be compared with another row. Gotcha 2:
the same build serves with a pool up to 40% smaller after a cold or dirty boot, and a smaller
pool preempts and evicts sooner, so the pool is stamped too.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qwen3090 import caches
from qwen3090.apikey import API_KEY_ENV
from qwen3090.bench.client import Client, cache_config_info
from qwen3090.bootlog import parse_boot_log
from qwen3090.canary import fetch_metrics


def add_server_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        default=os.environ.get("QWEN3090_SERVER", "http://127.0.0.1:18020"),
        help="base URL of an OpenAI-compatible server (default: $QWEN3090_SERVER or :18020)",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"bearer token (default: ${API_KEY_ENV})",
    )
    parser.add_argument("--model", default="qwen3.8-27b", help="served model name")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request seconds")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    parser.add_argument(
        "--server-log",
        type=Path,
        default=None,
        help="the server's log, to stamp whether its boot compiled (a cold boot keeps a smaller "
        "KV pool); the pool itself is read from the server's /metrics",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="compile-cache base to fingerprint (default: the one `qwen3090 serve` uses here)",
    )


def client_from(args: argparse.Namespace) -> Client:
    return Client(args.server, args.model, args.api_key, args.timeout)


def cache_stamp(
    cache_dir: Path | None, manifest: caches.BuildIdentity | None = None
) -> dict[str, Any]:
    """The build and the local compile cache's autotune fingerprint.

    The fingerprint is of the cache on THIS machine, which is the server's cache when the tool
    runs beside the server (the usual case); the JSON says so. ``manifest`` None means the
    build this process would import.
    """
    if manifest is None:
        manifest = caches.find_manifest()
    paths = caches.resolve(cache_dir, manifest)
    fp, n = caches.build_fingerprint(paths)
    return {
        "vllm_version": paths.build.vllm_version,
        "series_digest": paths.build.series_digest,
        "build": paths.build.key,
        "cache_fingerprint": fp,
        "autotune_records": n,
        "cache_dir": str(paths.build_dir),
        "scope": "local",
    }


def _int_label(info: Mapping[str, str], key: str) -> int | None:
    try:
        return int(info[key])
    except (KeyError, ValueError):  # absent, or "None" before the engine sized its pool
        return None


def pool_stamp(metrics_text: str | None, server_log: Path | None = None) -> dict[str, Any]:
    """The server's KV pool: vLLM 0.28.0's ``vllm:cache_config_info`` labels carry the pool
    in tokens and blocks as the engine sized it; the boot log, when given, says whether that
    boot compiled (a cold compile cache shrinks a profiled pool, gotcha 48)."""
    info = cache_config_info(metrics_text)
    stamp: dict[str, Any] = {
        "source": "metrics" if info else "unavailable",
        "kv_cache_tokens": _int_label(info, "kv_cache_size_tokens"),
        "num_gpu_blocks": _int_label(info, "num_gpu_blocks"),
        "block_size": _int_label(info, "block_size"),
        "kv_cache_memory_bytes": _int_label(info, "kv_cache_memory_bytes"),
        "gpu_memory_utilization": info.get("gpu_memory_utilization"),
    }
    if server_log is not None:
        try:
            facts = parse_boot_log(server_log.read_text(errors="replace"))
        except OSError as err:
            stamp["boot_log"] = f"unreadable: {err.strerror}"
        else:
            stamp["boot_log"] = {
                "kv_cache_tokens": facts.kv_cache_tokens,
                "compile_cache_warm": facts.compile_cache_warm,
                "compile_load_failed": facts.compile_load_failed,
            }
    return stamp


def describe_pool(stamp: Mapping[str, Any]) -> str:
    tokens = stamp.get("kv_cache_tokens")
    text = "KV pool unknown" if tokens is None else f"KV pool {tokens:,} tokens"
    if stamp.get("num_gpu_blocks") is not None:
        text += f" ({stamp['num_gpu_blocks']} blocks of {stamp.get('block_size')})"
    boot = stamp.get("boot_log")
    if isinstance(boot, dict):
        warm = boot.get("compile_cache_warm")
        if warm is None:
            text += ", the boot log says nothing of compilation"
        else:
            text += ", boot loaded its compiled graphs" if warm else ", boot compiled (cold)"
    return text


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else ""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    cells = [[_cell(row.get(col)) for col in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def finite_median(values: Sequence[float | None]) -> float | None:
    good = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(good) if good else None


def _server_metrics(args: argparse.Namespace) -> str | None:
    """The server's /metrics when the tool ran against one (``boot`` starts its own)."""
    server = getattr(args, "server", None)
    if not isinstance(server, str):
        return None
    timeout = min(float(getattr(args, "timeout", 10.0)), 10.0)
    try:
        return fetch_metrics(server, getattr(args, "api_key", None), timeout)
    except ValueError:  # not an http(s) URL: the tool's own requests said so already
        return None


def write_report(
    out: Path | None,
    tool: str,
    args: argparse.Namespace,
    params: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
    manifest: caches.BuildIdentity | None = None,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": 1,
        "tool": tool,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "server": getattr(args, "server", None),
        "model": getattr(args, "model", None),
        "cache": cache_stamp(getattr(args, "cache_dir", None), manifest),
        "pool": pool_stamp(_server_metrics(args), getattr(args, "server_log", None)),
        "params": dict(params),
        "rows": list(rows),
        "summary": dict(summary),
    }
    stamp = doc["cache"]
    print(
        f"build {stamp['build']}  series {stamp['series_digest']}  "
        f"cache fingerprint {stamp['cache_fingerprint']} ({stamp['autotune_records']} records)"
    )
    print(describe_pool(doc["pool"]))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"wrote {out}")
    return doc
