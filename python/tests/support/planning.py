"""Helpers the spine's plan tests share: settings from plain dicts, arg maps, capabilities."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qwen3090.capabilities import NEEDS, STOCK, Capabilities
from qwen3090.knobs import load_settings
from qwen3090.plan import PlatformFacts, ServePlan, resolve

# A build whose manifest provides every capability the resolver can ask for.
FULL = Capabilities(
    env=frozenset(n.name for n in NEEDS.values() if n.kind == "env"),
    flags=frozenset({"kvarn_k4v2_g128"}),
    # cpu-dist-name: the `vllm serve` launcher runs even where only the CPU wheel is installed.
    features=frozenset({*(n.feature for n in NEEDS.values() if n.feature), "cpu-dist-name"}),
    patches=("everything",),
    source="a test manifest with every capability",
)


PATCHES = Path(__file__).resolve().parents[3] / "patches"


def series_caps(*, without: str | None = None,
                extra_features: tuple[str, ...] = ()) -> Capabilities:
    """What a build of patches/series provides, read from the patch headers as its manifest is
    (``without``: that patch file left out; ``extra_features``: capabilities no patch here has,
    for the rows that need them)."""
    from qwen3090.patchtool import load_series

    patches = [p for p in load_series(PATCHES).patches if p.file != without]
    return Capabilities(
        env=frozenset(e for p in patches for e in p.header.env),
        flags=frozenset(f for p in patches for f in p.header.flags),
        features=frozenset({*(f for p in patches for f in p.header.features), *extra_features}),
        patches=tuple(p.file for p in patches),
        source=f"patches/series{f' without {without}' if without else ''}",
    )


def plan_for(
    env: Mapping[str, str] | None = None,
    *,
    cli: Mapping[str, str | None] | None = None,
    caps: Capabilities = FULL,
    facts: PlatformFacts | None = None,
    cwd: Path | None = None,
) -> ServePlan:
    """Resolve knobs given as environment variables (the original launchers' interface)."""
    settings = load_settings(environ=env or {}, cli=cli)
    base = facts or PlatformFacts()
    if cwd is not None:
        base = dataclasses.replace(base, cwd=cwd)
    return resolve(settings, caps, base)


def arg_map(args: tuple[str, ...] | list[str]) -> dict[str, str | None]:
    """``--flag value`` pairs after the model; a flag followed by another flag maps to None.

    Fails on a repeated flag: a plan must say each thing once."""
    out: dict[str, str | None] = {}
    rest = list(args[1:])
    i = 0
    while i < len(rest):
        flag = rest[i]
        assert flag.startswith("--"), f"expected a flag at {i}: {flag!r} in {rest}"
        assert flag not in out, f"{flag} appears twice"
        if i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            out[flag] = rest[i + 1]
            i += 2
        else:
            out[flag] = None
            i += 1
    return out


def json_flag(plan: ServePlan, flag: str) -> Any:
    value = plan.flag(flag)
    assert value is not None, f"{flag} missing"
    return json.loads(value)


__all__ = ["FULL", "STOCK", "arg_map", "json_flag", "plan_for"]
