"""Is a model directory complete enough to serve? Checked before vLLM ever sees it.

Each failure here is one that vLLM reports late or misleadingly: a dir without
``tokenizer.json`` is an *empty vocabulary* to transformers and surfaces ~15 s into startup
as "ReasoningConfig: failed to tokenize reasoning strings" (gotcha 32); a missing or truncated
shard dies in the middle of weight loading; a path containing "dflash" silently switches the
speculative method of the target (gotcha 14). Every message names the dir and the fix.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from qwen3090.errors import Qwen3090Error
from qwen3090.pins import ROLES, load_targets

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
# vLLM 0.28.0 picks the speculative method from substrings of the model *path*
# (config/speculative.py, lower-cased): any of these in a target's path turns SPEC=mtp
# into another method. "dflash" is gotcha 14; the others are the same defect.
METHOD_WORDS = ("dflash", "dspark", "eagle3", "eagle-")
# What the qwen3 reasoning parser asks the tokenizer for at startup.
REASONING_MARKERS = ("<think>", "</think>")


# The pinned checkpoints are the 27B model, which the CPU build cannot serve usefully.
CPU_MODEL_FIX = (
    "on --device cpu serve a small model: `qwen3090 demo-model DIR`, then MODEL=DIR "
    "(or --model DIR)"
)


def fix_for(path: Path, device: str = "cuda") -> str:
    """What repairs ``path`` for a plan on ``device``: on CUDA, the fetch of the pinned target
    whose dir it is, when one is; on the CPU, a demo model instead of a missing 27B one."""
    try:
        targets = load_targets()
    except Qwen3090Error:
        targets = {}
    pinned = next((name for name, t in targets.items() if t.dir == path.name), None)
    if device == "cpu" and (pinned is not None or not path.exists()):
        return CPU_MODEL_FIX
    if pinned is not None:
        return f"qwen3090 fetch {pinned} --dest {path.parent}"
    return f"re-download the checkpoint into {path} (qwen3090 fetch TARGET --dest DIR)"


def _json_object(path: Path) -> tuple[dict[str, Any] | None, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        return None, f"cannot be read ({err.strerror})"
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return None, f"is not valid JSON ({err})"
    if not isinstance(data, dict):
        return None, "is not a JSON object"
    return data, ""


def safetensors_header(path: Path) -> tuple[dict[str, Any] | None, str]:
    """The header of a safetensors file, or why it is unusable (missing, truncated, corrupt).

    Reads only the header: the 8-byte length, the JSON, and the file size, which must cover
    the end offset of every tensor (a killed copy keeps a valid header over missing data).
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return None, f"is truncated ({size} bytes)"
            (length,) = struct.unpack("<Q", head)
            if 8 + length > size:
                return None, f"is truncated (header of {length} bytes, file of {size})"
            header = json.loads(f.read(length))
    except FileNotFoundError:
        return None, "is missing"
    except OSError as err:
        return None, f"cannot be read ({err.strerror})"
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None, "has a corrupt header"
    if not isinstance(header, dict):
        return None, "has a corrupt header"
    end = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            end = max(end, int(info["data_offsets"][1]))
        except (KeyError, IndexError, TypeError, ValueError):
            return None, f"has a corrupt header entry for {key!r}"
    if 8 + length + end > size:
        return None, f"is truncated ({size} bytes, tensors need {8 + length + end})"
    return header, ""


def _check_weights(path: Path) -> list[str]:
    index_path = path / INDEX_NAME
    if index_path.exists():
        index, why = _json_object(index_path)
        if index is None:
            return [f"{INDEX_NAME} {why}"]
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            return [f"{INDEX_NAME} has no weight_map"]
        by_shard: dict[str, list[str]] = {}
        for tensor, shard in weight_map.items():
            by_shard.setdefault(str(shard), []).append(str(tensor))
        problems: list[str] = []
        missing = sorted(s for s in by_shard if not (path / s).exists())
        if missing:
            problems.append(
                f"{len(missing)} of {len(by_shard)} shard(s) named in {INDEX_NAME} are "
                f"missing: {', '.join(missing)}"
            )
        for shard in sorted(set(by_shard) - set(missing)):
            header, why = safetensors_header(path / shard)
            if header is None:
                problems.append(f"shard {shard} {why}")
                continue
            absent = [t for t in by_shard[shard] if t not in header]
            if absent:
                shown = ", ".join(absent[:3]) + (" ..." if len(absent) > 3 else "")
                problems.append(
                    f"shard {shard} lacks {len(absent)} tensor(s) the index puts there "
                    f"({shown}): the shard and the index come from different versions"
                )
        return problems
    single = path / SINGLE_NAME
    if single.exists():
        header, why = safetensors_header(single)
        return [] if header is not None else [f"{SINGLE_NAME} {why}"]
    return [f"no weights: neither {INDEX_NAME} nor {SINGLE_NAME}"]


