"""Install the pinned wheels of the Python closure into one prefix: nix/python-closure.nix's
installPhase, and what the nix-replay tier runs on the same wheels outside Nix.

    python closure.py install --prefix DIR --decisions decisions.json [--jobs N] WHEEL...

Needs the `installer` library (nixpkgs: python.pkgs.installer on PYTHONPATH; the replay: the
PyPI wheel) and nothing else beyond the standard library. It fails, naming every file and
wheel, when two wheels would install the same file and decisions.json does not say which
copy goes; stale decisions fail too, so the list cannot rot.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import subprocess
import sys
import sysconfig
import venv
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

SCHEME_NAMES = ("purelib", "platlib", "headers", "scripts", "data")


class BuildError(Exception):
    """A build step refused its input; the message says what and how to fix it."""


def scheme_dict(prefix: Path, distribution: str) -> dict[str, str]:
    """Where each wheel scheme goes under ``prefix`` (`python -m installer --prefix`'s rule)."""
    paths = sysconfig.get_paths(vars={"base": str(prefix), "platbase": str(prefix)})
    scheme = {name: paths[name] for name in ("purelib", "platlib", "scripts", "data")}
    include = sysconfig.get_path("include", vars={"installed_base": str(prefix)})
    scheme["headers"] = os.path.join(include, distribution)
    return scheme


def wheel_targets(source: Any, scheme: Mapping[str, str], root_is_purelib: bool) -> list[str]:
    """Every file ``source`` installs, as absolute paths (RECORD order)."""
    from installer.records import parse_record_file

    data_dir = source.data_dir
    targets = []
    for path, _hash, _size in parse_record_file(source.read_dist_info("RECORD").splitlines()):
        if path.startswith(data_dir + "/"):
            scheme_name, _, rest = path[len(data_dir) + 1 :].partition("/")
            base = scheme[scheme_name]
        else:
            rest = path
            base = scheme["purelib" if root_is_purelib else "platlib"]
        targets.append(posixpath.normpath(os.path.join(base, rest)))
    return targets


def find_collisions(installs: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Target path -> the distributions installing it, for paths more than one installs."""
    owners: dict[str, list[str]] = {}
    for dist, targets in installs.items():
        for target in targets:
            owners.setdefault(target, []).append(dist)
    return {path: dists for path, dists in owners.items() if len(dists) > 1}


def check_collisions(
    collisions: Mapping[str, Sequence[str]], decided: Mapping[str, Any], site: str,
    installed: set[str],
) -> dict[str, set[str]]:
    """Distribution -> paths (relative to site-packages) to leave out; raises on anything
    undecided or on a decision that no longer matches a collision."""
    relative = {
        os.path.relpath(path, site) if path.startswith(site + "/") else path: sorted(dists)
        for path, dists in collisions.items()
    }
    problems = []
    drops: dict[str, set[str]] = {}
    for path, dists in sorted(relative.items()):
        decision = decided.get(path)
        if decision is None:
            problems.append(f"{path}: installed by {', '.join(dists)}")
            continue
        if sorted(decision["drop"]) != dists:
            problems.append(
                f"{path}: installed by {', '.join(dists)}, but decisions.json drops it from "
                f"{', '.join(sorted(decision['drop']))}"
            )
        for dist in decision["drop"]:
            drops.setdefault(dist, set()).add(path)
    for path in sorted(set(decided) - set(relative) - {"_comment"}):
        # Stale only where every wheel it names is installed here (the `test` wheel set of
        # checks.python-tests holds none of them).
        if set(decided[path]["drop"]) <= installed:
            problems.append(f"{path}: decided in decisions.json but no two wheels install it")
    if problems:
        raise BuildError(
            "wheels of the closure collide:\n  "
            + "\n  ".join(problems)
            + "\nfix: leave one wheel out in nix/closure/lock2table.py's EXCLUDED, or say in "
            "nix/build/decisions.json (collisions) which copies to drop and why"
        )
    return drops


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def install(prefix: Path, wheels: Sequence[Path], decisions: Mapping[str, Any], jobs: int,
            compile_bytecode: bool = True) -> None:
    from installer import install as install_wheel
    from installer.destinations import SchemeDictionaryDestination
    from installer.sources import WheelFile
    from installer.utils import parse_metadata_file

    venv.EnvBuilder(with_pip=False, symlinks=True).create(prefix)
    interpreter = str(prefix / "bin" / "python")
    with ExitStack() as stack:
        sources = [stack.enter_context(WheelFile.open(w)) for w in wheels]
        schemes = {}
        installs: dict[str, list[str]] = {}
        for source in sources:
            dist = canonical(source.distribution)
            schemes[dist] = scheme_dict(prefix, source.distribution)
            wheel_meta = parse_metadata_file(source.read_dist_info("WHEEL"))
            purelib = wheel_meta.get("Root-Is-Purelib", "false").strip().lower() == "true"
            installs[dist] = wheel_targets(source, schemes[dist], purelib)
        site = posixpath.normpath(next(iter(schemes.values()))["purelib"])
        drops = check_collisions(find_collisions(installs), decisions.get("collisions", {}), site,
                                 set(installs))
        for n, source in enumerate(sources, 1):
            dist = canonical(source.distribution)
            print(f"[{n}/{len(sources)}] {source.distribution} {source.version}", flush=True)
            destination = SchemeDictionaryDestination(
                scheme_dict=schemes[dist],
                interpreter=interpreter,
                script_kind="posix",
                bytecode_optimization_levels=(),
            )
            install_wheel(_Without(source, drops.get(dist, set())), destination, {})
    if compile_bytecode:
        # Hash-checked pycs: a store path's mtime says nothing (gotcha 22). Some wheels ship
        # sources for other Python versions or templates named *.py; compileall reports them
        # and they stay uncompiled, as pip leaves them.
        proc = subprocess.run(
            [interpreter, "-m", "compileall", "-q", "-j", str(jobs),
             "--invalidation-mode", "checked-hash", site],
            check=False,
        )
        if proc.returncode != 0:
            print("compileall: some files did not compile (listed above); left as sources")


class _Without:
    """A wheel source minus some files (relative to the root scheme), for dropped collisions."""

    def __init__(self, source: Any, dropped: set[str]) -> None:
        self._source = source
        self._dropped = dropped

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    def get_contents(self) -> Iterator[Any]:
        for element in self._source.get_contents():
            if element[0][0] not in self._dropped:
                yield element


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    inst = sub.add_parser("install", help="install the wheels into a new venv at --prefix")
    inst.add_argument("--prefix", type=Path, required=True)
    inst.add_argument("--decisions", type=Path, required=True)
    inst.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    inst.add_argument("--no-compile", action="store_true", help="skip byte-compiling")
    inst.add_argument("wheels", type=Path, nargs="+")
    args = parser.parse_args(argv)
    decisions = json.loads(args.decisions.read_text())
    try:
        install(args.prefix, args.wheels, decisions, args.jobs, not args.no_compile)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
