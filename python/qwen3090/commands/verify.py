"""``qwen3090 verify patches``: report, per patch, whether a vLLM tree carries it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="verify what a vLLM tree carries",
        description="Verify a vLLM tree against the qwen3090 patch series.",
    )
    what = parser.add_subparsers(dest="verify_what", required=True, metavar="WHAT")
    patches = what.add_parser(
        "patches",
        help="per patch: applied / partial / not-applied / not-applicable",
        description=(
            "Check every patch of the series: its edits by exact reverse dry-run (GNU patch, "
            "fuzz 0, no offset), the files it adds (patches/overlay/) byte for byte; patches "
            "sharing a file with later ones are also judged with those later patches undone. "
            "Exit status 0 only when every patch is applied."
        ),
    )
    patches.add_argument(
        "--vllm-root",
        type=Path,
        default=None,
        help="directory containing vllm/ (default: the vLLM this Python imports, found "
        "without importing it)",
    )
    patches.add_argument(
        "--patches",
        type=Path,
        default=None,
        help="directory with series, *.patch and overlay/ (default: the copy stored in the "
        "tree's vllm/_qwen3090/ by the apply tool)",
    )
    patches.add_argument("--json", action="store_true", help="machine-readable report")
    patches.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from qwen3090 import patchtool
    from qwen3090.verify import verify_patches

    report = verify_patches(args.vllm_root, args.patches)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(patchtool.format_report(report))
    return 0 if report.ok else 1
