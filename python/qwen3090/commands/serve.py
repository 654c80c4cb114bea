"""``qwen3090 serve``: resolve the plan, run the pre-flight checks, then become vLLM (exec)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qwen3090.gate import GatePolicy


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from qwen3090 import gate
    from qwen3090.commands.plan import PRECEDENCE, add_plan_arguments

    p = subparsers.add_parser(
        "serve",
        help="serve the model: plan, check, then exec vLLM (signals and exit code pass through)",
        description="Resolve the knobs exactly like `qwen3090 plan`, check the model "
        "directories and (on CUDA) wait for a free GPU, then replace this process with vLLM. "
        + PRECEDENCE,
    )
    add_plan_arguments(p)
    p.add_argument(
        "--no-gate", action="store_true",
        help="skip the GPU-free gate (the card is known to be free)",
    )
    # serve is the one owner of the gate (the NixOS unit passes its gpuGate options here), so
    # its policy is set on serve's command line, not by a separate `qwen3090 gate` run.
    p.add_argument(
        "--gate-threshold-mib", type=_non_negative_int, default=gate.DEFAULT_THRESHOLD_MIB,
        metavar="MIB",
        help="GPU gate: used memory below this counts as free (default %(default)s)",
    )
    p.add_argument(
        "--gate-timeout", type=_positive_float, default=gate.DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="GPU gate: give up after this many seconds, naming who holds the card "
        "(default %(default)g)",
    )
    p.add_argument(
        "--load-streamer", choices=("auto", "on", "off"), default="auto",
        help="load the weights through the Run:ai streamer: auto = when the available RAM is "
        "below the checkpoint plus the engine's own needs (gotcha 41)",
    )
    p.add_argument(
        "--dry-run", action="store_true",
        help="run the checks and print the command, but do not exec it",
    )
    p.set_defaults(func=run)


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return value


def gate_policy(args: argparse.Namespace) -> GatePolicy | None:
    """The gate serve runs before exec'ing vLLM, from its flags; None with --no-gate."""
    from qwen3090 import gate

    if args.no_gate:
        return None
    return gate.default_policy(
        threshold_mib=args.gate_threshold_mib, timeout_s=args.gate_timeout
    )


def run(args: argparse.Namespace) -> int:
    import os
    from dataclasses import replace

    from qwen3090.commands.plan import capabilities_from, detect_facts
    from qwen3090.knobs import cli_values, load_settings
    from qwen3090.plan import describe, resolve
    from qwen3090.serve import check_environment, check_models, exec_plan, with_loader

    settings = load_settings(config=args.config, environ=os.environ, cli=cli_values(args))
    caps = capabilities_from(args)
    facts = detect_facts()
    plan = resolve(settings, caps, facts)
    if args.dry_run:
        check_environment(plan, caps, os.environ)
        check_models(plan, caps)
        plan, reason = with_loader(plan, caps, args.load_streamer)
        print(describe(plan))
        if reason:
            print(f"loader: {reason}")
        return 0
    exec_plan(
        plan, caps, gate=gate_policy(args), loader=args.load_streamer,
        # The gate measures the card; the plan is resolved again with that reading.
        replan=lambda used_mib: resolve(settings, caps, replace(facts, foreign_gpu_mib=used_mib)),
    )
    return 0  # not reached: exec replaced this process
