"""``qwen3090 fetch``: download the pinned checkpoints, then check them; a no-op when done."""

from __future__ import annotations

import argparse
from pathlib import Path

from qwen3090.errors import Qwen3090Error


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from qwen3090.pins import MODELS_DIR_ENV, models_dir

    p = subparsers.add_parser(
        "fetch",
        help="download the pinned model checkpoints (resumable; no-op when complete)",
        description=(
            "Download the named targets of the pins file's 'models' section (default: the "
            "default ones) with huggingface_hub, then run the model check on each. A complete "
            "directory makes no network call; HF_HUB_OFFLINE=1 or --offline only checks."
        ),
    )
    p.add_argument("targets", nargs="*", metavar="TARGET", help="target names (see --list)")
    p.add_argument(
        "--dest", type=Path,
        default=models_dir(),
        help=f"directory holding the model dirs (default: ${MODELS_DIR_ENV} or models)",
    )
    p.add_argument("--offline", action="store_true", help="never download; only check")
    p.add_argument(
        "--revision", action="append", default=[], metavar="TARGET=REV",
        help="use this revision for TARGET (required where the pins file pins none)",
    )
    p.add_argument("--list", action="store_true", help="list the targets and exit")
    p.set_defaults(func=run)


def _revisions(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, rev = pair.partition("=")
        if not sep or not name or not rev:
            raise Qwen3090Error(
                f"--revision wants TARGET=REV, not {pair!r}",
                fix="e.g. --revision base=<commit sha>; `qwen3090 fetch --list` names the targets",
            )
        out[name] = rev
    return out


def run(args: argparse.Namespace) -> int:
    from qwen3090.fetch import fetch_order, fetch_target
    from qwen3090.pins import load_targets

    targets = load_targets()
    if args.list:
        for t in targets.values():
            rev = t.revision or "(no pinned revision)"
            flags = ", ".join(
                f for f in ("default" if t.default else "optional", t.role,
                            f"overlay on {t.link_from}" if t.link_from else "") if f
            )
            print(f"{t.name}: {t.repo} @ {rev} -> {args.dest / t.dir} [{flags}]")
            if t.note:
                print(f"    {t.note}")
        return 0
    revisions = _revisions(args.revision)
    for target in fetch_order(args.targets, targets):
        result = fetch_target(
            target, args.dest, targets, offline=args.offline, revision=revisions.get(target.name)
        )
        state = "downloaded and checked" if result.downloaded else "already complete"
        print(f"{result.target}: {result.path}: {state}")
    return 0
