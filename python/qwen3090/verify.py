"""``qwen3090 verify patches``: which patches of the series a vLLM tree really carries.

The logic lives in :mod:`qwen3090.patchtool` (stdlib-only, so the Nix check runs the very same
code); this module finds the tree and the series and turns failures into Qwen3090Errors.
"""

from __future__ import annotations

from pathlib import Path

from qwen3090 import patchtool
from qwen3090.errors import Qwen3090Error
from qwen3090.manifest import installed_vllm_root


def resolve_root(vllm_root: Path | None) -> Path:
    """The directory that contains ``vllm/``: the one given, else the importable vLLM's."""
    if vllm_root is not None:
        root = vllm_root
        if root.name == "vllm" and (root / "__init__.py").is_file():
            root = root.parent  # accept the package directory itself as well
    else:
        found = installed_vllm_root()
        if found is None:
            raise Qwen3090Error(
                "no vLLM is importable from this Python",
                fix="install vLLM (python/dev.sh does it) or pass --vllm-root DIR",
            )
        root = found
    if not (root / "vllm" / "__init__.py").is_file():
        raise Qwen3090Error(
            f"{root} does not contain vllm/__init__.py",
            fix="--vllm-root takes the directory that CONTAINS vllm/ (e.g. site-packages)",
        )
    return root


def verify_patches(vllm_root: Path | None, patches: Path | None) -> patchtool.VerifyReport:
    root = resolve_root(vllm_root)
    series_dir = patches if patches is not None else patchtool.stored_patches_dir(root)
    if not (series_dir / patchtool.SERIES_NAME).is_file():
        raise Qwen3090Error(
            f"{series_dir} holds no patch series; the vLLM at {root} was not patched by the "
            "qwen3090 apply tool",
            fix="pass --patches DIR (the repository's patches/) to check it against a series",
        )
    try:
        series = patchtool.load_series(series_dir)
        return patchtool.verify_tree(root, series)
    except patchtool.PatchToolError as err:
        raise Qwen3090Error(
            str(err),
            fix="repair what the message names: --patches DIR takes the repository's patches/ "
            "(series and *.patch), --vllm-root the directory that contains vllm/",
        ) from err
