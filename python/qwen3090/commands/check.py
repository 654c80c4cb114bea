"""``qwen3090 check model DIR...``: the completeness check serve runs before vLLM starts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qwen3090.pins import ROLES


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "check",
        help="check that a model directory can be served",
        description="Checks that catch, before vLLM starts, what vLLM reports late or wrongly.",
    )
    what = p.add_subparsers(dest="check_what", required=True, metavar="WHAT")
    model = what.add_parser(
        "model",
        help="config, every shard, tokenizer (encodes <think>), no 'dflash' in a target path, "
        "prepared outputs still match their manifest",
    )
    model.add_argument("dirs", nargs="+", type=Path, metavar="DIR")
    model.add_argument(
        "--role", choices=ROLES, default="target",
        help="target: the served model (needs a tokenizer); draft: a drafter (default %(default)s)",
    )
    model.set_defaults(func=run_model)


def run_model(args: argparse.Namespace) -> int:
    from qwen3090.modelcheck import check_model_dir, prepared_steps

    failed = 0
    for directory in args.dirs:
        problems = check_model_dir(directory, args.role)
        if problems:
            failed += 1
            for problem in problems:
                print(f"FAIL {problem}", file=sys.stderr)
        else:
            steps = prepared_steps(directory)
            state = f"prepared: {', '.join(steps)}" if steps else "raw: not prepared"
            print(f"ok   {directory} ({args.role}) {state}")
    return 1 if failed else 0
