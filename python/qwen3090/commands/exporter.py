"""``qwen3090 exporter``: a Prometheus exporter with a chat canary for one vLLM server."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from qwen3090 import metricnames
from qwen3090.apikey import API_KEY_ENV, api_key
from qwen3090.errors import Qwen3090Error


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "exporter",
        help="export a chat canary, /health agreement, build info and boot facts",
        description=(
            "Send a small real chat request to a vLLM server every interval and export its "
            "success, TTFT, latency and decode rate (usage.completion_tokens / (wall - ttft)), "
            "whether /health agrees with it, the build's vLLM version and patch series digest, "
            "and the boot facts of the server log, on a Prometheus /metrics endpoint."
        ),
    )
    p.add_argument(
        "--server",
        "--vllm-url",
        default=f"http://127.0.0.1:{metricnames.DEFAULT_SERVER_PORT}",
        help="base URL of the vLLM server (default: %(default)s)",
    )
    p.add_argument(
        "--api-key-file",
        type=Path,
        help=f"file holding the server's API key (default: ${API_KEY_ENV}, else no key)",
    )
    p.add_argument(
        "--interval", type=float, default=30.0, help="seconds between canaries (default: 30)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds after which a canary request has failed (default: the interval, at most 60)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=metricnames.DEFAULT_EXPORTER_PORT,
        help="port of the exporter's /metrics (default: %(default)s)",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    p.add_argument("--server-log", type=Path, help="the vLLM server's log file, for the boot facts")
    p.add_argument(
        "--manifest",
        type=Path,
        help="build manifest to report (default: the one of the installed vLLM, if any)",
    )
    p.add_argument("--model", help="served model name (default: asked from /v1/models)")
    p.add_argument(
        "--max-tokens", type=int, default=16, help="tokens each canary generates (default: 16)"
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="run one canary, print the metrics in the exposition format and exit "
        "(0 if the canary succeeded)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from prometheus_client import generate_latest, start_http_server

    from qwen3090.exporter import Exporter, ExporterConfig

    if args.interval <= 0:
        raise Qwen3090Error("--interval must be positive", fix="e.g. --interval 30")
    timeout = args.timeout if args.timeout is not None else min(args.interval, 60.0)
    if timeout <= 0:
        raise Qwen3090Error("--timeout must be positive", fix="e.g. --timeout 30")
    if not args.server.startswith(("http://", "https://")):
        raise Qwen3090Error(
            f"--server {args.server!r} is not an http(s) URL", fix="e.g. http://127.0.0.1:18020"
        )
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = ExporterConfig(
        server=args.server.rstrip("/"),
        api_key=api_key(args.api_key_file, "--api-key-file"),
        interval_s=args.interval,
        timeout_s=timeout,
        model=args.model,
        max_tokens=args.max_tokens,
        server_log=args.server_log,
        manifest=args.manifest,
    )
    exporter = Exporter(config)
    if args.once:
        _, result = exporter.probe_once()
        sys.stdout.write(generate_latest(exporter.registry).decode("utf-8"))
        return 0 if result.ok else 1
    try:
        httpd, _ = start_http_server(args.port, addr=args.host, registry=exporter.registry)
    except OSError as err:
        raise Qwen3090Error(
            f"cannot listen on {args.host}:{args.port}: {err.strerror}",
            fix="choose a free port with --port",
        ) from err
    logging.getLogger("qwen3090.exporter").info(
        "serving /metrics on http://%s:%d/metrics; canary every %.1f s against %s",
        args.host,
        args.port,
        config.interval_s,
        config.server,
    )
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        exporter.run(stop)
    finally:
        httpd.shutdown()
    return 0
