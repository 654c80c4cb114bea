"""Typed, validated knob values: what the user asked for, before any profile default.

Every field is ``None`` when the knob was not given by any source; the resolver
(``qwen3090.plan``) fills in the profile's defaults and must be able to tell a value the user
chose from a default, because the two are treated differently when a capability is missing
(DESIGN.md "capability gating"): an explicit value is an error, a default is dropped with a
warning. ``sources`` says where each given value came from (for error messages).

How values are collected and which source wins: see ``qwen3090.knobs``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal

from qwen3090.knobs import Collected, collect

Spec = Literal["mtp", "dflash2", "off"]
Ctx = Literal["fast", "long", "huge"]
Kv = Literal["fp8", "int4pth", "kvarn"]
Profile = Literal["single-user", "batch"]
Device = Literal["cuda", "cpu"]


@dataclass(frozen=True)
class Settings:
    """The knobs of PROFILES.md, as given (None: not given anywhere)."""

    profile: Profile | None = None
    """Serving profile: ``single-user`` (default) or ``batch``."""
    device: Device | None = None
    """``cuda`` (default) or ``cpu``: the same plan with the CPU rule set applied."""
    spec: Spec | None = None
    """single-user speculator: ``mtp`` (default), ``dflash2`` or ``off`` (a real mode)."""
    ctx: Ctx | None = None
    """single-user context tier ``fast`` (default), ``long`` or ``huge``: length, KV dtype,
    attention backend."""
    dflash_tokens: int | None = None
    """dflash2 draft block length k (default 7)."""
    draft_tokens: int | None = None
    """mtp draft tokens (default 4 at CTX=fast, 3 at long and huge)."""
    kv_mem: int | Literal[""] | None = None
    """KV pool pinned in bytes (``--kv-cache-memory-bytes``); ``""`` sizes the pool from
    GPU_UTIL instead."""
    max_seqs: int | None = None
    """``--max-num-seqs``."""
    max_len: int | None = None
    """``--max-model-len``."""
    dflash_max_len: int | None = None
    """``--max-model-len`` under SPEC=dflash2 (wins over MAX_LEN there)."""
    cg: int | None = None
    """``max_cudagraph_capture_size`` of the compilation config; given explicitly it also lifts
    dflash2's cap of 64 (gotcha 34)."""
    gpu_util: float | None = None
    """``--gpu-memory-utilization`` (used when the pool is not pinned in bytes)."""
    prefix_cache: bool | None = None
    """Prefix caching with ``--mamba-cache-mode align`` (default off)."""
    lookup: bool | None = None
    """dflash2 lookup drafting, ``VLLM_DFLASH2_LOOKUP`` (default on; a patch)."""
    lookup_adaptive: bool | None = None
    """dflash2 adaptive verify length, ``VLLM_DFLASH2_LOOKUP_ADAPTIVE`` (a patch)."""
    async_sched: bool | None = None
    """Async scheduling; dflash2 turns it off by default when lookup is on and k > 7."""
    spec_attn: bool | None = None
    """Split-KV verify attention, ``VLLM_SPEC_DECODE_ATTN`` (a patch; default on where the
    profile uses it)."""
    tools: bool | None = None
    """Auto tool choice with TOOL_PARSER (default on)."""
    tool_parser: str | None = None
    """``--tool-call-parser`` (default qwen3_coder: the chat template asks for XML calls)."""
    draft_sample: Literal["probabilistic", "greedy"] | None = None
    """mtp ``draft_sample_method`` (default probabilistic)."""
    cudagraph_mode: str | None = None
    """Compilation config ``cudagraph_mode`` (CTX=huge sets PIECEWISE for non-dflash2)."""
    kv: Kv | None = None
    """batch KV cache: ``fp8`` (default), ``int4pth`` or ``kvarn``."""
    int8_act: str | None = None
    """``VLLM_MARLIN_INPUT_DTYPE`` (batch default int8); ``""``: int8 activations off."""
    int8_layers: str | None = None
    """Layer regex ``VLLM_MARLIN_INT8_INCLUDE_RE`` (batch default mlp); ``""``: off."""
    vision: bool | None = None
    """Keep the vision tower (default off: ``--language-model-only``)."""
    vision_offload: bool | None = None
    """With VISION=1, vision tower weights in host RAM (default on; a patch)."""
    model: str | None = None
    """Target model directory."""
    draft: str | None = None
    """DFlash2 drafter directory."""
    port: int | None = None
    """TCP port (default 18020)."""
    host: str | None = None
    """Bind address (default 127.0.0.1)."""
    api_servers: int | None = None
    """``--api-server-count`` (default 1)."""
    api_key_file: str | None = None
    """A file holding the API key; without it ``$VLLM_API_KEY`` (if set) is the key."""
    extra_args: tuple[str, ...] | None = None
    """Extra vLLM arguments, appended verbatim, last."""
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    """Knob name (upper case) -> where its value came from."""

    def given(self, knob: str) -> bool:
        """True when the user set ``knob`` (upper-case name) in some source."""
        return getattr(self, knob.lower()) is not None

    def source(self, knob: str) -> str:
        return self.sources.get(knob, "a profile default")


KNOB_FIELDS = tuple(f.name for f in fields(Settings) if f.name != "sources")


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
    """Collect every source (see ``qwen3090.knobs``) into :class:`Settings`."""
    env = os.environ if environ is None else environ
    return settings_from(collect(config=config, environ=env, cli=cli or {}))
