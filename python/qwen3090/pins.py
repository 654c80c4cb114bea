"""The one reader of ``pins.json``: the pinned build artifacts and the model checkpoints.

Nix reads the same file (``nix/pins.nix``); on the Python side every module goes through
here, so one override applies to all of it: ``$QWEN3090_PINS`` names another pins file (tests
and air-gapped mirrors use it). ``$QWEN3090_MODELS_DIR`` is where the checkpoint directories
live; ``fetch`` writes there and the planner looks there.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from qwen3090.errors import Qwen3090Error

PINS_ENV = "QWEN3090_PINS"
MODELS_DIR_ENV = "QWEN3090_MODELS_DIR"
DEFAULT_MODELS_DIR = "models"
ROLES = ("target", "draft")
"""What a checkpoint is served as; the model check demands more of a target (a tokenizer)."""


def pins_path() -> Path:
    """``$QWEN3090_PINS``, else the ``pins.json`` shipped inside the package."""
    override = os.environ.get(PINS_ENV)
    if override:
        return Path(override)
    return Path(str(resources.files("qwen3090").joinpath("pins.json")))


def models_dir() -> Path:
    """``$QWEN3090_MODELS_DIR``, else ``models`` (relative to the working directory)."""
    return Path(os.environ.get(MODELS_DIR_ENV) or DEFAULT_MODELS_DIR)


def load_pins(path: Path | None = None) -> dict[str, Any]:
    """The parsed pins file (``path``, else :func:`pins_path`)."""
    where = path or pins_path()
    try:
        data = json.loads(where.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise Qwen3090Error(
            f"no pins file at {where}",
            fix=f"restore it (reinstall qwen3090), or point {PINS_ENV} at one",
        ) from err
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise Qwen3090Error(
            f"the pins file {where} cannot be read: {err}",
            fix=f"repair the JSON of {where}, or unset {PINS_ENV} to use the packaged file",
        ) from err
    if not isinstance(data, dict):
        raise Qwen3090Error(
            f"the pins file {where} is not a JSON object",
            fix=f"repair {where}, or unset {PINS_ENV} to use the packaged file",
        )
    return data


# --- build artifacts ------------------------------------------------------------------------


@dataclass(frozen=True)
class Artifact:
    key: str
    distribution: str
    version: str
    kind: str
    """"sdist" or "wheel"."""
    filename: str
    url: str
    sha256: str
    size: int | None


def _artifact(key: str, raw: Any, where: Path) -> Artifact:
    fix = f"give artifacts.{key} in {where} the fields distribution, version, kind, " \
        "filename, url, sha256 (and optionally size)"
    if not isinstance(raw, dict):
        raise Qwen3090Error(f"{where}: artifacts.{key} is not an object", fix=fix)
    try:
        size = raw.get("size")
        return Artifact(
            key=key,
            distribution=str(raw["distribution"]),
            version=str(raw["version"]),
            kind=str(raw["kind"]),
            filename=str(raw["filename"]),
            url=str(raw["url"]),
            sha256=str(raw["sha256"]).lower(),
            size=int(size) if size is not None else None,
        )
    except (KeyError, TypeError, ValueError) as err:
        raise Qwen3090Error(f"{where}: artifacts.{key} is malformed ({err!r})", fix=fix) from err


def load_artifacts(path: Path | None = None) -> dict[str, Artifact]:
    """The ``artifacts`` table, by key (e.g. ``vllm-sdist``)."""
    where = path or pins_path()
    table = load_pins(where).get("artifacts")
    if not isinstance(table, dict):
        raise Qwen3090Error(
            f"the pins file {where} has no 'artifacts' table",
            fix=f"restore the packaged pins.json, or unset {PINS_ENV}",
        )
    return {key: _artifact(key, raw, where) for key, raw in table.items()}


def pinned_artifact(key: str) -> Artifact:
    """One entry of the ``artifacts`` table."""
    table = load_artifacts()
    if key not in table:
        raise Qwen3090Error(
            f"no pinned artifact named {key!r}",
            fix=f"use one of: {', '.join(sorted(table))}",
        )
    return table[key]


# --- model checkpoints ----------------------------------------------------------------------


@dataclass(frozen=True)
class FetchTarget:
    name: str
    repo: str
    revision: str | None  # None: not pinned; the user must name one (--revision NAME=REV)
    dir: str  # directory name under the models dir (fetch --dest)
    role: str  # one of ROLES: what the model check demands
    default: bool  # fetched when no target is named
    allow_patterns: tuple[str, ...] | None  # only these files of the repo
    link_from: str | None  # an overlay: the other files come from this target's directory
    note: str


def _target(name: str, raw: Any, where: Path) -> FetchTarget:
    fix = f"correct models.{name} in {where} (fields: repo, revision, dir, role, default, " \
        "allow_patterns, link_from, note)"
    if not isinstance(raw, dict):
        raise Qwen3090Error(f"{where}: models.{name} is not an object", fix=fix)

    def text(key: str, required: bool = True) -> str | None:
        value = raw.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value:
            raise Qwen3090Error(
                f"{where}: models.{name}.{key} must be a non-empty string", fix=fix
            )
        return value

    repo, directory = text("repo"), text("dir")
    assert repo is not None and directory is not None
    role = raw.get("role", "target")
    if role not in ROLES:
        raise Qwen3090Error(
            f"{where}: models.{name}.role must be one of {ROLES}, not {role!r}", fix=fix
        )
    patterns = raw.get("allow_patterns")
    if patterns is not None and not (
        isinstance(patterns, list) and all(isinstance(p, str) for p in patterns)
    ):
        raise Qwen3090Error(
            f"{where}: models.{name}.allow_patterns must be a list of strings", fix=fix
        )
    return FetchTarget(
        name=name,
        repo=repo,
        revision=text("revision", required=False),
        dir=directory,
        role=role,
        default=bool(raw.get("default", False)),
        allow_patterns=None if patterns is None else tuple(patterns),
        link_from=text("link_from", required=False),
        note=str(raw.get("note", "")),
    )


def load_targets(path: Path | None = None) -> dict[str, FetchTarget]:
    """The checkpoints of the ``models`` section, by target name."""
    where = path or pins_path()
    models = load_pins(where).get("models")
    if not isinstance(models, dict) or not models:
        raise Qwen3090Error(
            f"the pins file {where} has no 'models' section, so there is nothing to fetch",
            fix="add the model targets (repo, revision, dir, role) under 'models'",
        )
    targets = {name: _target(name, raw, where) for name, raw in models.items()}
    for t in targets.values():
        if t.link_from is not None and t.link_from not in targets:
            raise Qwen3090Error(
                f"{where}: models.{t.name}.link_from names no target",
                fix=f"set models.{t.name}.link_from to one of: {', '.join(targets)}",
            )
    return targets


def model_dir(name: str) -> Path:
    """Where target ``name``'s checkpoint lives: ``models_dir() / <its dir>``."""
    targets = load_targets()
    if name not in targets:
        raise Qwen3090Error(
            f"no model target named {name!r} in {pins_path()}",
            fix=f"use one of: {', '.join(targets)}",
        )
    return models_dir() / targets[name].dir
