"""Pinned build artifacts (``pins.json``): download by sha256 into a cache, unpack ``vllm/``.

The same ``pins.json`` (read by :mod:`qwen3090.pins`) feeds Nix's ``fetchurl``; this module
is how CI and the patch-tier tests get the identical files. A download whose sha256 differs
from the pin is deleted and is an error: a moved or replaced upstream file must never be used
silently.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from qwen3090.errors import Qwen3090Error
from qwen3090.pins import Artifact, pinned_artifact

ARTIFACTS_ENV = "QWEN3090_ARTIFACTS"
_CHUNK = 1 << 20


def artifacts_dir() -> Path:
    """``$QWEN3090_ARTIFACTS``, else ``${XDG_CACHE_HOME:-~/.cache}/qwen3090/artifacts``."""
    override = os.environ.get(ARTIFACTS_ENV)
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "qwen3090" / "artifacts"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _hash_mismatch(artifact: Artifact, got: str, source: str) -> Qwen3090Error:
    return Qwen3090Error(
        f"{artifact.filename} ({source}) has sha256 {got}, but pins.json pins "
        f"{artifact.sha256}; the file was deleted",
        fix=f"check {artifact.url} by hand: if upstream really replaced the file, re-pin it "
        "from PyPI's JSON API after reviewing why",
    )


def fetch_artifact(artifact: Artifact | str, cache: Path | None = None) -> Path:
    """The verified local copy of ``artifact``, downloading it on first use.

    The cache is content-addressed (``<cache>/<sha256>/<filename>``) and every call re-hashes
    the file, so a corrupted or swapped cache entry fails here rather than in a build.
    """
    art = pinned_artifact(artifact) if isinstance(artifact, str) else artifact
    root = cache if cache is not None else artifacts_dir()
    target = root / art.sha256 / art.filename
    if target.is_file():
        got = sha256_of(target)
        if got != art.sha256:
            target.unlink()
            raise _hash_mismatch(art, got, f"cached at {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".part-", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(art.url, timeout=120) as resp:
                for chunk in iter(lambda: resp.read(_CHUNK), b""):
                    h.update(chunk)
                    out.write(chunk)
        except OSError as err:
            raise Qwen3090Error(
                f"downloading {art.url} failed: {err}",
                fix="check the network (PyPI must be reachable) or put the file, with the "
                f"pinned sha256, at {target}",
            ) from err
        got = h.hexdigest()
        if got != art.sha256:
            raise _hash_mismatch(art, got, f"downloaded from {art.url}")
        tmp.replace(target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return target


def unpack_vllm(archive: Path, dest: Path) -> Path:
    """Extract only the ``vllm/`` package of an sdist or a wheel into ``dest/vllm``.

    Returns ``dest``: the directory that CONTAINS ``vllm/``, i.e. what ``patch -p1`` and the
    apply tool take as the root.
    """
    dest.mkdir(parents=True, exist_ok=True)
    if (dest / "vllm").exists():
        raise Qwen3090Error(f"{dest / 'vllm'} already exists", fix="unpack into an empty dir")
    # The archive is a pinned artifact, so a malformed one means the pin or the cache is wrong.
    bad_archive = (
        f"delete {archive} (a cached copy is downloaded again and re-hashed), and check that "
        "the pin in pins.json names a vLLM sdist or wheel"
    )
    name = archive.name
    if name.endswith(".whl"):
        with zipfile.ZipFile(archive) as zf:
            members = [m for m in zf.namelist() if m.startswith("vllm/") and not m.endswith("/")]
            for member in members:
                _check_member(member)
                zf.extract(member, dest)
    elif name.endswith((".tar.gz", ".tgz")):
        with tarfile.open(archive, "r:gz") as tf:
            prefix = None
            chosen: list[tarfile.TarInfo] = []
            for info in tf.getmembers():
                parts = info.name.split("/")
                if len(parts) >= 3 and parts[1] == "vllm" and (info.isfile() or info.isdir()):
                    prefix = prefix or parts[0]
                    if parts[0] != prefix:
                        continue
                    _check_member(info.name)
                    info.name = "/".join(parts[1:])
                    chosen.append(info)
            if not chosen:
                raise Qwen3090Error(
                    f"{archive} holds no <name>/vllm/ package directory", fix=bad_archive
                )
            tf.extractall(dest, members=chosen, filter="data")
    else:
        raise Qwen3090Error(f"{archive}: not a wheel or a .tar.gz sdist", fix=bad_archive)
    if not (dest / "vllm" / "__init__.py").is_file():
        raise Qwen3090Error(f"{archive} unpacked without vllm/__init__.py", fix=bad_archive)
    return dest


def _check_member(name: str) -> None:
    parts = name.split("/")
    if name.startswith("/") or ".." in parts:
        raise Qwen3090Error(
            f"archive member {name!r} escapes the destination; nothing of it was used",
            fix="do not use this archive: check where its pin in pins.json points",
        )


def pristine_tree(key: str, cache: Path | None = None) -> Path:
    """A cached, unpacked copy of a pinned artifact's ``vllm/``; treat it as read-only.

    Unpacked once per artifact hash into ``<cache>/trees/<sha256[:16]>``; a partial unpack
    (interrupted run) is detected by the missing completion marker and redone.
    """
    art = pinned_artifact(key)
    root = cache if cache is not None else artifacts_dir()
    tree = root / "trees" / art.sha256[:16]
    marker = tree / ".complete"
    if marker.is_file():
        return tree
    archive = fetch_artifact(art, root)
    if tree.exists():
        shutil.rmtree(tree)
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=tree.parent if tree.parent.exists()
                                    else _mkdir(tree.parent)))
    try:
        unpack_vllm(archive, staging)
        (staging / ".complete").write_text(f"{art.filename} {art.sha256}\n", encoding="utf-8")
        try:
            staging.replace(tree)
        except OSError:
            if not marker.is_file():  # not a concurrent run finishing first: a real failure
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return tree


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
