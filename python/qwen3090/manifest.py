"""The build manifest: what the patch series put into a vLLM tree.

The apply tool (``qwen3090.patchtool``) writes ``vllm/_qwen3090/manifest.json`` inside the
patched tree. The resolver reads it to know which env vars, CLI flags and named features this
build's vLLM understands beyond stock 0.28.0, so a knob that needs a missing patch is an error
instead of a variable nothing reads.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwen3090.errors import Qwen3090Error

SCHEMA = 1
# Where the manifest lives, relative to the directory that contains ``vllm/``.
MANIFEST_RELPATH = Path("vllm") / "_qwen3090" / "manifest.json"
MANIFEST_ENV = "QWEN3090_MANIFEST"


@dataclass(frozen=True)
class Provides:
    """What one patch adds that stock vLLM 0.28.0 does not have."""

    env: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    features: tuple[str, ...] = ()


@dataclass(frozen=True)
class PatchRecord:
    """One applied patch, as the apply tool recorded it."""

    name: str
    file: str
    sha256: str
    files: tuple[str, ...]
    """Every path the patch touches (created ones included), relative to the tree root."""
    creates: tuple[str, ...]
    provides: Provides


@dataclass(frozen=True)
class Manifest:
    """A parsed ``manifest.json``; ``path`` is where it was read from (None if built in memory)."""

    schema: int
    vllm_version: str
    series_digest: str
    patches: tuple[PatchRecord, ...]
    path: Path | None = None

    @property
    def provided_env(self) -> frozenset[str]:
        return frozenset(v for p in self.patches for v in p.provides.env)

    @property
    def provided_flags(self) -> frozenset[str]:
        return frozenset(v for p in self.patches for v in p.provides.flags)

    @property
    def provided_features(self) -> frozenset[str]:
        return frozenset(v for p in self.patches for v in p.provides.features)

    @property
    def source(self) -> str:
        """Where this build's facts come from, in words (for messages and plans)."""
        where = f"the manifest {self.path}" if self.path else "the build manifest"
        return f"{where} ({len(self.patches)} patches, series {self.series_digest})"

    @property
    def patch_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.patches)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, exactly as the apply tool writes it."""
        return {
            "schema": self.schema,
            "vllm_version": self.vllm_version,
            "series_digest": self.series_digest,
            "patches": [
                {
                    "name": p.name,
                    "file": p.file,
                    "sha256": p.sha256,
                    "files": list(p.files),
                    "creates": list(p.creates),
                    "provides": {
                        "env": list(p.provides.env),
                        "flags": list(p.provides.flags),
                        "features": list(p.provides.features),
                    },
                }
                for p in self.patches
            ],
        }


def _bad(path: Path | None, what: str) -> Qwen3090Error:
    where = str(path) if path is not None else "manifest"
    return Qwen3090Error(
        f"{where}: not a valid qwen3090 build manifest ({what})",
        fix="re-apply the patch series to a pristine vLLM tree (python/dev.sh test does it, "
        "as does the Nix build)",
    )


def _str_list(value: object, path: Path | None, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(path, f"{what} must be a list of strings")
    return tuple(value)


def manifest_from_dict(data: object, path: Path | None = None) -> Manifest:
    """Validate and convert the JSON object of a manifest."""
    if not isinstance(data, dict):
        raise _bad(path, "top level is not an object")
    if data.get("schema") != SCHEMA:
        raise _bad(path, f"schema {data.get('schema')!r}, this qwen3090 reads schema {SCHEMA}")
    version = data.get("vllm_version")
    digest = data.get("series_digest")
    if not isinstance(version, str) or not isinstance(digest, str):
        raise _bad(path, "vllm_version and series_digest must be strings")
    if not digest.startswith("sha256:"):
        raise _bad(path, f"series_digest {digest!r} is not 'sha256:<hex>'")
    raw_patches = data.get("patches")
    if not isinstance(raw_patches, list):
        raise _bad(path, "patches must be a list")
    patches: list[PatchRecord] = []
    for i, raw in enumerate(raw_patches):
        if not isinstance(raw, dict):
            raise _bad(path, f"patches[{i}] is not an object")
        fields = {k: raw.get(k) for k in ("name", "file", "sha256")}
        if not all(isinstance(v, str) for v in fields.values()):
            raise _bad(path, f"patches[{i}] needs string name, file and sha256")
        provides = raw.get("provides", {})
        if not isinstance(provides, dict):
            raise _bad(path, f"patches[{i}].provides is not an object")
        patches.append(
            PatchRecord(
                name=str(fields["name"]),
                file=str(fields["file"]),
                sha256=str(fields["sha256"]),
                files=_str_list(raw.get("files", []), path, f"patches[{i}].files"),
                creates=_str_list(raw.get("creates", []), path, f"patches[{i}].creates"),
                provides=Provides(
                    env=_str_list(provides.get("env", []), path, "provides.env"),
                    flags=_str_list(provides.get("flags", []), path, "provides.flags"),
                    features=_str_list(provides.get("features", []), path, "provides.features"),
                ),
            )
        )
    return Manifest(
        schema=SCHEMA,
        vllm_version=version,
        series_digest=digest,
        patches=tuple(patches),
        path=path,
    )


def load_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read and validate one ``manifest.json``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise Qwen3090Error(
            f"cannot read the build manifest {p}: {err.strerror}",
            # No flag named: commands without --manifest read it too (through the variable).
            fix=f"name the {MANIFEST_RELPATH} of a patched vLLM tree, or unset {MANIFEST_ENV} "
            "to use the installed vLLM's",
        ) from err
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise _bad(p, f"invalid JSON: {err}") from err
    return manifest_from_dict(data, p)


def installed_vllm_root() -> Path | None:
    """The directory containing the importable ``vllm`` package, found WITHOUT importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def manifest_in_tree(root: Path) -> Manifest | None:
    """The manifest of the patched tree at ``root`` (the directory containing ``vllm/``);
    None when the tree is unpatched."""
    candidate = root / MANIFEST_RELPATH
    return load_manifest(candidate) if candidate.is_file() else None


def read_manifest(path: str | os.PathLike[str] | None = None) -> Manifest | None:
    """The build manifest a command works against: the one rule every reader follows.

    ``path`` (a command's ``--manifest``) first, which must exist; else ``$QWEN3090_MANIFEST``,
    which must exist too; else the manifest of the vLLM that ``import vllm`` would load (found
    without importing it). None means that vLLM is stock (unpatched) or not installed.
    """
    if path is not None:
        return load_manifest(path)
    override = os.environ.get(MANIFEST_ENV)
    if override:
        return load_manifest(override)
    root = installed_vllm_root()
    return None if root is None else manifest_in_tree(root)


def find_installed_manifest() -> Manifest | None:
    """:func:`read_manifest` without an explicit path (no ``--manifest``)."""
    return read_manifest()
