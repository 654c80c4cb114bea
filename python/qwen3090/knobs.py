"""The knob vocabulary and where knob values come from.

One vocabulary (PROFILES.md), four sources. Precedence, lowest first:

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
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwen3090.errors import Qwen3090Error

# What a parsed knob value can be.
Value = str | int | float | bool | tuple[str, ...]


@dataclass(frozen=True)
class Knob:
    """One entry of the vocabulary."""

    name: str
    """The environment / YAML name (upper case)."""
    help: str
    """One line for ``--help``: what it does and its default."""
    parse: Callable[[str], Value]
    """Turns the raw text into the typed value; raises ValueError with a reason."""
    choices: tuple[str, ...] = ()
    """Allowed values, for ``--help`` and the did-you-mean of a bad value."""
    empty_is_value: bool = False
    """An empty string is a real value (see the module docstring), not "not given"."""
    from_env: bool = True
    """Read from the environment too (PROFILE and DEVICE are not: such generic names are
    often set for other programs, and the original launchers never read them)."""

    @property
    def flag(self) -> str:
        return "--" + self.name.lower().replace("_", "-")

    @property
    def attr(self) -> str:
        return self.name.lower()


def _choice(*allowed: str) -> Callable[[str], Value]:
    def parse(text: str) -> Value:
        if text in allowed:
            return text
        lowered = text.lower()
        for a in allowed:
            if a.lower() == lowered:
                return a
        raise ValueError(f"must be one of {', '.join(allowed)}")

    return parse


def _int(minimum: int, maximum: int | None = None) -> Callable[[str], Value]:
    def parse(text: str) -> Value:
        try:
            value = int(text.replace("_", ""), 10)
        except ValueError:
            raise ValueError("must be a whole number") from None
        if value < minimum or (maximum is not None and value > maximum):
            upper = f" and at most {maximum}" if maximum is not None else ""
            raise ValueError(f"must be at least {minimum}{upper}")
        return value

    return parse


def _fraction(text: str) -> Value:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("must be a number between 0 and 1") from None
    if not 0.0 < value <= 1.0:
        raise ValueError("must be greater than 0 and at most 1")
    return value


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _bool(text: str) -> Value:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError("must be 1 or 0 (also true/false, yes/no, on/off)")


def _kv_mem(text: str) -> Value:
    if text == "":
        return ""
    try:
        value = int(text.replace("_", ""), 10)
    except ValueError:
        raise ValueError(
            "must be a whole number of bytes (e.g. 5583457484), or empty to size the pool "
            "from GPU_UTIL"
        ) from None
    if value < 1:
        raise ValueError("must be a positive number of bytes")
    return value


def _int8_act(text: str) -> Value:
    if text == "":
        return ""
    return _choice("int8", "fp8")(text)


def _regex(text: str) -> Value:
    if text == "":
        return ""
    try:
        re.compile(text)
    except re.error as err:
        raise ValueError(f"is not a valid regular expression ({err})") from None
    return text


def _text(text: str) -> Value:
    if not text.strip():
        raise ValueError("must not be blank")
    return text


def _host(text: str) -> Value:
    if not text.strip() or any(c.isspace() for c in text):
        raise ValueError("must be a host name or address without spaces")
    return text


def _model_path(text: str) -> Value:
    if not text.strip():
        raise ValueError("must be a directory path")
    return text


def _args(text: str) -> Value:
    try:
        return tuple(shlex.split(text))
    except ValueError as err:
        raise ValueError(f"is not valid shell quoting ({err})") from None


SPECS = ("mtp", "dflash2", "off")
CTXS = ("fast", "long", "huge")
KVS = ("fp8", "int4pth", "kvarn")
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
PROFILES = ("single-user", "batch")
DEVICES = ("cuda", "cpu")

KNOBS: tuple[Knob, ...] = (
    Knob("PROFILE", "serving profile (default single-user)", _choice(*PROFILES), PROFILES,
         from_env=False),
    Knob("DEVICE", "cuda (default) or cpu (vLLM's CPU build; a demo model)", _choice(*DEVICES),
         DEVICES, from_env=False),
    Knob("SPEC", "single-user speculator: mtp (default), dflash2 or off", _choice(*SPECS), SPECS),
    Knob("CTX", "single-user context tier: fast (default), long or huge", _choice(*CTXS), CTXS),
    Knob("DFLASH_TOKENS", "dflash2 draft block k (default 7)", _int(1, 64)),
    Knob("DRAFT_TOKENS", "mtp draft tokens (default 4 at CTX=fast, 3 otherwise)", _int(1, 16)),
    Knob("KV_MEM", "KV pool in bytes (dflash2 pins it by default); empty: size it from GPU_UTIL",
         _kv_mem, empty_is_value=True),
    Knob("MAX_SEQS", "maximum concurrent sequences (profile default)", _int(1, 1024)),
    Knob("MAX_LEN", "maximum model length in tokens (profile default)", _int(1)),
    Knob("DFLASH_MAX_LEN", "maximum model length under SPEC=dflash2 (table default)", _int(1)),
    Knob("CG", "largest CUDA-graph capture size (profile default; dflash2: MAX_SEQS*(k+1), "
         "capped at 64)", _int(1, 4096)),
    Knob("GPU_UTIL", "--gpu-memory-utilization (0.93 single-user; batch by KV)", _fraction),
    Knob("PREFIX_CACHE", "1: prefix caching with the mamba align cache (default 0)", _bool),
    Knob("LOOKUP", "dflash2 lookup drafting (default 1; needs the lookup patch)", _bool),
    Knob("LOOKUP_ADAPTIVE", "dflash2 adaptive verify length (patch default unless a rule "
         "sets it)", _bool),
    Knob("ASYNC_SCHED", "async scheduling (dflash2: 0 when lookup is on and k > 7, else 1)",
         _bool),
    Knob("SPEC_ATTN", "split-KV verify attention VLLM_SPEC_DECODE_ATTN (default 1 where the "
         "profile uses it)", _bool),
    Knob("TOOLS", "1 (default): --enable-auto-tool-choice with TOOL_PARSER", _bool),
    Knob("TOOL_PARSER", "tool-call parser (default qwen3_coder)", _text),
    Knob("DRAFT_SAMPLE", "mtp draft sampling: probabilistic (default) or greedy",
         _choice("probabilistic", "greedy"), ("probabilistic", "greedy")),
    Knob("CUDAGRAPH_MODE", "compilation config cudagraph_mode (CTX=huge non-dflash2 default "
         "PIECEWISE)", _choice(*CUDAGRAPH_MODES), CUDAGRAPH_MODES),
    Knob("KV", "batch KV cache: fp8 (default), int4pth or kvarn", _choice(*KVS), KVS),
    Knob("INT8_ACT", "Marlin activation dtype int8 (batch default) or fp8; empty: off",
         _int8_act, ("int8", "fp8", ""), empty_is_value=True),
    Knob("INT8_LAYERS", "regex of layers with int8 activations: mlp (batch default), gate_up, "
         "'.' (all); empty: off", _regex, empty_is_value=True),
    Knob("VISION", "1: keep the vision tower (default 0: --language-model-only)", _bool),
    Knob("VISION_OFFLOAD", "with VISION=1: vision tower weights in host RAM (default 1; "
         "needs its patch)", _bool),
    Knob("MODEL", "target model directory (default models/Qwen3.8-27B-W4A16-AutoRound-fast, "
         "else ...-AutoRound)", _model_path),
    Knob("DRAFT", "DFlash2 drafter directory (default models/Qwen3.8-27B-DFlash2-W4A16, else "
         "...-DFlash2)", _model_path),
    Knob("PORT", "TCP port (default 18020)", _int(1, 65535)),
    Knob("HOST", "bind address (default 127.0.0.1)", _host),
    Knob("API_SERVERS", "--api-server-count (default 1)", _int(1, 64)),
    Knob("API_KEY_FILE", "file holding the API key (else $VLLM_API_KEY; none: no auth)",
         _model_path),
    Knob("EXTRA_ARGS", "extra vLLM arguments, appended verbatim, last (as a flag: "
         "--extra-args='--seed 3')", _args,
         empty_is_value=True),
)

KNOB_BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
NAMES: tuple[str, ...] = tuple(k.name for k in KNOBS)


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
    elif isinstance(raw, list | tuple) and knob.name == "EXTRA_ARGS":
        return tuple(str(a) for a in raw)
    else:
        raise Qwen3090Error(
            f"{knob.name} from {source}: expected a scalar, got {type(raw).__name__}",
            fix=f"give {knob.name} a single value",
        )
    text = text.strip() if knob.name != "EXTRA_ARGS" else text
    if text == "" and not knob.empty_is_value:
        return None
    try:
        return knob.parse(text)
    except ValueError as err:
        hint = f" ({', '.join(repr(c) for c in knob.choices)})" if knob.choices else ""
        raise Qwen3090Error(
            f"{knob.name}={text!r} from {source}: {err}",
            fix=f"set {knob.name} to a valid value{hint}, or leave it unset for the default",
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
            f"the settings file {path} is not valid YAML: {err}", fix="fix the YAML syntax"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise Qwen3090Error(
            f"the settings file {path} must be a mapping of knob names to values",
            fix="write it as `SPEC: dflash2` lines (or lower-case keys)",
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
                fix="keep one of the two keys",
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
