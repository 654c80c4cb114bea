"""Install the pinned vLLM wheel with the patch series applied: nix/vllm.nix's installPhase,
and what the nix-replay tier runs on the same wheel outside Nix.

    python vllm.py install --wheel WHEEL --site DIR --series-src DIR [--jobs N]

--series-src holds python/qwen3090/patchtool.py and patches/; `patch` must be on PATH.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path


def install(wheel: Path, site: Path, series_src: Path, jobs: int) -> None:
    site.mkdir(parents=True, exist_ok=True)
    # A wheel has no source tree for `patches = [ ... ]`: unpack it where it will live, so
    # the pycs patchtool writes name the real paths.
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    subprocess.run(
        [sys.executable, str(series_src / "python" / "qwen3090" / "patchtool.py"), "apply",
         "--root", str(site), "--patches", str(series_src / "patches"), "--jobs", str(jobs)],
        check=True,
    )
    # The wheel's RECORD lists the unpatched hashes; nothing may "verify" against it.
    for record in site.glob("vllm-*.dist-info/RECORD"):
        record.unlink()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    inst = sub.add_parser("install")
    inst.add_argument("--wheel", type=Path, required=True)
    inst.add_argument("--site", type=Path, required=True)
    inst.add_argument("--series-src", type=Path, required=True)
    inst.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    install(args.wheel, args.site, args.series_src, args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
