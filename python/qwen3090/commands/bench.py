"""`qwen3090 bench boot|quality|verbatim|residues|decode`: measurements that do not lie."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # The tool modules import only the stdlib and qwen3090; vLLM stays out of the CLI's import.
    from qwen3090.bench import boot, decode, quality, residues, verbatim

    parser = subparsers.add_parser(
        "bench",
        help="measure a live server: quality, verbatim, residues, decode; or the boot cache",
        description="Each tool prints a table and, with --out, writes JSON stamped with the "
        "build's series digest and the compile-cache fingerprint. bench/README.md says what "
        "each answers and which trap it avoids.",
    )
    sub = parser.add_subparsers(dest="bench_command", required=True, metavar="TOOL")
    for module in (boot, quality, verbatim, residues, decode):
        module.register(sub)
