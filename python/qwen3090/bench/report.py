"""Tables on stdout and JSON beside them, each stamped with the build and compile-cache state.

Gotcha 48: the autotuner's cached winners decide the kernels and therefore the trajectory of
greedy output, so a row without its cache state cannot be compared with another row.
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
from qwen3090.bench.client import Client


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
        "params": dict(params),
        "rows": list(rows),
        "summary": dict(summary),
    }
    stamp = doc["cache"]
    print(
        f"build {stamp['build']}  series {stamp['series_digest']}  "
        f"cache fingerprint {stamp['cache_fingerprint']} ({stamp['autotune_records']} records)"
    )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"wrote {out}")
    return doc
