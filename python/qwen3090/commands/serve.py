"""``qwen3090 serve``: resolve the plan, run the pre-flight checks, then become vLLM (exec)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def run(args: argparse.Namespace) -> int:
    from qwen3090.commands.plan import plan_from_args
    from qwen3090.plan import describe
    from qwen3090.serve import check_models, exec_plan, with_loader

    plan, caps = plan_from_args(args)
    if args.dry_run:
        check_models(plan, caps)
        plan, reason = with_loader(plan, caps, args.load_streamer)
        print(describe(plan))
        if reason:
            print(f"loader: {reason}")
        return 0
    exec_plan(plan, caps, gate=not args.no_gate, loader=args.load_streamer)
    return 0  # not reached: exec replaced this process
