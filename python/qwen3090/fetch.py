"""Fetching the pinned checkpoints from the Hugging Face Hub, then checking them.

The targets (repo id, revision, directory name, role) are the ``models`` section of the
pins file, read by :mod:`qwen3090.pins`. A complete directory is never touched: the
completeness check of :mod:`qwen3090.modelcheck` runs first, so a finished fetch makes no
network call at all, online or offline. Downloads go through
``huggingface_hub.snapshot_download`` into the directory itself, which resumes partial files
and shows its own progress bars.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from qwen3090.errors import Qwen3090Error
from qwen3090.modelcheck import check_model_dir
from qwen3090.pins import FetchTarget


def hub_offline() -> bool:
    """huggingface_hub's own switch: HF_HUB_OFFLINE=1 forbids every network call."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class FetchResult:
    target: str
    path: Path
    downloaded: bool  # False: the directory was already complete; nothing was asked of the hub


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or one without hard links (exFAT)
        shutil.copy2(src, dst)


def _overlay_base_files(base_dir: Path, dest_dir: Path) -> None:
    """Give an overlay the base's files it does not carry itself (shards, tokenizer, ...)."""
    for src in sorted(base_dir.iterdir()):
        if src.is_file() and not (dest_dir / src.name).exists():
            _link_or_copy(src, dest_dir / src.name)


def fetch_target(
    target: FetchTarget,
    dest: Path,
    targets: Mapping[str, FetchTarget],
    *,
    offline: bool = False,
    revision: str | None = None,
) -> FetchResult:
    """Make ``dest/target.dir`` complete; download only when the check says it is not."""
    directory = dest / target.dir
    problems = check_model_dir(directory, target.role)
    if not problems:
        return FetchResult(target.name, directory, False)
    listing = "\n  ".join(problems)
    if offline or hub_offline():
        raise Qwen3090Error(
            f"{target.name}: {directory} is incomplete and offline mode forbids downloading "
            f"{target.repo}:\n  {listing}",
            fix="fetch on a connected machine (without --offline / HF_HUB_OFFLINE), or copy "
            "the missing files into the directory",
        )
    rev = revision or target.revision
    if rev is None:
        raise Qwen3090Error(
            f"{target.name}: no revision of {target.repo} is pinned, and an unpinned download "
            "is not reproducible",
            fix=f"pass --revision {target.name}=<commit sha of {target.repo}>",
            exit_code=4,  # "not pinned": no retry can fix it (the NixOS fetch unit stops on 4)
        )
    base_dir: Path | None = None
    if target.link_from is not None:
        base = targets[target.link_from]
        base_dir = dest / base.dir
        if check_model_dir(base_dir, base.role):
            raise Qwen3090Error(
                f"{target.name} overlays {base.name}, and {base_dir} is not complete",
                fix=f"qwen3090 fetch {base.name} {target.name} --dest {dest}",
            )
    from huggingface_hub import snapshot_download

    directory.mkdir(parents=True, exist_ok=True)
    try:
        snapshot_download(
            repo_id=target.repo,
            revision=rev,
            local_dir=directory,
            allow_patterns=list(target.allow_patterns) if target.allow_patterns else None,
        )
    except Exception as err:  # connection, auth, missing revision: all are the hub's answer
        raise Qwen3090Error(
            f"{target.name}: downloading {target.repo}@{rev} into {directory} failed: "
            f"{type(err).__name__}: {err}",
            fix="check the network and the revision, then run the same command again "
            "(finished files are kept, partial ones resume)",
        ) from err
    if base_dir is not None:
        _overlay_base_files(base_dir, directory)
    left = check_model_dir(directory, target.role)
    if left:
        # huggingface_hub answers an unreachable Hub by returning the existing local dir with
        # only a warning, so "incomplete after the download" often means "nothing downloaded".
        raise Qwen3090Error(
            f"{target.name}: {directory} is still incomplete after snapshot_download of "
            f"{target.repo}@{rev} (if the Hub was unreachable, huggingface_hub returned the "
            "existing directory with only a warning):\n  " + "\n  ".join(left),
            fix=f"check the network and that {rev} is the revision of {target.repo} this "
            "release pins, then run the same command again (finished files are kept)",
        )
    return FetchResult(target.name, directory, True)


def fetch_order(names: list[str], targets: Mapping[str, FetchTarget]) -> list[FetchTarget]:
    """The named targets (or the default ones), each overlay after the target it builds on."""
    wanted = names or [n for n, t in targets.items() if t.default]
    unknown = [n for n in wanted if n not in targets]
    if unknown:
        raise Qwen3090Error(
            f"unknown fetch target(s): {', '.join(unknown)}",
            fix=f"choose from: {', '.join(targets)}",
        )
    order: list[FetchTarget] = []

    def add(name: str) -> None:
        t = targets[name]
        if t.link_from is not None:
            add(t.link_from)
        if t not in order:
            order.append(t)

    for name in wanted:
        add(name)
    return order
