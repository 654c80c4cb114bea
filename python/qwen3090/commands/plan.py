"""``qwen3090 plan``: print the ServePlan for the knobs given, touching no GPU and no model."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from qwen3090.capabilities import Capabilities
from qwen3090.plan import PlatformFacts, ServePlan

PRECEDENCE = (
    "Knob precedence, lowest first: the profile's default < the --config YAML file < the "
    "environment variable (SPEC=dflash2 ...) < the command-line flag (--spec dflash2). YAML keys "
    "are the knob names, upper or lower case (SPEC: dflash2, profile: batch, port: 18020)."
)


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments ``plan`` and ``serve`` share."""
    from qwen3090.knobs import add_knob_arguments

    parser.add_argument(
        "--config", type=Path, metavar="FILE",
        help="YAML settings file of knob names and values (what the NixOS module renders)",
    )
    parser.add_argument(
        "--manifest", type=Path, metavar="FILE",
        help="plan against this build manifest instead of the installed vLLM's",
    )
    add_knob_arguments(parser)


def capabilities_from(args: argparse.Namespace) -> Capabilities:
    from qwen3090 import capabilities

    if args.manifest is None:
        return capabilities.from_installed()
    from qwen3090.manifest import load_manifest

    m = load_manifest(args.manifest)
    return Capabilities(
        env=m.provided_env, flags=m.provided_flags, features=m.provided_features,
        patches=m.patch_names, source=f"the manifest {args.manifest}",
    )


def detect_facts() -> PlatformFacts:
    wsl2 = False
    try:
        from qwen3090.wsl import detect_wsl

        wsl2 = detect_wsl().is_wsl2
    except ImportError:
        pass
    return PlatformFacts(wsl2=wsl2, api_key_env=bool(os.environ.get("VLLM_API_KEY")))


def plan_from_args(args: argparse.Namespace) -> tuple[ServePlan, Capabilities]:
    """Settings from every source, resolved into the plan (with the command serve would exec)."""
    from qwen3090.knobs import cli_values, load_settings
    from qwen3090.plan import resolve

    settings = load_settings(config=args.config, environ=os.environ, cli=cli_values(args))
    caps = capabilities_from(args)
    return resolve(settings, caps, detect_facts()), caps


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "plan",
        help="print the serving plan (vLLM arguments, environment, warnings) without starting",
        description="Resolve the knobs into the plan `qwen3090 serve` would run, and print it. "
        "Touches no GPU and reads no model (it only looks for the default model directories). "
        "An invalid combination exits non-zero with "
        "the reason and the fix, and prints no plan. " + PRECEDENCE,
    )
    add_plan_arguments(p)
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from qwen3090.plan import describe

    plan, _ = plan_from_args(args)
    print(plan.to_json() if args.json else describe(plan))
    sys.stdout.flush()
    return 0
