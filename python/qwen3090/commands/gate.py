"""``qwen3090 gate``: wait until the GPU is free and stable (gotcha 2), or say who holds it."""

from __future__ import annotations

import argparse
import sys

from qwen3090 import gate
from qwen3090.gpuprobe import GpuSample


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "gate",
        help="wait until the GPU is free before vLLM profiles its memory",
        description=(
            "Wait until the GPU's used memory is under a threshold and no foreign compute "
            "process holds it, for N consecutive samples; on timeout, exit non-zero naming "
            "each holder (pid, name, MiB). NVML first, nvidia-smi when NVML is absent."
        ),
    )
    p.add_argument(
        "--threshold-mib", type=int, default=gate.DEFAULT_THRESHOLD_MIB,
        help="used memory below this counts as free (default %(default)s: room for a desktop)",
    )
    p.add_argument(
        "--samples", type=int, default=gate.DEFAULT_SAMPLES,
        help="consecutive free samples required (default %(default)s)",
    )
    p.add_argument(
        "--interval", type=float, default=gate.DEFAULT_INTERVAL_S,
        help="seconds between samples (default %(default)s)",
    )
    p.add_argument(
        "--timeout", type=float, default=gate.DEFAULT_TIMEOUT_S,
        help="give up after this many seconds (default %(default)s)",
    )
    p.add_argument("--device-index", type=int, default=0, help="NVML/nvidia-smi GPU index")
    p.add_argument(
        "--kv-mem-pinned", action="store_true",
        help="the plan pins the KV pool in bytes (KV_MEM): warn if the card drives a display",
    )
    p.add_argument(
        "--plan-device", choices=("cuda", "cpu"), default="cuda",
        help="with cpu, a machine without an NVIDIA GPU passes (default %(default)s)",
    )
    p.add_argument(
        "--source", choices=("auto", "nvml", "nvidia-smi"), default="auto",
        help="where readings come from (default: NVML, else nvidia-smi)",
    )
    p.add_argument("--quiet", action="store_true", help="print only the verdict")
    p.set_defaults(func=run)


class _Narrator:
    """Prints a line whenever the card's state changes, so a long wait is not silent."""

    def __init__(self, policy: gate.GatePolicy, quiet: bool) -> None:
        self.policy = policy
        self.quiet = quiet
        self.last_reason: str | None = None

    def __call__(self, sample: GpuSample) -> None:
        reason = gate.busy_reason(sample, self.policy)
        if not self.quiet and reason != self.last_reason:
            state = f"busy: {reason}" if reason else "free, confirming"
            print(f"gate: GPU {sample.index}: {state}", file=sys.stderr, flush=True)
        self.last_reason = reason


def run(args: argparse.Namespace) -> int:
    policy = gate.default_policy(args.threshold_mib, args.samples, args.interval, args.timeout)
    report = gate.run_gate(
        policy,
        device_index=args.device_index,
        kv_mem_pinned=args.kv_mem_pinned,
        plan_device=args.plan_device,
        prefer=args.source,
        on_sample=_Narrator(policy, args.quiet),
        cli=gate.GATE_CLI,
    )
    for warning in report.warnings:
        print(f"qwen3090: warning: {warning}", file=sys.stderr)
    print(report.summary, flush=True)
    return 0