def _check_tokenizer(path: Path) -> list[str]:
    problems: list[str] = []
    tok_config = path / "tokenizer_config.json"
    if not tok_config.exists():
        problems.append("no tokenizer_config.json")
    else:
        _, why = _json_object(tok_config)
        if why:
            problems.append(f"tokenizer_config.json {why}")
    tok_file = path / "tokenizer.json"
    if not tok_file.exists():
        problems.append(
            "no tokenizer.json: transformers then builds an EMPTY vocabulary without an "
            "error, and vLLM fails ~15 s into startup with 'ReasoningConfig: failed to "
            "tokenize reasoning strings' (gotcha 32)"
        )
        return problems
    try:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tok_file))
    except Exception as err:  # the library raises plain Exception for a malformed file
        problems.append(f"tokenizer.json does not load: {err}")
        return problems
    for marker in REASONING_MARKERS:
        try:
            ids = tokenizer.encode(marker, add_special_tokens=False).ids
        except Exception as err:  # e.g. a WordLevel model without its unknown token
            problems.append(f"tokenizer.json cannot encode {marker!r}: {err}")
            continue
        if not ids:
            problems.append(
                f"tokenizer.json encodes {marker!r} to no tokens (an empty or wrong "
                "vocabulary): the qwen3 reasoning parser cannot start (gotcha 32)"
            )
    return problems


def preparation_problems(path: Path) -> list[str]:
    """Why the preparation manifest of ``path`` no longer stands, each with its fix: an output
    of a recorded step is missing or altered (its sha256 differs), or the manifest is
    unreadable. [] for a raw directory (no manifest) and for an intact prepared one."""
    from qwen3090.prepare.record import MANIFEST_NAME, output_problems, read_manifest

    try:
        data = read_manifest(path)
    except ValueError as err:
        return [f"{err}; fix: delete {path / MANIFEST_NAME} and rerun `qwen3090 prepare`"]
    if data is None:
        return []
    problems: list[str] = []
    for step, raw_entry in sorted(data["steps"].items()):
        entry: dict[str, Any] = raw_entry if isinstance(raw_entry, dict) else {}
        found = output_problems(path, step, entry)
        raw_inputs = entry.get("inputs")
        inputs: dict[str, Any] = raw_inputs if isinstance(raw_inputs, dict) else {}
        base = inputs.get("base")
        # A variant (fast-variant) links most files from its base and records the base's
        # fingerprint: a re-fetched base no longer matches the rewritten shards.
        base_dir = Path(os.path.normpath(path / base)) if isinstance(base, str) else None
        if base_dir is not None and not found:
            found.extend(_base_problems(base_dir, inputs.get("base_fingerprint"), step))
        rerun = (f"qwen3090 prepare {step} {base_dir} --out {path} --force" if base_dir
                 else f"qwen3090 prepare {step} {path} --force")
        problems.extend(f"{problem} ({MANIFEST_NAME}); fix: rerun `{rerun}`" for problem in found)
    return problems


def _base_problems(base: Path, fingerprint: object, step: str) -> list[str]:
    from qwen3090.prepare.record import model_fingerprint

    if not base.is_dir():
        return [f"its base {base} (from step {step!r}) is gone: the linked files dangle"]
    if model_fingerprint(base) != fingerprint:
        return [f"its base {base} (from step {step!r}) changed since the variant was made: "
                "the linked files no longer belong with the rewritten ones"]
    return []


def prepared_steps(path: Path) -> list[str]:
    """The steps ``qwen3090 prepare`` recorded for ``path`` ([] for a raw directory); a step
    that made ``path`` from a base reads "STEP of BASE"."""
    from qwen3090.prepare.record import read_manifest

    try:
        data = read_manifest(path)
    except ValueError:
        return []
    steps: list[str] = []
    for step, entry in sorted((data or {}).get("steps", {}).items()):
        inputs = entry.get("inputs") if isinstance(entry, dict) else None
        base = inputs.get("base") if isinstance(inputs, dict) else None
        steps.append(f"{step} of {os.path.normpath(path / base)}" if isinstance(base, str)
                     else step)
    return steps


def check_model_dir(
    path: Path, role: str = "target", device: str = "cuda", prepared: bool = True
) -> list[str]:
    """Every reason ``path`` cannot be served in ``role`` ("target" or "draft") by a plan on
    ``device``; [] when fine. ``prepared``: also check the preparation manifest's outputs.

    Each message starts with the directory and ends with the fix.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    fix = fix_for(path, device)
    problems: list[str] = []
    if role == "target":
        # vLLM tests the string it is given; serve may pass a relative or a resolved path.
        lowered = f"{path}\n{path.resolve()}".lower()
        for word in METHOD_WORDS:
            if word in lowered:
                problems.append(
                    f"{path}: the path contains {word!r}: vLLM 0.28.0 picks the speculative "
                    f"method from the model path, so this target would run as "
                    f"{word.strip('-')} even under SPEC=mtp and crash (gotcha 14); fix: "
                    "rename the directory (or a parent) so the path lacks that word"
                )
    found: list[str] = []
    if not path.is_dir():
        found.append("does not exist or is not a directory")
    else:
        if not (path / "config.json").exists():
            found.append("no config.json")
        else:
            _, why = _json_object(path / "config.json")
            if why:
                found.append(f"config.json {why}")
        found.extend(_check_weights(path))
        if role == "target":
            found.extend(_check_tokenizer(path))
    problems.extend(f"{path}: {p}; fix: {fix}" for p in found)
    if prepared and path.is_dir():
        problems.extend(f"{path}: {p}" for p in preparation_problems(path))
    return problems


def require_model_dirs(dirs: Iterable[tuple[Path, str]], device: str = "cuda") -> None:
    """Raise one :class:`Qwen3090Error` listing every problem of every (dir, role) pair;
    what ``serve`` runs for each dir it passes to vLLM (``device``: the plan's)."""
    problems = [p for path, role in dirs for p in check_model_dir(path, role, device)]
    if problems:
        raise Qwen3090Error(
            "model directory check failed:\n  " + "\n  ".join(problems),
            fix="see the fix after each problem, then run `qwen3090 check model DIR` again",
        )
