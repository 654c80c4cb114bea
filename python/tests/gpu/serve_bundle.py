#!/usr/bin/env python3
"""Build what serve_on_device.sh unpacks on the lent GPU machine (no vLLM, no network there).

    python3 python/tests/gpu/serve_bundle.py --wheel vllm-0.28.0-cp38-abi3-*.whl \
        --kinds PACKAGE_LIST --out .device/gpue2e --so-out .device/gpue2e-so

Writes, under --out (one device call's ``carry``):
  tree.tar.xz    the CUDA wheel's python tree, patched by ``qwen3090/patchtool.py apply`` with
                 this checkout's patches/ (as the Nix build does), without compiled files,
                 bytecode, the Rust frontend binary and the SM100 FMHA's CUTLASS headers
  site.tar.xz    the pure-Python and cp312 manylinux dependencies the machine's image lacks,
                 installed with pip --target here (tokenizer data and locales pruned)
  model/         ``qwen3090 demo-model --arch qwen3_5`` output (the MTP head is added there)
  probe/, serve_on_device.sh, serve_lives.sh, exercise_server.py, mtp_head.py,
  dflash2_drafter.py, copy_task.py, cycle_head.py, shape27b.py   copied from this directory
and under --so-out (a separate, earlier call: 57 MB compressed, it does not fit beside the rest
in the 64 MiB a call carries):
  so-core.tar.xz the compiled core the CUDA platform imports (``_C_stable_libtorch``, built on
                 the stable libtorch ABI, so it loads on the machine's torch 2.11) and the
                 small extensions; FlashAttention-3 (153 MB) and the MoE, MLA and FA2
                 extensions stay behind (serve_on_device.sh says what stands in)

Needs pip with network access here, xz, and the shared venv's python for the demo model.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

ARGS: Any = None  # the command line, set in __main__
HERE = Path(__file__).resolve().parent
PYDIR = HERE.parents[1]
REPO = PYDIR.parent
# What vLLM 0.28.0's CUDA wheel requires that the machine's image (the device tool's package
# list of it) lacks, minus the GPU libraries this tier does without, plus the import-time extras
# the server reaches (email-validator via fastapi, pycountry via mistral_common, loguru via
# compressed-tensors, apache-tvm-ffi via xgrammar). Their own requirements are followed.
TOP = (
    "cachetools", "blake3", "fastapi>=0.133.0,<0.137.0", "uvicorn", "starlette>=1.0.1",
    "openai>=2.0.0", "pydantic>=2.12.0", "prometheus-fastapi-instrumentator>=8.0.0",
    "llguidance>=1.7.0,<1.8.0", "lark==1.2.2", "xgrammar>=0.2.1,<1.0.0", "partial-json-parser",
    "jsonschema>=4.23.0", "pyzmq>=25.0.0", "msgspec", "mistral_common>=1.11.6",
    "compressed-tensors==0.17.0", "depyf==0.20.0", "watchfiles", "python-json-logger",
    "pybase64", "cbor2", "ijson", "setproctitle", "openai-harmony>=0.0.3",
    "model-hosting-container-standards>=0.1.14,<1.0.0", "opentelemetry-sdk>=1.27.0",
    "opentelemetry-api>=1.27.0", "opentelemetry-exporter-otlp>=1.27.0",
    "opentelemetry-semantic-conventions-ai>=0.4.1", "python-multipart", "apache-tvm-ffi==0.1.11",
    "pycountry", "email-validator", "loguru",
)
# The grammar backends SamplingParams validation imports on every structured-output request
# (SKIP's comment), taken at the wheel's own pins: no package above requires them, so a bundle
# without them serves and then answers every such request 500.
WHEEL_PINNED = ("lm-format-enforcer", "outlines-core")
# On the machine already (its image), or not wanted on this tier (GPU libraries the served
# path does not import, Windows-only, optional servers). The alternative grammar backends
# (outlines-core, lm-format-enforcer) stay in: SamplingParams validation imports all of them on
# every structured-output request, whichever backend serves (the second recorded run's wall).
SKIP = {
    "torch", "torchaudio", "torchvision", "torchcodec", "pynvvideocodec", "flashinfer-python",
    "tilelang", "nvidia-cudnn-frontend", "nvtx", "fastsafetensors", "nvidia-cutlass-dsl",
    "quack-kernels", "tokenspeed-mla", "humming-kernels", "numba", "triton", "vllm",
    "pywin32", "win32-setctime", "contextvars", "aiocontextvars", "httpx2-jsfetch", "anthropic",
    "mcp", "mcp-types",
}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64")
CORE_SO = ("vllm/_C_stable_libtorch.abi3.so", "vllm/cumem_allocator.abi3.so",
           "vllm/fs_io_C.abi3.so", "vllm/spinloop.abi3.so", "vllm/_rust_tool_parser.abi3.so")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def device_packages() -> set[str]:
    """The machine image's packages, from the device tool's list of them (``--kinds``)."""
    text = ARGS.kinds.read_text()
    listed = text.split("Packages: ", 1)[1].split("\n", 1)[0].rstrip(".")
    return {norm(n.strip()) for n in listed.split(",")}


def requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    out = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        marker = req.split(";", 1)[1].replace("'", '"') if ";" in req else ""
        if "extra" in marker or "win32" in marker or "Windows" in marker:
            continue
        out.append(req.split(";", 1)[0].strip())
    return out


def download_closure(dest: Path) -> None:
    present = device_packages()
    pinned = [r for r in requirements(ARGS.wheel)
              if norm(re.split(r"[\s\[;<>=!~(]", r, maxsplit=1)[0]) in WHEEL_PINNED]
    if len(pinned) != len(WHEEL_PINNED):
        raise SystemExit(f"the wheel pins {pinned}, expected one each of {WHEEL_PINNED}")
    todo, seen = [*TOP, *pinned], set()
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    while todo:
        spec = todo.pop(0)
        name = norm(re.split(r"[\s\[;<>=!~(]", spec, maxsplit=1)[0])
        if name in seen or name in present or name in SKIP:
            continue
        seen.add(name)
        before = set(dest.glob("*.whl"))
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "--python-version", "3.12", "--implementation",
                        "cp", *plat, "-d", str(dest), spec], check=True)
        new = set(dest.glob("*.whl")) - before
        for whl in new:
            todo.extend(requirements(whl))


def xz_tar(src: Path, out: Path, *members: str, exclude: tuple[str, ...] = ()) -> None:
    cmd = ["tar", "-C", str(src), "-cf", "-"]
    cmd += [f"--exclude={e}" for e in exclude]
    tar = subprocess.Popen([*cmd, *members], stdout=subprocess.PIPE)
    with out.open("wb") as f:
        subprocess.run(["xz", "-T0", "-9e"], stdin=tar.stdout, stdout=f, check=True)
    if tar.wait() != 0:
        raise SystemExit(f"tar failed for {out}")


def main() -> int:
    out, so_out = ARGS.out, ARGS.so_out
    out.mkdir(parents=True, exist_ok=True)
    so_out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpue2e-") as tmp_s:
        tmp = Path(tmp_s)
        tree, so, whl, site = tmp / "tree", tmp / "so", tmp / "whl", tmp / "site"
        with zipfile.ZipFile(ARGS.wheel) as z:
            names = z.namelist()
            z.extractall(tree, [n for n in names if not n.endswith(".so")])
            z.extractall(so, [n for n in names if n in CORE_SO])
        subprocess.run([sys.executable, str(PYDIR / "qwen3090" / "patchtool.py"), "apply",
                        "--root", str(tree), "--patches", str(REPO / "patches"),
                        "--no-compile"], check=True)
        for cache in tree.rglob("__pycache__"):
            shutil.rmtree(cache, ignore_errors=True)
        xz_tar(tree, out / "tree.tar.xz", "vllm", "vllm-0.28.0.dist-info",
               exclude=("vllm/vllm-rs", "vllm/third_party/fmha_sm100/cutlass"))
        xz_tar(so, so_out / "so-core.tar.xz", "vllm")
        whl.mkdir()
        download_closure(whl)
        plat = [a for p in PLATFORMS for a in ("--platform", p)]
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--no-compile", "--only-binary=:all:", "--python-version", "3.12",
                        "--implementation", "cp", *plat, "--target", str(site),
                        *map(str, sorted(whl.glob("*.whl")))], check=True)
        # Data the served path never reads: Mistral's tekken vocabularies and country-name
        # translations (36 MB of the 82).
        shutil.rmtree(site / "pycountry" / "locales", ignore_errors=True)
        for tekken in (site / "mistral_common" / "data").glob("tekken_*.json"):
            tekken.unlink()
        xz_tar(site, out / "site.tar.xz", ".")
    model = out / "model"
    shutil.rmtree(model, ignore_errors=True)
    subprocess.run([ARGS.python, "-m", "qwen3090", "demo-model", str(model), "--arch",
                    "qwen3_5"], check=True, env={**os.environ, "PYTHONPATH": str(PYDIR)})
    for name in ("serve_on_device.sh", "serve_lives.sh", "exercise_server.py", "mtp_head.py",
                 "dflash2_drafter.py", "copy_task.py", "cycle_head.py", "shape27b.py"):
        shutil.copy2(HERE / name, out / name)
    (out / "probe").mkdir(exist_ok=True)
    shutil.copy2(HERE / "probe" / "sitecustomize.py", out / "probe" / "sitecustomize.py")
    for path in sorted([*out.iterdir(), *so_out.iterdir()]):
        files = list(path.rglob("*")) if path.is_dir() else [path]
        print(f"{path}: {sum(f.stat().st_size for f in files if f.is_file())} bytes")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--wheel", type=Path, required=True, help="the vLLM 0.28.0 CUDA wheel")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--so-out", type=Path, required=True)
    parser.add_argument("--kinds", type=Path, required=True,
                        help="the device tool's package list of the machine (markdown)")
    parser.add_argument("--python", default=sys.executable,
                        help="a Python with torch, transformers and tokenizers (demo model)")
    ARGS = parser.parse_args()
    sys.exit(main())
