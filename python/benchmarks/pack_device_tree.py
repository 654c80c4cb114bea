#!/usr/bin/env python3
"""Pack the patched vLLM tree the spec-decode-attn benchmark imports on the lent GPU machine.

    python/benchmarks/pack_device_tree.py [--out .device/sda-tree.tar.xz]

Writes one tar.xz (about 10 MB; a device call carries 64 MiB) holding, at its top:
  vllm/                      vLLM 0.28.0's sdist python tree with this checkout's patches/
                             applied (tests/patchtrees.py, as the patch-tier tests build it),
                             without bytecode
  vllm/_C_stable_libtorch.py an empty module: vllm.platforms.cuda imports the compiled core at
                             module level, and the kernels benchmarked here never call it
  vllm-0.28.0.dist-info/     a METADATA naming the ``vllm`` distribution, which vLLM's Triton
                             probe asks importlib.metadata for

On the device: ``tar xJf sda-tree.tar.xz -C DIR`` and pass ``--tree DIR`` to
spec_decode_attn.py (spec_decode_attn.md has the whole command).
"""

from __future__ import annotations

import argparse
import io
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYDIR = HERE.parent
REPO = PYDIR.parent
METADATA = b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.28.0\n"


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def _no_bytecode(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    if "__pycache__" in info.name.split("/") or info.name.endswith(".pyc"):
        return None
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / ".device" / "sda-tree.tar.xz")
    args = parser.parse_args()
    sys.path.insert(0, str(PYDIR))
    from tests.support import patchtrees

    tree = patchtrees.patched_tree(patchtrees.SDIST)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(args.out, "w:xz") as tar:
        tar.add(tree / "vllm", arcname="vllm", filter=_no_bytecode)
        _add_bytes(tar, "vllm/_C_stable_libtorch.py", b"")
        _add_bytes(tar, "vllm-0.28.0.dist-info/METADATA", METADATA)
    print(f"{args.out}: {args.out.stat().st_size / 2**20:.1f} MiB, from {tree.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
