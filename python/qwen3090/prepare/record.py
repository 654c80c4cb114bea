"""The preparation manifest: ``qwen3090-prepared.json`` beside the model.

One entry per step: a digest of the step's inputs, the sha256 of every output file and what
the step reported. A step is skipped when its recorded inputs digest equals the current one
and every output still has its recorded sha256; anything else reruns it. ``check model`` reads
the same file to tell a prepared directory from a raw one and to catch an altered output.

The model's weights enter the inputs digest through their safetensors headers and file sizes,
not their bytes: hashing 17 GB on every run would cost minutes, and a changed checkpoint
changes its headers or sizes.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwen3090 import __version__
from qwen3090.patchtool import sha256_file

MANIFEST_NAME = "qwen3090-prepared.json"
_FORMAT = 1
# Files whose bytes define the model for a preparation step (weights are fingerprinted apart).
_MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json",
                "generation_config.json", "model.safetensors.index.json")


def model_fingerprint(model: Path) -> str:
    """sha256 over the model's config/tokenizer bytes and each weight file's header and size."""
    h = hashlib.sha256()
    for name in _MODEL_FILES:
        path = model / name
        if path.is_file():
            h.update(f"{name} {sha256_file(path)}\n".encode())
    for shard in sorted(model.glob("*.safetensors")):
        size = shard.stat().st_size
        with shard.open("rb") as f:
            head = f.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else 0
            header = f.read(min(length, size))
        h.update(f"{shard.name} {size} {hashlib.sha256(header).hexdigest()}\n".encode())
    return h.hexdigest()


def inputs_digest(inputs: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class StepRecord:
    """What one finished step left in the manifest."""

    step: str
    inputs: dict[str, Any]
    outputs: dict[str, str]
    """Output file name (relative to the model dir) -> sha256."""
    report: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "inputs": self.inputs,
            "inputs_digest": inputs_digest(self.inputs),
            "outputs": self.outputs,
            "report": self.report,
            "tool": f"qwen3090 {__version__}",
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }


def read_manifest(model: Path) -> dict[str, Any] | None:
    """The manifest's content, None when the dir has none; ValueError when it is unreadable."""
    path = model / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{MANIFEST_NAME} cannot be read: {err}") from err
    if not isinstance(data, dict) or not isinstance(data.get("steps"), dict):
        raise ValueError(f"{MANIFEST_NAME} has no 'steps' object")
    return data


def record_step(model: Path, record: StepRecord) -> None:
    """Write ``record`` into the manifest (atomically: a killed run leaves the old one)."""
    data = read_manifest(model) or {"format": _FORMAT, "steps": {}}
    data["steps"][record.step] = record.to_json()
    tmp = model / f".{MANIFEST_NAME}.tmp"
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, model / MANIFEST_NAME)


def output_problems(model: Path, step: str, entry: Mapping[str, Any]) -> list[str]:
    """Why the recorded outputs of ``step`` no longer stand (missing or changed), [] if they do."""
    problems: list[str] = []
    outputs = entry.get("outputs")
    if not isinstance(outputs, dict) or not outputs:
        return [f"step {step!r} records no outputs"]
    for name, digest in sorted(outputs.items()):
        path = model / name
        if not path.is_file():
            problems.append(f"{name} (from step {step!r}) is missing")
        elif sha256_file(path) != digest:
            problems.append(
                f"{name} (from step {step!r}) no longer matches its recorded sha256 "
                f"{str(digest)[:12]}...: it was altered after preparation"
            )
    return problems


def is_current(model: Path, step: str, inputs: Mapping[str, Any]) -> bool:
    """True when ``step`` ran on these inputs and its outputs are intact (skip it)."""
    try:
        data = read_manifest(model)
    except ValueError:
        return False
    entry = (data or {}).get("steps", {}).get(step)
    if not isinstance(entry, dict) or entry.get("inputs_digest") != inputs_digest(inputs):
        return False
    return not output_problems(model, step, entry)
