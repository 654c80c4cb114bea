"""Turn ``uv.lock`` into ``table.json``: the wheel pin table nix/python-env.nix reads.

Why a generated table rather than uv2nix: uv2nix and pyproject-nix are two more flake inputs
whose revisions and narHashes would have to be pinned and trusted, and they resolve the lock
inside Nix evaluation, which is slow for ~200 wheels and hard to review. The deployment needs
far less: for the one Python nixpkgs calls ``python3``, the exact list of wheels (URL +
sha256) to install side by side into one prefix. This script does the marker evaluation and
wheel-tag choice once, here, with the same ``packaging`` rules pip uses; Nix only reads JSON.

Usage (from the repository root, after editing nix/closure/pyproject.toml)::

    (cd nix/closure && UV_PYTHON_DOWNLOADS=never uv lock)
    python3 nix/closure/lock2table.py            # rewrites nix/closure/table.json
    python3 nix/closure/lock2table.py --check    # exit 1 when table.json is stale

Needs ``packaging`` (any recent release) besides the standard library.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging import tags
from packaging.markers import Marker
from packaging.utils import parse_wheel_filename

HERE = Path(__file__).resolve().parent
ROOT_NAME = "qwen3090-closure"
# Every CPython minor release the lock covers (pyproject's requires-python).
PYTHONS = ("3.11", "3.12", "3.13", "3.14")
# nixpkgs' glibc is far newer than any manylinux baseline a wheel asks for; 2.40 is the
# oldest glibc a nixos-unstable of 2026 ships, so every manylinux_2_X with X <= 40 loads.
GLIBC_MAX_MINOR = 40

# Packages the text-only server never imports, left out of every wheel set (and so are their
# own dependencies, unless something kept needs them). Each was checked against vLLM 0.28.0's
# sources: vLLM imports them lazily, behind try/except or inside the code path that needs them.
# Each one removed also removes native dependencies the closure would otherwise have to
# provide or ignore, and files that collide with other wheels.
EXCLUDED: dict[str, str] = {
    "torchcodec": (
        "video/audio decoding for multimodal inputs (vllm/multimodal/video.py imports it in a "
        "try/except); links FFmpeg 4-8 and libheif, which the closure does not carry"
    ),
    "pynvvideocodec": (
        "NVIDIA hardware video decoding, imported only inside "
        "vllm/multimodal/video.py's PyNvVideoCodec decode function"
    ),
    "torchaudio": (
        "audio preprocessing of ASR/omni models (processors and model files vLLM loads by "
        "name only for those architectures); its 2.11 wheel is built for another torch"
    ),
    "tokenspeed-mla": (
        "MLA attention kernels (DeepSeek-style latent attention) behind an import check in "
        "vllm/v1/attention/backends/mla/; Qwen3.8 has no MLA layers. It alone pulls "
        "tokenspeed-triton, a second Triton"
    ),
}


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    file: str
    url: str
    hash: str  # SRI form, what fetchurl's `hash` takes

    def as_json(self) -> dict[str, str]:
        return {
            "name": self.name,
            "version": self.version,
            "file": self.file,
            "url": self.url,
            "hash": self.hash,
        }


def marker_env(python: str) -> dict[str, str]:
    """The PEP 508 environment of CPython ``python`` on x86_64 Linux."""
    return {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_name": "cpython",
        "implementation_version": f"{python}.0",
        "platform_python_implementation": "CPython",
        "platform_machine": "x86_64",
        "platform_system": "Linux",
        "platform_release": "",
        "platform_version": "",
        "sys_platform": "linux",
        "os_name": "posix",
        "extra": "",
    }


def supported_tags(python: str) -> list[tags.Tag]:
    """Wheel tags CPython ``python`` on glibc x86_64 accepts, best first (pip's order)."""
    major, minor = (int(part) for part in python.split("."))
    platforms = [f"manylinux_2_{m}_x86_64" for m in range(GLIBC_MAX_MINOR, 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    platforms.append("linux_x86_64")
    interpreter = f"cp{major}{minor}"
    return [
        *tags.cpython_tags((major, minor), abis=[interpreter], platforms=platforms),
        *tags.compatible_tags((major, minor), interpreter=interpreter, platforms=platforms),
    ]


def sri(hash_field: str) -> str:
    algo, _, hexdigest = hash_field.partition(":")
    if algo != "sha256" or len(hexdigest) != 64:
        raise ValueError(f"unexpected hash {hash_field!r} in uv.lock")
    return "sha256-" + base64.b64encode(bytes.fromhex(hexdigest)).decode()


def marker_holds(marker: str | None, env: Mapping[str, str]) -> bool:
    return marker is None or Marker(marker).evaluate(dict(env))


class Lock:
    def __init__(self, data: Mapping[str, Any]) -> None:
        self.by_name: dict[str, list[Mapping[str, Any]]] = {}
        for package in data["package"]:
            self.by_name.setdefault(package["name"], []).append(package)

    def find(self, dep: Mapping[str, Any], env: Mapping[str, str]) -> Mapping[str, Any]:
        candidates = self.by_name[dep["name"]]
        if "version" in dep:
            candidates = [p for p in candidates if p["version"] == dep["version"]]
        if len(candidates) > 1:
            # A forked resolution: the package's own resolution markers say which fork holds.
            candidates = [
                p
                for p in candidates
                if any(marker_holds(m, env) for m in p.get("resolution-markers", [None]))
            ]
        if len(candidates) != 1:
            raise ValueError(f"cannot pick one {dep['name']} for {env['python_version']}")
        return candidates[0]

    def closure(
        self, roots: Iterable[Mapping[str, Any]], env: Mapping[str, str]
    ) -> dict[str, Mapping[str, Any]]:
        """Every package reachable from ``roots`` under ``env``, extras followed."""
        seen: dict[str, Mapping[str, Any]] = {}
        stack = [dict(dep) for dep in roots]
        done_extras: set[tuple[str, str]] = set()
        while stack:
            dep = stack.pop()
            if not marker_holds(dep.get("marker"), env):
                continue
            if dep["name"] in EXCLUDED:
                continue
            package = self.find(dep, env)
            name = package["name"]
            if name not in seen:
                seen[name] = package
                stack.extend(package.get("dependencies", []))
            for extra in dep.get("extra", []):
                if (name, extra) not in done_extras:
                    done_extras.add((name, extra))
                    stack.extend(package.get("optional-dependencies", {}).get(extra, []))
        return seen


def pick_wheel(package: Mapping[str, Any], ranked: Mapping[tags.Tag, int]) -> Pin:
    best: tuple[int, Mapping[str, Any]] | None = None
    for wheel in package.get("wheels", []):
        filename = wheel["url"].rsplit("/", 1)[1]
        _, _, _, wheel_tags = parse_wheel_filename(filename)
        rank = min((ranked[t] for t in wheel_tags if t in ranked), default=None)
        if rank is not None and (best is None or rank < best[0]):
            best = (rank, wheel)
    if best is None:
        # The Nix side installs wheels only (no compilers in the closure build): say so loudly.
        raise ValueError(f"{package['name']} {package['version']} has no usable wheel")
    wheel = best[1]
    filename = wheel["url"].rsplit("/", 1)[1]
    return Pin(package["name"], package["version"], filename, wheel["url"], sri(wheel["hash"]))


def build_table(lock_text: str) -> dict[str, Any]:
    lock = Lock(tomllib.loads(lock_text))
    (root,) = lock.by_name[ROOT_NAME]
    pythons: dict[str, Any] = {}
    for python in PYTHONS:
        env = marker_env(python)
        ranked = {tag: i for i, tag in enumerate(supported_tags(python))}
        runtime = lock.closure(root.get("dependencies", []), env)
        with_test = lock.closure(
            [*root.get("dependencies", []), *root.get("dev-dependencies", {}).get("test", [])],
            env,
        )
        pythons[python] = {
            "runtime": [pick_wheel(runtime[n], ranked).as_json() for n in sorted(runtime)],
            "test": [
                pick_wheel(with_test[n], ranked).as_json()
                for n in sorted(with_test)
                if n not in runtime
            ],
        }
    return {
        "schema": 1,
        "generator": "nix/closure/lock2table.py",
        # Ties the table to the lock it came from; the test suite recomputes it.
        "uv_lock_sha256": hashlib.sha256(lock_text.encode()).hexdigest(),
        "excluded": dict(sorted(EXCLUDED.items())),
        "pythons": pythons,
    }


def render(table: Mapping[str, Any]) -> str:
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lock", type=Path, default=HERE / "uv.lock")
    parser.add_argument("--out", type=Path, default=HERE / "table.json")
    parser.add_argument("--check", action="store_true", help="fail when --out is stale")
    args = parser.parse_args(argv)
    text = render(build_table(args.lock.read_text()))
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale: rerun lock2table.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
