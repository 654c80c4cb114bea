"""`bench boot`: what the persistent compile cache is worth, cold against warm, in one run.

Seeds/004: 181 s of a 217 s engine init was torch.compile when the cache was lost, 4 s when it
survived. This boots the same model with an empty cache base and again with the warm one,
several times each, interleaved so drift hits both arms alike, and prints the median
boot-to-/health, the engine's own "init engine ... took" and its compile seconds, and the
warm/cold ratios. It also reports whether vLLM's saved AOT artifact actually loaded on the warm
boot: a warm boot that logs "Compiling model again due to a load failure" only profits from
inductor's own cache (issue 8; fixed by patches/aot-cache-load.patch).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwen3090 import caches
from qwen3090.bench import report
from qwen3090.errors import Qwen3090Error
from qwen3090.localserver import start_server

INIT_RE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
COMPILE_RES = (
    re.compile(r"\(compilation: ([\d.]+) s\)"),
    re.compile(r"torch\.compile took ([\d.]+) s in total"),
)
LOAD_FAILURE = "Compiling model again due to a load failure"
AOT_LOADED = "Directly load AOT compilation"
AOT_SAVED = "saved AOT compiled function"
# The CPU platform compiles in DYNAMO_TRACE_ONCE mode, which logs no compile time; the span
# of its "Warming up model for the compilation" phase is the closest honest figure.
WARMUP_START = "Warming up model for the compilation"
WARMUP_DONE = "Warming up done"
STAMP_RE = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d)")


@dataclass(frozen=True)
class BootLog:
    init_s: float | None
    compile_s: float | None
    compile_source: str | None
    load_failure: bool
    aot_loaded: bool
    aot_saved: bool


def _stamp(line: str) -> dt.datetime | None:
    m = STAMP_RE.search(line)
    return dt.datetime.strptime(m.group(1), "%m-%d %H:%M:%S") if m else None


def parse_boot_log(text: str) -> BootLog:
    init = INIT_RE.findall(text)
    compile_s: float | None = None
    source: str | None = None
    for rx in COMPILE_RES:
        found = rx.findall(text)
        if found:
            compile_s, source = float(found[-1]), "engine"
            break
    if compile_s is None:
        start = done = None
        for line in text.splitlines():
            if WARMUP_START in line and start is None:
                start = _stamp(line)
            elif WARMUP_DONE in line and start is not None:
                done = _stamp(line)
        if start is not None and done is not None:
            compile_s, source = (done - start).total_seconds(), "cpu-warmup-span"
    return BootLog(
        init_s=float(init[-1]) if init else None,
        compile_s=compile_s,
        compile_source=source,
        load_failure=LOAD_FAILURE in text,
        aot_loaded=AOT_LOADED in text,
        aot_saved=AOT_SAVED in text,
    )


def ratio(warm: float | None, cold: float | None) -> float | None:
    return warm / cold if warm is not None and cold else None


def _tree_manifest(tree: Path | None) -> caches.BuildIdentity | None:
    if tree is None:
        return caches.find_manifest()
    from qwen3090.manifest import manifest_in_tree

    return manifest_in_tree(tree)


def _server_argv(args: argparse.Namespace, port: int) -> list[str]:
    extra = list(args.server_arg or [])
    if args.engine == "serve":
        serve = [
            sys.executable, "-m", "qwen3090", "serve", "--device", "cpu", "--no-gate",
            "--port", str(port), "--model", str(args.model_dir),
        ]  # fmt: skip
        return serve + extra
    direct = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(args.model_dir), "--served-model-name", "qwen3.8-27b",
        "--port", str(port), "--host", "127.0.0.1", "--max-model-len", str(args.max_model_len),
    ]  # fmt: skip
    return direct + extra


def boot_once(
    args: argparse.Namespace, cache_base: Path, env_extra: Mapping[str, str], log_path: Path
) -> tuple[float, BootLog]:
    env = dict(os.environ)
    env.update(env_extra)
    env.update(caches.cache_env(cache_base, _tree_manifest(args.vllm_tree), env))
    env[caches.ENV_BASE] = str(cache_base)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env["MODEL"] = str(args.model_dir)
    if args.vllm_tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(args.vllm_tree)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
    log_path.unlink(missing_ok=True)
    with start_server(_server_argv(args, args.port), env, args.port, log_path) as server:
        # A fine poll: boot-to-health is the figure this benchmark exists for.
        health = server.wait_healthy(args.timeout, poll_s=0.2)
    return health, parse_boot_log(log_path.read_text(errors="replace"))


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("boot", help="boot-to-health with an empty compile cache against a warm one")
    p.add_argument(
        "--model-dir",
        type=Path,
        default=Path(os.environ["MODEL"]) if os.environ.get("MODEL") else None,
        help="model to boot (default: $MODEL; the demo model on the CPU tier)",
    )
    p.add_argument("--cold", type=int, default=2, help="boots with an empty cache base")
    p.add_argument("--warm", type=int, default=2, help="boots reusing the first cold boot's cache")
    p.add_argument("--port", type=int, default=18020)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to /health per boot")
    p.add_argument(
        "--engine",
        choices=("serve", "vllm"),
        default="serve",
        help="serve: `qwen3090 serve --device cpu`; vllm: vLLM's API server directly",
    )
    p.add_argument("--max-model-len", type=int, default=2048, help="--engine vllm only")
    p.add_argument(
        "--server-arg",
        action="append",
        default=None,
        metavar="ARG",
        help="one more argument for the server command (repeat; write --server-arg=--flag)",
    )
    p.add_argument(
        "--vllm-tree",
        type=Path,
        default=None,
        help="a (patched) tree containing vllm/ to put first on PYTHONPATH",
    )
    p.add_argument("--work-dir", type=Path, default=None, help="keep caches and logs here")
    p.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    p.add_argument("--cache-dir", type=Path, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.model_dir is None or not (args.model_dir / "config.json").is_file():
        raise Qwen3090Error(
            "no model to boot", fix="give --model-dir DIR (e.g. `qwen3090 demo-model DIR`)"
        )
    if args.cold < 1 or args.warm < 1:
        raise Qwen3090Error(
            f"need at least one cold and one warm boot (--cold {args.cold}, --warm {args.warm})",
            fix="pass --cold N and --warm N of 1 or more",
        )
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="qwen3090-bootbench-"))
    work.mkdir(parents=True, exist_ok=True)
    warm_base = work / "cold-1"
    plan: list[tuple[str, int, Path]] = [("cold", 1, warm_base)]
    for i in range(1, max(args.cold, args.warm + 1)):
        if i <= args.warm:
            plan.append(("warm", i, warm_base))
        if i + 1 <= args.cold:
            plan.append(("cold", i + 1, work / f"cold-{i + 1}"))
    rows: list[dict[str, Any]] = []
    for kind, i, base in plan:
        if kind == "cold" and base.exists():
            shutil.rmtree(base)
        log = work / f"{kind}-{i}.log"
        health, parsed = boot_once(args, base, {}, log)
        build_dir = caches.resolve(base, _tree_manifest(args.vllm_tree)).build_dir
        size, files = caches.dir_size(build_dir)
        row = {
            "kind": kind,
            "i": i,
            "health_s": round(health, 2),
            "init_s": parsed.init_s,
            "compile_s": parsed.compile_s,
            "compile_from": parsed.compile_source,
            "aot_loaded": parsed.aot_loaded,
            "load_failure": parsed.load_failure,
            "cache_mib": round(size / 2**20, 1),
            "cache_files": files,
            "log": str(log),
        }
        print(report.format_table([row], [c for c in row if c != "log"]).splitlines()[-1])
        if kind == "cold" and files == 0:
            raise Qwen3090Error(
                f"the cold boot wrote nothing under {build_dir}: the server ignored the cache "
                "environment, so warm and cold would measure the same thing",
                fix="check that the serve path passes VLLM_CACHE_ROOT & co through",
            )
        rows.append(row)

    def med(kind: str, key: str) -> float | None:
        return report.finite_median([r[key] for r in rows if r["kind"] == kind])

    summary: dict[str, Any] = {}
    for key in ("health_s", "init_s", "compile_s"):
        cold, warm = med("cold", key), med("warm", key)
        summary[key] = {"cold": cold, "warm": warm, "warm_over_cold": ratio(warm, cold)}
    summary["warm_load_failures"] = sum(
        1 for r in rows if r["kind"] == "warm" and r["load_failure"]
    )
    health_ratio = summary["health_s"]["warm_over_cold"]
    summary["target_met"] = bool(
        health_ratio is not None and health_ratio <= 0.40 and summary["warm_load_failures"] == 0
    )
    print()
    print(report.format_table(rows, [c for c in rows[0] if c != "log"]))
    print()
    table = [
        {"metric": key, **{k: v for k, v in summary[key].items()}}
        for key in ("health_s", "init_s", "compile_s")
    ]
    print(report.format_table(table, ["metric", "cold", "warm", "warm_over_cold"]))
    print(
        f"target warm/cold boot-to-health <= 0.40 and no AOT load failure on a warm boot: "
        f"{'met' if summary['target_met'] else 'MISSED'} (ratio {health_ratio}, "
        f"{summary['warm_load_failures']} warm load failures)"
    )
    params = {
        "cold": args.cold,
        "warm": args.warm,
        "engine": args.engine,
        "vllm_tree": str(args.vllm_tree) if args.vllm_tree else None,
        "work_dir": str(work),
    }
    args.cache_dir = warm_base
    report.write_report(
        args.out, "boot", args, params, rows, summary, _tree_manifest(args.vllm_tree)
    )
    return 0
