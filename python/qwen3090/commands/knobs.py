"""``qwen3090 knobs``: the knob vocabulary, derived from the Settings declarations."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "knobs",
        help="list the serving knobs (name, flag, type, allowed values, help)",
        description="Print every knob `plan` and `serve` accept, as flags, environment "
        "variables and --config YAML keys. With --json: one JSON list, what the NixOS module's "
        "option types are checked against.",
    )
    p.add_argument("--json", action="store_true", help="print the knobs as one JSON list")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from qwen3090.knobs import export, export_json

    if args.json:
        print(export_json())
    else:
        for k in export():
            values = f" {{{','.join(repr(c) for c in k['choices'])}}}" if k["choices"] else ""
            where = "flag, env, yaml" if k["env"] else "flag, yaml"
            print(f"{k['name']} ({k['flag']}; {where}) {k['type']}{values}: {k['help']}")
    sys.stdout.flush()
    return 0
