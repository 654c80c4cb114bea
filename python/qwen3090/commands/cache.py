"""`qwen3090 cache status|clear|fingerprint`: the persistent compile caches, per build."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from qwen3090 import caches
from qwen3090.errors import Qwen3090Error


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "cache",
        help="show, fingerprint or clear the persistent compile caches",
        description="The compile caches (vLLM, inductor, Triton, FlashInfer) live in one "
        "directory per build (vLLM version + patch series digest) under the cache base.",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help=f"cache base (default: ${caches.ENV_BASE}, else $XDG_CACHE_HOME/qwen3090)",
    )
    sub = parser.add_subparsers(dest="cache_command", required=True, metavar="ACTION")

    status = sub.add_parser("status", help="every build's caches, their sizes and fingerprint")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.set_defaults(func=run_status)

    fp = sub.add_parser(
        "fingerprint",
        help="hash of the autotune winners of this build's cache (print it beside a bench row)",
    )
    fp.add_argument("--build", default=None, help="a build key (default: the installed build)")
    fp.set_defaults(func=run_fingerprint)

    clear = sub.add_parser("clear", help="delete this project's caches (nothing else)")
    which = clear.add_mutually_exclusive_group()
    which.add_argument("--build", action="append", default=None, help="a build key (repeat)")
    which.add_argument("--stale", action="store_true", help="every build but the installed one")
    which.add_argument("--all", action="store_true", help="every build")
    clear.add_argument(
        "--include-hf", action="store_true", help="also the service's own HF cache (weights)"
    )
    clear.add_argument("--dry-run", action="store_true", help="say what would go, delete none")
    clear.set_defaults(func=run_clear)
    parser.set_defaults(func=run_status, json=False)


def _paths(args: argparse.Namespace) -> caches.CachePaths:
    return caches.resolve(args.cache_dir, caches.find_manifest())


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def run_status(args: argparse.Namespace) -> int:
    paths = _paths(args)
    states = caches.list_builds(paths.base)
    if args.json:
        doc = {
            "base": str(paths.base),
            "current": paths.build.key,
            "builds": [
                {
                    "key": s.key,
                    "current": s.key == paths.build.key,
                    "vllm_version": s.vllm_version,
                    "series_digest": s.series_digest,
                    "bytes": s.total_bytes,
                    "components": {k: {"bytes": b, "files": f} for k, (b, f) in s.sizes.items()},
                    "fingerprint": s.fingerprint,
                    "autotune_records": s.autotune_records,
                }
                for s in states
            ],
        }
        print(json.dumps(doc, indent=2))
        return 0
    print(f"cache base: {paths.base}")
    print(f"installed build: {paths.build.key}")
    if not states:
        print("no builds cached yet (the first `qwen3090 serve` creates one)")
        return 0
    header = f"{'':1} {'build':40} {'size':>10} {'files':>7}  {'autotune fingerprint':24} parts"
    print(header)
    for s in states:
        mark = "*" if s.key == paths.build.key else " "
        files = sum(f for _, f in s.sizes.values())
        parts = ", ".join(f"{k} {human_bytes(b)}" for k, (b, _) in s.sizes.items() if b)
        fp = f"{s.fingerprint} ({s.autotune_records})"
        print(
            f"{mark} {s.key:40} {human_bytes(s.total_bytes):>10} {files:>7}  {fp:24} {parts or '-'}"
        )
    return 0


def run_fingerprint(args: argparse.Namespace) -> int:
    paths = _paths(args)
    key = args.build or paths.build.key
    build_dir = paths.base / caches.BUILDS / key
    fp, n = caches.fingerprint([build_dir / name for name, _ in caches.COMPONENTS])
    print(f"{fp} {key} records={n}")
    return 0


def run_clear(args: argparse.Namespace) -> int:
    paths = _paths(args)
    existing = [s.key for s in caches.list_builds(paths.base)]
    if args.all:
        keys = existing
    elif args.stale:
        keys = [k for k in existing if k != paths.build.key]
    elif args.build:
        keys = list(args.build)
    else:
        keys = [paths.build.key]
    if not (paths.base / caches.MARKER).is_file():
        if not paths.base.exists():
            print(f"nothing to clear: {paths.base} does not exist")
            return 0
        raise Qwen3090Error(
            f"{paths.base} is not a qwen3090 cache directory (no {caches.MARKER} marker); "
            "refusing to delete anything there",
            fix=f"point --cache-dir (or {caches.ENV_BASE}) at the directory qwen3090 serve uses",
        )
    if args.dry_run:
        for key in keys:
            print(f"would remove {paths.base / caches.BUILDS / key}")
        if args.include_hf:
            print(f"would remove {paths.base / 'huggingface'}")
        return 0
    removed = caches.clear_builds(paths.base, keys)
    if args.include_hf:
        removed += caches.clear_hf(paths.base)
    for path in removed:
        print(f"removed {path}")
    if not removed:
        print("nothing to clear")
    return 0
