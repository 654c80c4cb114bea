"""Every knob of PROFILES.md, declared once: a :class:`Settings` field, its help and its parse rule.

Each field is ``None`` when the knob was not given by any source; the resolver
(``qwen3090.resolver``) fills in the profile's defaults and must be able to tell a value the
user chose from a default, because the two are treated differently when a capability is missing
(DESIGN.md "capability gating"): an explicit value is an error, a default is dropped with a
warning. ``sources`` says where each given value came from (for error messages).

A field's metadata (:func:`knob`) carries its one-line help and its :class:`Rule`; the CLI
flags, the YAML keys, the environment names and ``qwen3090 knobs --json`` are all derived from
these fields (``KNOBS``). The allowed words of a choice knob are its ``Literal`` type.
How values are collected and which source wins: see ``qwen3090.knobs``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

Spec = Literal["mtp", "dflash2", "off"]
Ctx = Literal["fast", "long", "huge"]
Kv = Literal["fp8", "int4pth", "kvarn"]
Profile = Literal["single-user", "batch"]
Device = Literal["cuda", "cpu"]
DraftSample = Literal["probabilistic", "greedy"]
CudagraphMode = Literal["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]
Int8Act = Literal["int8", "fp8"]

Value = str | int | float | bool | tuple[str, ...]
"""What a parsed knob value can be."""

ValueType = Literal["enum", "int", "float", "bool", "str", "args"]


@dataclass(frozen=True)
class Rule:
    """How a knob's raw text becomes its typed value, and what the export says about it."""

    parse: Callable[[str], Value]
    """Turns the raw text into the typed value; raises ValueError with a reason."""
    type: ValueType
    """The value's type, for ``qwen3090 knobs --json`` and the NixOS module's option types."""
    choices: tuple[str, ...] = ()
    """Allowed values, for ``--help`` and the did-you-mean of a bad value."""
    minimum: int | float | None = None
    maximum: int | float | None = None
    empty_is_value: bool = False
    """An empty string is a real value (see ``qwen3090.knobs``), not "not given"."""


@dataclass(frozen=True)
class Knob:
    """One entry of the vocabulary, derived from a :class:`Settings` field."""

    name: str
    """The environment / YAML name (upper case)."""
    help: str
    """One line for ``--help``: what it does and its default."""
    rule: Rule
    from_env: bool = True
    """Read from the environment too (PROFILE and DEVICE are not: such generic names are
    often set for other programs, and the original launchers never read them)."""

    @property
    def flag(self) -> str:
        return "--" + self.name.lower().replace("_", "-")

    @property
    def attr(self) -> str:
        return self.name.lower()

    @property
    def choices(self) -> tuple[str, ...]:
        return self.rule.choices

    @property
    def empty_is_value(self) -> bool:
        return self.rule.empty_is_value

    def parse(self, text: str) -> Value:
        return self.rule.parse(text)


# ---- parse rules ------------------------------------------------------------------------------


def choice(literal: Any, *, empty: bool = False) -> Rule:
    """One of the words of a ``Literal`` type (case-insensitive); ``empty``: ``""`` too."""
    allowed: tuple[str, ...] = get_args(literal)

    def parse(text: str) -> Value:
        if empty and text == "":
            return ""
        for a in allowed:
            if a.lower() == text.lower():
                return a
        raise ValueError(f"must be one of {', '.join(allowed)}")

    shown = (*allowed, "") if empty else allowed
    return Rule(parse, "enum", shown, empty_is_value=empty)


def whole(minimum: int, maximum: int | None = None) -> Rule:
    def parse(text: str) -> Value:
        try:
            value = int(text.replace("_", ""), 10)
        except ValueError:
            raise ValueError("must be a whole number") from None
        if value < minimum or (maximum is not None and value > maximum):
            upper = f" and at most {maximum}" if maximum is not None else ""
            raise ValueError(f"must be at least {minimum}{upper}")
        return value

    return Rule(parse, "int", minimum=minimum, maximum=maximum)


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


