"""The API key of the vLLM server: one reader for every command that needs it.

vLLM itself reads ``$VLLM_API_KEY``; ``serve`` sets it from ``API_KEY_FILE``, and the
clients (exporter, bench) send it as a bearer token. A key file is read the same way
everywhere: surrounding whitespace (a trailing newline) stripped, empty is an error.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from qwen3090.errors import Qwen3090Error

API_KEY_ENV = "VLLM_API_KEY"


def read_api_key(path: str | os.PathLike[str], named_by: str) -> str:
    """The key in ``path``; ``named_by`` is the option that named the file, for the fix."""
    p = Path(path)
    try:
        key = p.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise Qwen3090Error(
            f"cannot read the API key file {p}: {why}",
            fix=f"point {named_by} at a readable file holding the key",
        ) from None
    if not key:
        raise Qwen3090Error(
            f"the API key file {p} is empty",
            fix=f"write the key into it, or point {named_by} at the file that holds it",
        )
    return key


def api_key(
    path: str | os.PathLike[str] | None,
    named_by: str,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """The key from ``path`` when given, else ``$VLLM_API_KEY``, else None (no auth)."""
    if path is not None:
        return read_api_key(path, named_by)
    env = os.environ if environ is None else environ
    return env.get(API_KEY_ENV) or None
