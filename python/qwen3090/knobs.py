"""Where knob values come from, and everything derived from the knob declarations.

The vocabulary is declared once, as the fields of ``qwen3090.settings.Settings``; this module
derives the CLI flags, the YAML validation and the ``qwen3090 knobs --json`` export from it.
Four sources. Precedence, lowest first:

1. the profile's defaults (``qwen3090.profiles``; applied by the resolver, never here),
2. the YAML settings file given with ``--config FILE`` (what the NixOS module renders),
3. the environment (``SPEC=dflash2 qwen3090 serve``, the original launchers' interface),
4. command-line flags (``--spec dflash2``).

A later source wins knob by knob. YAML keys are the knob names in either case (``SPEC`` or
``spec``); an unknown key is an error with a did-you-mean. In the environment and on the
command line an EMPTY value means "not given" (the shell idiom ``${SPEC:-mtp}``), except for
the knobs where empty is itself a value: ``KV_MEM=`` (size the pool from ``GPU_UTIL``),
``INT8_ACT=`` / ``INT8_LAYERS=`` (int8 activations off) and ``EXTRA_ARGS=`` (nothing).

Every value is validated here, before anything touches a GPU or a model directory; a bad one
raises :class:`~qwen3090.errors.Qwen3090Error` naming the knob, its source and the fix.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwen3090.errors import Qwen3090Error
from qwen3090.profiles import KNOB_DEFAULTS
from qwen3090.settings import KNOB_BY_NAME, KNOBS, NAMES, Knob, Settings, Value

__all__ = ["KNOBS", "KNOB_BY_NAME", "NAMES", "Knob", "Value", "collect", "load_settings"]


def _did_you_mean(name: str) -> str:
    close = difflib.get_close_matches(name.upper(), NAMES, n=1, cutoff=0.6)
    return f"did you mean {close[0]}?" if close else f"known knobs: {', '.join(NAMES)}"


def parse_value(knob: Knob, raw: object, source: str) -> Value | None:
    """Validate one raw value; None means "not given" (an empty value of most knobs)."""
    if isinstance(raw, bool):
        # YAML 1.1 reads a bare `SPEC: off` as false; that is the word the user wrote.
        text = "off" if (raw is False and "off" in knob.choices) else ("1" if raw else "0")
    elif isinstance(raw, int | float):
        text = repr(raw) if isinstance(raw, float) else str(raw)
    elif raw is None:
        return None  # YAML null: not given (an empty string is how YAML says "empty")
    elif isinstance(raw, str):
        text = raw
    elif isinstance(raw, list | tuple) and knob.rule.type == "args":
        return tuple(str(a) for a in raw)
    else:
        raise Qwen3090Error(
            f"{knob.name} from {source}: expected a scalar, got {type(raw).__name__}",
            fix=f"give {knob.name} a single value in the --config file (a list only for "
            "EXTRA_ARGS)",
        )
    text = text.strip() if knob.rule.type != "args" else text
    if text == "" and not knob.empty_is_value:
        return None
    try:
        return knob.parse(text)
    except ValueError as err:
        hint = f" ({', '.join(repr(c) for c in knob.choices)})" if knob.choices else ""
        raise Qwen3090Error(
            f"{knob.name}={text!r} from {source}: {err}",
            fix=f"set {knob.name} ({knob.flag}, the {knob.name} variable or --config key) to a "
            f"valid value{hint}, or leave it unset for the default",
        ) from None


@dataclass(frozen=True)
class Collected:
    """Knob values after precedence: the winning value and the source it came from."""

    values: Mapping[str, Value]
    sources: Mapping[str, str]


def read_yaml(path: Path) -> dict[str, object]:
    """The knob mapping of a YAML settings file, keys upper-cased and checked."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise Qwen3090Error(
            f"cannot read the settings file {path}: {err.strerror}",
            fix="pass an existing YAML file to --config",
        ) from None
    except yaml.YAMLError as err:
        raise Qwen3090Error(
            f"the settings file {path} is not valid YAML: {err}",
            fix="fix the YAML syntax of the file passed to --config"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise Qwen3090Error(
            f"the settings file {path} must be a mapping of knob names to values",
            fix="write the --config file as `SPEC: dflash2` lines (or lower-case keys)",
        )
    out: dict[str, object] = {}
    for key, value in data.items():
        name = str(key).upper().replace("-", "_")
        if name not in KNOB_BY_NAME:
            raise Qwen3090Error(
                f"unknown knob {key!r} in the settings file {path}", fix=_did_you_mean(name)
            )
        if name in out:
            raise Qwen3090Error(
                f"knob {name} is given twice in the settings file {path}",
                fix="keep one of the two keys in the --config file",
            )
        out[name] = value
    return out


def collect(
    *,
    config: Path | None,
    environ: Mapping[str, str],
    cli: Mapping[str, str | None],
) -> Collected:
    """Apply the precedence YAML < environment < CLI to the raw values of every knob.

    ``cli`` maps knob names to the raw text of their flags (None: flag not given).
    """
    values: dict[str, Value] = {}
    sources: dict[str, str] = {}
    layers: list[tuple[str, Mapping[str, object]]] = []
    if config is not None:
        layers.append((f"the settings file {config}", read_yaml(config)))
    env = {k.name: environ[k.name] for k in KNOBS if k.from_env and k.name in environ}
    layers.append(("the environment", env))
    layers.append(("the command line", {n: v for n, v in cli.items() if v is not None}))
    for source, raw in layers:
        for name, rawvalue in raw.items():
            knob = KNOB_BY_NAME[name]
            parsed = parse_value(knob, rawvalue, source)
            if parsed is None:
                continue
            values[name] = parsed
            sources[name] = source
    return Collected(values, sources)


def add_knob_arguments(parser: argparse.ArgumentParser) -> None:
    """One ``--knob-name VALUE`` flag per knob, values validated like the environment's."""
    group = parser.add_argument_group(
        "knobs",
        "each flag sets the knob of the same name (PROFILES.md); precedence, lowest first: "
        "profile default < --config YAML < environment variable < this flag",
    )
    for knob in KNOBS:
        group.add_argument(
            knob.flag, dest=f"knob_{knob.name}", default=None, metavar=knob.name,
            help=knob.help,
        )


def cli_values(args: argparse.Namespace) -> dict[str, str | None]:
    """The raw flag values of :func:`add_knob_arguments`, keyed by knob name."""
    ns: dict[str, Any] = vars(args)
    return {k.name: ns.get(f"knob_{k.name}") for k in KNOBS}


def settings_from(collected: Collected) -> Settings:
    """Build :class:`Settings` from collected knob values (already validated)."""
    kwargs = {name.lower(): value for name, value in collected.values.items()}
    return Settings(**kwargs, sources=dict(collected.sources))  # type: ignore[arg-type]


def load_settings(
    *,
    config: Path | None = None,
    environ: Mapping[str, str] | None = None,
    cli: Mapping[str, str | None] | None = None,
) -> Settings:
    """Collect every source into :class:`Settings`."""
    env = os.environ if environ is None else environ
    return settings_from(collect(config=config, environ=env, cli=cli or {}))


def export() -> list[dict[str, Any]]:
    """Every knob as data: what ``qwen3090 knobs --json`` prints and the NixOS module's option
    types are held against. ``default`` is None where the profile tables decide it."""
    out: list[dict[str, Any]] = []
    for k in KNOBS:
        r = k.rule
        out.append({
            "name": k.name,
            "flag": k.flag,
            "yaml_key": k.name,
            "env": k.name if k.from_env else None,
            "type": r.type,
            "choices": list(r.choices) if r.choices else None,
            "minimum": r.minimum,
            "maximum": r.maximum,
            "empty_is_value": r.empty_is_value,
            "default": KNOB_DEFAULTS.get(k.name),
            "help": k.help,
        })
    return out


def export_json() -> str:
    return json.dumps(export(), indent=2)