def _bytes_or_empty(text: str) -> Value:
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


def _regex_or_empty(text: str) -> Value:
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


def _path(text: str) -> Value:
    if not text.strip():
        raise ValueError("must be a directory path")
    return text


def _shell_words(text: str) -> Value:
    try:
        return tuple(shlex.split(text))
    except ValueError as err:
        raise ValueError(f"is not valid shell quoting ({err})") from None


FRACTION = Rule(_fraction, "float", minimum=0.0, maximum=1.0)
BOOL = Rule(_bool, "bool")
BYTES_OR_EMPTY = Rule(_bytes_or_empty, "int", minimum=1, empty_is_value=True)
REGEX_OR_EMPTY = Rule(_regex_or_empty, "str", empty_is_value=True)
TEXT = Rule(_text, "str")
HOST = Rule(_host, "str")
PATH = Rule(_path, "str")
SHELL_WORDS = Rule(_shell_words, "args", empty_is_value=True)


def knob(help: str, rule: Rule, *, from_env: bool = True) -> Any:
    """A :class:`Settings` field declaring one knob (default None: not given)."""
    return field(default=None, metadata={"knob": (help, rule, from_env)})


# ---- the vocabulary ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """The knobs of PROFILES.md, as given (None: not given anywhere)."""

    profile: Profile | None = knob(
        "serving profile: single-user (default) or batch", choice(Profile), from_env=False)
    device: Device | None = knob(
        "cuda (default) or cpu: the same plan with the CPU rule set applied (vLLM's CPU build; "
        "a demo model)", choice(Device), from_env=False)
    spec: Spec | None = knob(
        "single-user speculator: mtp (default; off on --device cpu), dflash2 or off",
        choice(Spec))
    ctx: Ctx | None = knob(
        "single-user context tier: fast (default), long or huge (length, KV dtype, attention "
        "backend)", choice(Ctx))
    dflash_tokens: int | None = knob("dflash2 draft block length k (default 7)", whole(1, 64))
    draft_tokens: int | None = knob(
        "mtp draft tokens (default 4 at CTX=fast, 3 at long and huge)", whole(1, 16))
    kv_mem: int | Literal[""] | None = knob(
        "KV pool pinned in bytes, --kv-cache-memory-bytes (dflash2 pins it by default); "
        "empty: size the pool from GPU_UTIL", BYTES_OR_EMPTY)
    max_seqs: int | None = knob(
        "--max-num-seqs, maximum concurrent sequences (profile default)", whole(1, 1024))
    max_len: int | None = knob(
        "--max-model-len, maximum model length in tokens (profile default)", whole(1))
    dflash_max_len: int | None = knob(
        "--max-model-len under SPEC=dflash2, winning over MAX_LEN there (table default)",
        whole(1))
    cg: int | None = knob(
        "largest CUDA-graph capture size (profile default; dflash2: MAX_SEQS*(k+1) capped at "
        "64, a cap an explicit CG lifts, gotcha 34)", whole(1, 4096))
    graph_mem_mib: int | None = knob(
        "dflash2: MiB of CUDA-graph memory the V2 runner reserves beside the pool, "
        "VLLM_V2_CUDAGRAPH_MEM_MIB (default by k: 1400 up to 7, 1900 up to 15, then the "
        "measured growth, gotcha 25; a patch)", whole(0, 24576))
    gpu_util: float | None = knob(
        "--gpu-memory-utilization when the pool is not pinned in bytes (0.93 single-user; "
        "batch by KV)", FRACTION)
    prefix_cache: bool | None = knob(
        "1: prefix caching with --mamba-cache-mode align (default 0)", BOOL)
    lookup: bool | None = knob(
        "dflash2 lookup drafting, VLLM_DFLASH2_LOOKUP (default 1; needs its patch)", BOOL)
    lookup_adaptive: bool | None = knob(
        "dflash2 adaptive verify length, VLLM_DFLASH2_LOOKUP_ADAPTIVE (patch default unless a "
        "rule sets it)", BOOL)
    async_sched: bool | None = knob(
        "async scheduling (dflash2: 0 when lookup is on and k > 7, else 1)", BOOL)
    spec_attn: bool | None = knob(
        "split-KV verify attention, VLLM_SPEC_DECODE_ATTN (default 1 where the profile uses "
        "it; a patch)", BOOL)
    tools: bool | None = knob("1 (default): --enable-auto-tool-choice with TOOL_PARSER", BOOL)
    tool_parser: str | None = knob(
        "--tool-call-parser (default qwen3_coder: the chat template asks for XML calls)", TEXT)
    draft_sample: DraftSample | None = knob(
        "mtp draft_sample_method: probabilistic (default) or greedy", choice(DraftSample))
    cudagraph_mode: CudagraphMode | None = knob(
        "compilation config cudagraph_mode (CTX=huge without dflash2: PIECEWISE)",
        choice(CudagraphMode))
    kv: Kv | None = knob("batch KV cache: fp8 (default), int4pth or kvarn", choice(Kv))
    int8_act: Int8Act | Literal[""] | None = knob(
        "VLLM_MARLIN_INPUT_DTYPE, Marlin activation dtype int8 (batch default) or fp8; "
        "empty: int8 activations off", choice(Int8Act, empty=True))
    int8_layers: str | None = knob(
        "layer regex VLLM_MARLIN_INT8_INCLUDE_RE of int8 activations: mlp (batch default), "
        "gate_up, '.' (all); empty: off", REGEX_OR_EMPTY)
    vision: bool | None = knob(
        "1: keep the vision tower (default 0: --language-model-only)", BOOL)
    vision_offload: bool | None = knob(
        "with VISION=1: vision tower weights in host RAM (default 1; needs its patch)", BOOL)
    model: str | None = knob(
        "target model directory (default $QWEN3090_MODELS_DIR/Qwen3.8-27B-W4A16-AutoRound-fast, "
        "else ...-AutoRound; $QWEN3090_MODELS_DIR defaults to models)", PATH)
    draft: str | None = knob(
        "DFlash2 drafter directory (default $QWEN3090_MODELS_DIR/Qwen3.8-27B-DFlash2-W4A16, "
        "else ...-DFlash2)", PATH)
    port: int | None = knob("TCP port (default 18020)", whole(1, 65535))
    host: str | None = knob("bind address (default 127.0.0.1)", HOST)
    api_servers: int | None = knob("--api-server-count (default 1)", whole(1, 64))
    api_key_file: str | None = knob(
        "file holding the API key (else $VLLM_API_KEY; neither: no authentication)", PATH)
    extra_args: tuple[str, ...] | None = knob(
        "extra vLLM arguments, appended verbatim, last (as a flag: --extra-args='--seed 3')",
        SHELL_WORDS)
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    """Knob name (upper case) -> where its value came from."""

    def given(self, knob: str) -> bool:
        """True when the user set ``knob`` (upper-case name) in some source."""
        return getattr(self, KNOB_BY_NAME[knob].attr) is not None

    def source(self, knob: str) -> str:
        """Where ``knob``'s value came from; a misspelt name is a KeyError, not a default."""
        return self.sources.get(KNOB_BY_NAME[knob].name, "a profile default")


def _knobs() -> tuple[Knob, ...]:
    out: list[Knob] = []
    for f in fields(Settings):
        if "knob" in f.metadata:
            help_text, rule, from_env = f.metadata["knob"]
            out.append(Knob(f.name.upper(), help_text, rule, from_env))
    return tuple(out)


KNOBS: tuple[Knob, ...] = _knobs()
KNOB_BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
NAMES: tuple[str, ...] = tuple(k.name for k in KNOBS)
