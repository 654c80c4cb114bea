"""The single entry point ``qwen3090``: discovers the subcommands and runs one."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Callable, Sequence
from typing import cast

from qwen3090 import __version__, commands
from qwen3090.errors import Qwen3090Error


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qwen3090",
        description="Plan, check and serve Qwen3.8-27B on one RTX 3090 with vLLM 0.28.0.",
    )
    parser.add_argument("--version", action="version", version=f"qwen3090 {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func = cast(Callable[[argparse.Namespace], int], args.func)
    try:
        return int(func(args))
    except Qwen3090Error as err:
        print(err.render(), file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
