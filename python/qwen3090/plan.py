"""The resolver: Settings + build capabilities -> ServePlan (vLLM args, env, warnings, memory).

Every rule and warning of PROFILES.md lives here, in the order the document gives them; the
numbers come from ``qwen3090.profiles``. Choices PROFILES.md leaves open, made here:

- ``PREFIX_CACHE=0`` passes ``--no-enable-prefix-caching`` (vLLM would otherwise pick its own
  default per model); ``--enable-prompt-tokens-details`` is passed either way (gotcha 39).
- ``SPEC=off`` uses the mtp seat count and capture size (MAX_SEQS 8, CG 32).
- int8 activations default on only in ``batch`` (the table's section); in ``single-user`` they
  are off unless ``INT8_ACT`` is given, with ``INT8_LAYERS`` then defaulting to ``mlp``.
- The pool is pinned (``--kv-cache-memory-bytes``) where the table pins it (dflash2) or where
  ``KV_MEM`` is given; otherwise ``--gpu-memory-utilization``. Never both: vLLM ignores the
  fraction once the bytes are pinned, and a flag nothing reads is noise.
- A patch variable whose value only restates stock behaviour (``VLLM_SPEC_DECODE_ATTN=0``,
  ``LOOKUP=0``) is left out without a warning on a build that lacks the patch.

The API key never enters the plan: ``serve`` puts it into the child's environment.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import qwen3090.cpu_rules as cpu_rules
from qwen3090 import profiles as P
from qwen3090.capabilities import NEEDS, STOCK, Capabilities, missing_error
from qwen3090.errors import Qwen3090Error
from qwen3090.settings import Settings

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@dataclass(frozen=True)
class PlatformFacts:
    """What the plan needs to know about the machine (injected, so plans are testable)."""

    wsl2: bool = False
    """Running under WSL2 (gotchas 3, 35, 53)."""
    foreign_gpu_mib: int | None = None
    """GPU memory other processes hold now; None when unknown (gotcha 31)."""
    api_key_env: bool = False
    """``$VLLM_API_KEY`` is set (authentication without a key file)."""
    cwd: Path = field(default_factory=Path.cwd)
    """Where the default model directories are looked up."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Gotcha 25's model of one request: 64 KiB x context + 102 MiB x (k + 2) at bf16."""

    kv_bytes_per_token: int
    """Whole-model KV bytes per token for the plan's KV dtype."""
    fixed_bytes_per_request: int
    """102 MiB x (k + 2): the aligned recurrent-state pages (k = 0 without a speculator)."""
    request_bytes_at_max_len: int
    """One request filling ``--max-model-len``."""
    pool_bytes: int | None
    """The pinned KV pool, or None when vLLM sizes it from the memory fraction."""
    full_length_requests: float | None
    """How many max-length requests the pinned pool holds."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "formula": "kv_bytes_per_token x context + 102 MiB x (k + 2)",
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "fixed_bytes_per_request": self.fixed_bytes_per_request,
            "request_bytes_at_max_len": self.request_bytes_at_max_len,
            "pool_bytes": self.pool_bytes,
            "full_length_requests": self.full_length_requests,
        }


@dataclass(frozen=True)
class ServePlan:
    """What ``serve`` runs, decided completely before anything starts."""

    profile: str
    device: str
    model: str
    """The target model directory (``vllm_args[0]``)."""
    draft: str | None
    """The DFlash2 drafter directory, when SPEC=dflash2."""
    vllm_args: tuple[str, ...]
    """Exactly what follows ``vllm serve``: the model first, then flags."""
    env: Mapping[str, str]
    """Variables ``serve`` sets for vLLM (on top of the inherited environment)."""
    warnings: tuple[str, ...]
    memory: MemoryEstimate
    port: int
    host: str
    api_key_file: str | None
    argv: tuple[str, ...] = ()
    """The full command ``serve`` execs (filled in by ``qwen3090.serve.command_for``)."""

    def flag(self, name: str) -> str | None:
        """The value following ``name`` in vllm_args (last occurrence); None if absent."""
        args = list(self.vllm_args)
        for i in range(len(args) - 1, -1, -1):
            if args[i] == name:
                return args[i + 1] if i + 1 < len(args) else ""
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "device": self.device,
            "model": self.model,
            "draft": self.draft,
            "vllm_args": list(self.vllm_args),
            "env": dict(self.env),
            "warnings": list(self.warnings),
            "argv": list(self.argv),
            "memory": self.memory.to_dict(),
            "host": self.host,
            "port": self.port,
            "auth": "api-key-file" if self.api_key_file else "VLLM_API_KEY or none",
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


@dataclass
class Draft:
    """The plan while rules still change it (the CPU rule set edits this)."""

    profile: str
    device: str
    model: str
    draft: str | None = None
    host: str = P.DEFAULT_HOST
    port: int = P.DEFAULT_PORT
    api_servers: int = 1
    language_model_only: bool = True
    max_len: int = 0
    max_seqs: int = 0
    kv_mem: int | None = None
    gpu_util: float = 0.0
    attention_backend: str | None = None
    kv_cache_dtype: str | None = None
    block_size: int | None = None
    mamba_ssm_cache_dtype: str = P.MAMBA_SSM_CACHE_DTYPE
    prefix_cache: bool = False
    prefix_match_unit: int | None = None
    speculative: dict[str, Any] | None = None
    num_spec_tokens: int = 0
    async_scheduling: bool | None = None
    cg: int = 0
    """max_cudagraph_capture_size; 0 leaves it out (the CPU build captures no graphs)."""
    cudagraph_mode: str | None = None
    tool_parser: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    warnings: list[str] = field(default_factory=list)
    api_key_file: str | None = None
    dropped: dict[str, list[str]] = field(default_factory=dict)
    """Capability -> the ``NAME=value`` items dropped for its lack (one warning each)."""


class _Gate:
    """Capability checks with the explicit/default semantics of ``qwen3090.capabilities``."""

    def __init__(self, caps: Capabilities, draft: Draft) -> None:
        self.caps = caps
        self.draft = draft

    def allow(
        self, need_name: str, value: str, *, knob: str | None, explicit: bool,
        setting: str | None = None,
    ) -> bool:
        """True: emit it. False: dropped (recorded). Raises when an explicit knob needs it.

        ``value`` is what the plan would emit; ``setting`` is the knob's own value when the two
        differ (CTX=huge selects the KVarN dtype), so the error names what the user typed."""
        need = NEEDS[need_name]
        if self.caps.has(need):
            return True
        if explicit and knob is not None:
            raise missing_error(need, knob, value if setting is None else setting, self.caps)
        self.draft.dropped.setdefault(need.feature, []).append(f"{need.name}={value}")
        return False

    def env(
        self, name: str, value: str, *, knob: str | None, explicit: bool,
        setting: str | None = None,
    ) -> bool:
        if self.allow(name, value, knob=knob, explicit=explicit, setting=setting):
            self.draft.env[name] = value
            return True
        return False

    def restate_stock(self, name: str, value: str) -> None:
        """A patch variable set to its stock-equivalent value: emit only if readable."""
        if self.caps.has(NEEDS[name]):
            self.draft.env[name] = value


def default_model(cwd: Path) -> str:
    for candidate in P.MODEL_CANDIDATES:
        if (cwd / candidate).is_dir():
            return candidate
    return P.MODEL_CANDIDATES[-1]


def default_draft(cwd: Path) -> str:
    for candidate in P.DRAFT_CANDIDATES:
        if (cwd / candidate / P.DRAFT_WEIGHTS_FILE).is_file():
            return candidate
    return P.DRAFT_CANDIDATES[0]


def _check_model_path(settings: Settings, model: str) -> None:
    # gotcha 14: vLLM 0.28.0 picks the speculative method from the path; refuse before start.
    if "dflash" in model.lower():
        raise Qwen3090Error(
            f"MODEL={model!r} (from {settings.source('MODEL')}) contains 'dflash': vLLM 0.28.0 "
            "picks the speculative method from the model path, so the target would run as "
            "dflash and crash (gotcha 14)",
            fix="rename the model directory (and its parents) so the path lacks 'dflash', then "
            "point MODEL at it",
        )


def _no_effect(settings: Settings, knobs: tuple[str, ...], why: str) -> list[str]:
    return [
        f"{k} (from {settings.source(k)}) has no effect: {why}" for k in knobs if settings.given(k)
    ]


def _common(settings: Settings, facts: PlatformFacts, profile: str, device: str) -> Draft:
    s = settings
    model = s.model if s.model is not None else default_model(facts.cwd)
    _check_model_path(s, model)
    d = Draft(profile=profile, device=device, model=model)
    d.host = s.host or P.DEFAULT_HOST
    d.port = s.port or P.DEFAULT_PORT
    d.api_servers = s.api_servers or 1
    d.language_model_only = not bool(s.vision)
    d.prefix_cache = bool(s.prefix_cache)
    tools = True if s.tools is None else s.tools
    d.tool_parser = (s.tool_parser or P.DEFAULT_TOOL_PARSER) if tools else None
    if not tools:
        d.warnings += _no_effect(s, ("TOOL_PARSER",), "TOOLS=0 turns tool calling off")
    d.extra_args = s.extra_args or ()
    d.api_key_file = s.api_key_file
    d.env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    # gotcha 3: expandable segments need CUDA VMM, which WSL2's paravirtual driver rejects.
    d.env["PYTORCH_CUDA_ALLOC_CONF"] = (
        "expandable_segments:False" if facts.wsl2 else "expandable_segments:True"
    )
    return d


def _vision(settings: Settings, d: Draft, gate: _Gate) -> None:
    s = settings
    if not s.vision:
        d.warnings += _no_effect(s, ("VISION_OFFLOAD",), "VISION is off (--language-model-only)")
        return
    offload = True if s.vision_offload is None else s.vision_offload
    if offload:
        ok = gate.env("VLLM_VISION_TOWER_CPU_OFFLOAD", "1", knob="VISION_OFFLOAD",
                      explicit=s.given("VISION_OFFLOAD"))
        offload = ok
    if not offload and d.speculative is not None and d.speculative.get("method") == "dflash":
        d.warnings.append(
            "VISION=1 with the vision tower resident under SPEC=dflash2: the 0.86 GiB tower "
            "comes out of the ~1.1 GiB transient margin of the pinned pool; the engine boots "
            "at the headroom cliff or dies in graph capture (gotcha 8). Use VISION_OFFLOAD=1 "
            "(its patch) or lower KV_MEM by 1 GiB"
        )


def _int8(settings: Settings, d: Draft, gate: _Gate, *, default_on: bool) -> None:
    s = settings
    act = s.int8_act if s.int8_act is not None else (P.BATCH_INT8_ACT if default_on else "")
    layers = s.int8_layers if s.int8_layers is not None else P.BATCH_INT8_LAYERS
    if act == "" or layers == "":
        # Off means NOT exported: vLLM rejects an empty value at startup.
        if act == "" and s.int8_act is not None:
            d.warnings += _no_effect(s, ("INT8_LAYERS",), "INT8_ACT is empty (int8 off)")
        return
    explicit = s.given("INT8_LAYERS") or s.given("INT8_ACT")
    if layers != ".":
        # Stock vLLM applies VLLM_MARLIN_INPUT_DTYPE to EVERY layer; without the selection
        # patch a default "mlp" would silently become ".", which gotcha 16 says OOMs at 0.972.
        knob, setting = ("INT8_LAYERS", layers) if s.given("INT8_LAYERS") else ("INT8_ACT", act)
        if not gate.allow("VLLM_MARLIN_INT8_INCLUDE_RE", layers, knob=knob, explicit=explicit,
                          setting=setting):
            d.warnings.append(
                f"int8 activations are OFF: INT8_LAYERS={layers} needs the layer-selection "
                "patch, and stock vLLM would quantize every layer instead (gotcha 16)"
            )
            return
        d.env["VLLM_MARLIN_INT8_INCLUDE_RE"] = layers
    elif gate.caps.has(NEEDS["VLLM_MARLIN_INT8_INCLUDE_RE"]):
        d.env["VLLM_MARLIN_INT8_INCLUDE_RE"] = layers
    d.env["VLLM_MARLIN_INPUT_DTYPE"] = act
    if layers == "." and d.gpu_util > P.INT8_ALL_LAYERS_GPU_UTIL:
        d.warnings.append(
            f"INT8_LAYERS=. (every layer) with GPU_UTIL={d.gpu_util}: the extra per-layer "
            "scratch does not fit above 0.95; the engine dies in chunk_fwd_o once ~17 requests "
            "are resident while /health still answers (gotcha 16). Set GPU_UTIL=0.95 or lower"
        )


def _single_user(settings: Settings, facts: PlatformFacts, d: Draft, gate: _Gate) -> None:
    s = settings
    ctx = s.ctx or "fast"
    spec = s.spec or "mtp"
    row = P.CTX_TABLE[ctx]
    d.gpu_util = s.gpu_util if s.gpu_util is not None else P.SINGLE_USER_GPU_UTIL
    d.attention_backend = row.attention_backend
    d.kv_cache_dtype = row.kv_cache_dtype
    d.block_size = row.block_size
    if ctx == "huge":
        gate.allow("--kv-cache-dtype=kvarn_k4v2_g128", row.kv_cache_dtype, knob="CTX",
                   explicit=s.given("CTX"), setting=ctx)
        gate.env("KVARN_POOL_MEM_FRAC", row.kvarn_pool_mem_frac or "", knob="CTX",
                 explicit=s.given("CTX"), setting=ctx)
    spec_attn = True if s.spec_attn is None else s.spec_attn
    spec_attn_row = row.spec_decode_attn
    d.warnings += _no_effect(s, ("KV",), "KV chooses the batch profile's cache; single-user "
                             "takes it from CTX")
    pinned_default: int | None = None

    if spec == "dflash2":
        k = s.dflash_tokens or P.DFLASH_DEFAULT_TOKENS
        long_block = k > P.DFLASH_LONG_BLOCK
        drow = P.dflash_row(ctx, k)
        d.draft = s.draft if s.draft is not None else default_draft(facts.cwd)
        d.num_spec_tokens = k
        d.speculative = {"method": "dflash", "model": d.draft, "num_speculative_tokens": k}
        if ctx == "long":
            d.attention_backend, d.kv_cache_dtype = P.DFLASH_LONG_KV
            spec_attn_row = True
        if ctx == "huge":
            spec_attn_row = False
            gate.restate_stock("VLLM_SPEC_DECODE_ATTN", "0")
            d.warnings += _no_effect(s, ("SPEC_ATTN",), "CTX=huge under dflash2 sets "
                                     "VLLM_SPEC_DECODE_ATTN=0")
        # gotcha 17: the verify scratch is sized once, at startup, for k+1 query rows.
        gate.env("VLLM_SPEC_DECODE_ATTN_QMAX", str(k + 1), knob=None, explicit=False)
        lookup_wanted = True if s.lookup is None else s.lookup
        lookup = False
        if lookup_wanted:
            lookup = gate.env("VLLM_DFLASH2_LOOKUP", "1", knob="LOOKUP",
                              explicit=s.given("LOOKUP"))
        else:
            gate.restate_stock("VLLM_DFLASH2_LOOKUP", "0")
        # gotchas 18, 19: async scheduling pins the verify length the adaptive lookup varies.
        adaptive_block = lookup and long_block
        if s.async_sched is not None:
            d.async_scheduling = s.async_sched
            if s.async_sched and adaptive_block:
                d.warnings.append(
                    f"ASYNC_SCHED=1 with lookup on and DFLASH_TOKENS={k} > 7: async scheduling "
                    "pads every step to num_speculative_tokens, so the adaptive block length "
                    "is silently ignored (gotchas 18, 19)"
                )
        else:
            d.async_scheduling = not adaptive_block
        if s.lookup_adaptive is not None:
            if s.lookup_adaptive:
                gate.env("VLLM_DFLASH2_LOOKUP_ADAPTIVE", "1", knob="LOOKUP_ADAPTIVE",
                         explicit=True)
            else:
                gate.restate_stock("VLLM_DFLASH2_LOOKUP_ADAPTIVE", "0")
            if not lookup:
                d.warnings += _no_effect(s, ("LOOKUP_ADAPTIVE",), "lookup drafting is off")
        elif (
            adaptive_block and ctx == "huge" and d.prefix_cache and not s.given("LOOKUP")
        ) and gate.env("VLLM_DFLASH2_LOOKUP_ADAPTIVE", "0", knob=None, explicit=False):
            d.warnings.append(
                "VLLM_DFLASH2_LOOKUP_ADAPTIVE=0: at CTX=huge with PREFIX_CACHE=1 and "
                f"DFLASH_TOKENS={k} > 7 the adaptive verify length corrupts turn 2 on a "
                "shared prefix; set LOOKUP=1 explicitly to keep the adaptive length anyway"
            )
        d.max_seqs = s.max_seqs or drow.max_seqs
        d.max_len = s.dflash_max_len or s.max_len or drow.max_len
        pinned_default = drow.kv_mem
        d.kv_mem = drow.kv_mem if s.kv_mem is None else (s.kv_mem or None)
        gate.env("VLLM_V2_CUDAGRAPH_MEM_MIB", str(drow.v2_cudagraph_mem_mib), knob=None,
                 explicit=False)
        derived_cg = d.max_seqs * (k + 1)
        if s.cg is not None:
            d.cg = s.cg
            if s.cg > P.DFLASH_CG_CAP:
                d.warnings.append(
                    f"CG={s.cg} > {P.DFLASH_CG_CAP}: VLLM_V2_CUDAGRAPH_MEM_MIB reserves graph "
                    "memory for 64 query tokens; a larger capture boots, answers /health and "
                    "dies on the first concurrent batch (gotcha 34). Raise "
                    "VLLM_V2_CUDAGRAPH_MEM_MIB with it"
                )
        else:
            d.cg = min(derived_cg, P.DFLASH_CG_CAP)
        d.warnings += _no_effect(s, ("DRAFT_TOKENS", "DRAFT_SAMPLE"), "they set the mtp "
                                 "speculator; SPEC=dflash2")
    else:
        k = 0
        if spec == "mtp":
            k = s.draft_tokens or row.mtp_draft_tokens
            d.speculative = {
                "method": "mtp",
                "num_speculative_tokens": k,
                "draft_sample_method": s.draft_sample or P.DEFAULT_DRAFT_SAMPLE,
            }
        else:
            d.warnings += _no_effect(s, ("DRAFT_TOKENS", "DRAFT_SAMPLE"), "SPEC=off")
        d.num_spec_tokens = k
        d.max_seqs = s.max_seqs or P.MTP_MAX_SEQS
        d.max_len = s.max_len or row.max_len
        d.cg = s.cg or P.MTP_CG
        d.kv_mem = s.kv_mem or None
        if s.async_sched is not None:
            d.async_scheduling = s.async_sched
        d.warnings += _no_effect(
            s, ("DFLASH_TOKENS", "DFLASH_MAX_LEN", "DRAFT", "LOOKUP", "LOOKUP_ADAPTIVE"),
            f"they set the dflash2 speculator; SPEC={spec}",
        )
    if spec_attn_row:
        if spec_attn:
            explicit = s.given("SPEC_ATTN")
            gate.env("VLLM_SPEC_DECODE_ATTN", "1", knob="SPEC_ATTN", explicit=explicit)
        else:
            gate.restate_stock("VLLM_SPEC_DECODE_ATTN", "0")
    elif s.given("SPEC_ATTN") and not (spec == "dflash2" and ctx == "huge"):
        d.warnings += _no_effect(s, ("SPEC_ATTN",), f"CTX={ctx} does not use the split-KV "
                                 "verify attention")

    # CTX=huge rules for every speculator.
    if ctx == "huge":
        if d.prefix_cache:
            d.prefix_match_unit = P.PREFIX_MATCH_UNIT_HUGE
        if spec != "dflash2":
            # Bug B (gotcha 33, seeds/001): a correctness constraint, not a preference.
            d.cudagraph_mode = s.cudagraph_mode or "PIECEWISE"
            if s.cudagraph_mode not in (None, "PIECEWISE", "NONE"):
                d.warnings.append(
                    f"CUDAGRAPH_MODE={s.cudagraph_mode} at CTX=huge with SPEC={spec}: a captured "
                    "verify step after a prefix-cache hit corrupts output at one prompt length "
                    "in 128 (Bug B, gotcha 33); PIECEWISE is the correctness default"
                )
        elif s.cudagraph_mode is not None:
            d.cudagraph_mode = s.cudagraph_mode
        if d.max_seqs > P.HUGE_MAX_SEQS_WARN:
            d.warnings.append(
                f"MAX_SEQS={d.max_seqs} > {P.HUGE_MAX_SEQS_WARN} at CTX=huge: the engine boots, "
                "answers /health, and dies on the first prompt with torch.OutOfMemoryError "
                "(gotcha 35); buy seats with a lower KV_MEM"
            )
    elif s.cudagraph_mode is not None:
        d.cudagraph_mode = s.cudagraph_mode
    elif spec == "mtp" and d.prefix_cache:
        # MTP on this architecture runs on vLLM 0.28.0's V1 runner, whose uniform-decode test
        # is shape-only at every CTX (tests/patches/test_bug_b_regression.py); the corruption
        # was measured at CTX=huge only, so this warns instead of forcing PIECEWISE.
        d.warnings.append(
            f"SPEC=mtp with PREFIX_CACHE=1 at CTX={ctx}: vLLM's V1 runner may replay a FULL "
            "decode graph for a verify step right after a prefix-cache hit (Bug B, measured at "
            "CTX=huge); sweep `qwen3090 bench residues` before trusting it, or set "
            "CUDAGRAPH_MODE=PIECEWISE"
        )

    _kv_mem_warnings(s, facts, d, pinned_default or P.KV_MEM_DEFAULT)
    if s.kv_mem is not None and s.kv_mem != "" and s.gpu_util is not None:
        d.warnings.append(
            f"GPU_UTIL={s.gpu_util} has no effect: KV_MEM pins the pool in bytes (set KV_MEM= "
            "empty to size it from GPU_UTIL)"
        )
    _int8(s, d, gate, default_on=False)


def _kv_mem_warnings(s: Settings, facts: PlatformFacts, d: Draft, default: int) -> None:
    if d.kv_mem is None:
        return
    if s.kv_mem is not None and s.kv_mem != "" and s.kv_mem > default:
        loud = (
            " THIS IS WSL2: running out of VRAM there does not fail, it runs 2-6x slower with "
            "nothing in the log (gotchas 35, 53); ladder prompt lengths before trusting it."
            if facts.wsl2 else ""
        )
        d.warnings.append(
            f"KV_MEM={s.kv_mem} is above the profile default {default}: the engine needs "
            "non-KV headroom for its first real batch; past it the server boots and dies on a "
            f"real request (gotcha 35).{loud}"
        )
    if facts.foreign_gpu_mib:
        d.warnings.append(
            f"KV_MEM pins the pool at {d.kv_mem} bytes while other processes hold "
            f"{facts.foreign_gpu_mib} MiB of the GPU: the pin assumes a headless card; the "
            "server boots and dies later on a real request (gotcha 31). Lower KV_MEM by what "
            "they hold, or set KV_MEM= empty to size the pool from GPU_UTIL"
        )


def _batch(settings: Settings, facts: PlatformFacts, d: Draft, gate: _Gate) -> None:
    s = settings
    kv = s.kv or "fp8"
    row = P.KV_TABLE[kv]
    d.max_seqs = s.max_seqs or P.BATCH_MAX_SEQS
    d.max_len = s.max_len or row.max_len
    d.gpu_util = s.gpu_util if s.gpu_util is not None else row.gpu_util
    d.kv_mem = s.kv_mem or None
    d.kv_cache_dtype = row.kv_cache_dtype
    d.attention_backend = row.attention_backend
    d.block_size = row.block_size
    d.cg = s.cg or P.BATCH_CG
    d.async_scheduling = True if s.async_sched is None else s.async_sched
    d.cudagraph_mode = s.cudagraph_mode
    if kv == "kvarn":
        gate.allow("--kv-cache-dtype=kvarn_k4v2_g128", row.kv_cache_dtype, knob="KV",
                   explicit=True, setting=kv)
        gate.env("KVARN_POOL_MEM_FRAC", row.kvarn_pool_mem_frac or "", knob="KV",
                 explicit=True, setting=kv)
    d.warnings += _no_effect(
        s,
        ("SPEC", "CTX", "DFLASH_TOKENS", "DRAFT_TOKENS", "DFLASH_MAX_LEN", "DRAFT", "LOOKUP",
         "LOOKUP_ADAPTIVE", "SPEC_ATTN", "DRAFT_SAMPLE"),
        "the batch profile runs no speculator",
    )
    _kv_mem_warnings(s, facts, d, P.KV_MEM_DEFAULT)
    _int8(s, d, gate, default_on=True)


def _extra_args_warnings(d: Draft, emitted: list[str]) -> None:
    extra = list(d.extra_args)
    for i, arg in enumerate(extra):
        name, _, inline = arg.partition("=")
        if name == "--max-num-batched-tokens":
            value = inline or (extra[i + 1] if i + 1 < len(extra) else "")
            if value.isdigit() and int(value) > P.MAX_NUM_BATCHED_TOKENS:
                d.warnings.append(
                    f"EXTRA_ARGS sets --max-num-batched-tokens {value} > "
                    f"{P.MAX_NUM_BATCHED_TOKENS}: bigger prefill chunks cost KV pool, and "
                    "8192 refuses to boot on a pinned pool (gotchas 7, 43)"
                )
        if name.startswith("--") and name in emitted:
            d.warnings.append(f"EXTRA_ARGS overrides the plan's {name} (the last one wins)")


def render(d: Draft) -> tuple[list[str], dict[str, Any]]:
    """The vLLM argument list of a draft (model first), and the compilation config."""
    args: list[str] = [d.model, "--served-model-name", P.SERVED_MODEL_NAME,
                       "--host", d.host, "--port", str(d.port),
                       "--api-server-count", str(d.api_servers)]
    if d.language_model_only:
        args.append("--language-model-only")
    args += ["--max-model-len", str(d.max_len), "--max-num-seqs", str(d.max_seqs),
             "--max-num-batched-tokens", str(P.MAX_NUM_BATCHED_TOKENS)]
    if d.kv_mem is not None:
        args += ["--kv-cache-memory-bytes", str(d.kv_mem)]
    else:
        args += ["--gpu-memory-utilization", repr(d.gpu_util)]
    if d.attention_backend:
        args += ["--attention-backend", d.attention_backend]
    if d.kv_cache_dtype:
        args += ["--kv-cache-dtype", d.kv_cache_dtype]
    if d.block_size:
        args += ["--block-size", str(d.block_size)]
    args += ["--mamba-ssm-cache-dtype", d.mamba_ssm_cache_dtype]
    if d.prefix_cache:
        args += ["--enable-prefix-caching", "--mamba-cache-mode", "align"]
        if d.prefix_match_unit:
            args += ["--prefix-match-unit", str(d.prefix_match_unit)]
    else:
        args.append("--no-enable-prefix-caching")
    args.append("--enable-prompt-tokens-details")
    if d.speculative is not None:
        args += ["--speculative-config", json.dumps(d.speculative, separators=(",", ":"))]
    if d.async_scheduling is not None:
        args.append("--async-scheduling" if d.async_scheduling else "--no-async-scheduling")
    compilation: dict[str, Any] = {}
    if d.cg:
        compilation["max_cudagraph_capture_size"] = d.cg
    compilation["custom_ops"] = list(P.CUSTOM_OPS)
    if d.cudagraph_mode:
        compilation["cudagraph_mode"] = d.cudagraph_mode
    args += ["--compilation-config", json.dumps(compilation, separators=(",", ":"))]
    args += ["--reasoning-parser", P.REASONING_PARSER]
    if d.tool_parser:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", d.tool_parser]
    return args, compilation


def _memory(d: Draft) -> MemoryEstimate:
    per_token = P.KV_BYTES_PER_TOKEN.get(d.kv_cache_dtype or "auto", 65536)
    fixed = P.REQUEST_FIXED_BYTES_PER_SLOT * (d.num_spec_tokens + 2)
    request = per_token * d.max_len + fixed
    fits = round(d.kv_mem / request, 2) if d.kv_mem else None
    return MemoryEstimate(per_token, fixed, request, d.kv_mem, fits)


def _capability_warnings(d: Draft, caps: Capabilities) -> None:
    for feature, items in d.dropped.items():
        d.warnings.append(
            f"left out {', '.join(items)}: a profile default that needs the {feature!r} "
            f"capability, which {caps.source} does not provide; the server runs without it"
        )


def resolve(
    settings: Settings,
    caps: Capabilities = STOCK,
    facts: PlatformFacts | None = None,
) -> ServePlan:
    """The ServePlan for ``settings`` on a vLLM with ``caps``; raises Qwen3090Error on a bad
    combination (nothing has been started or touched at that point)."""
    facts = facts or PlatformFacts()
    profile = settings.profile or "single-user"
    device = settings.device or "cuda"
    d = _common(settings, facts, profile, device)
    gate = _Gate(caps, d)
    if device == "cpu":
        settings = cpu_rules.before(settings, d)
    if profile == "single-user":
        _single_user(settings, facts, d, gate)
    else:
        _batch(settings, facts, d, gate)
    _vision(settings, d, gate)
    if device == "cpu":
        cpu_rules.after(settings, d)
    _capability_warnings(d, caps)
    if d.api_key_file is None and not facts.api_key_env and d.host not in LOOPBACK:
        d.warnings.append(
            f"no API key and HOST={d.host} is not loopback: anyone who reaches the port can "
            "use the server; set VLLM_API_KEY or API_KEY_FILE, or bind 127.0.0.1"
        )
    args, _ = render(d)
    _extra_args_warnings(d, [a for a in args if a.startswith("--")])
    args += list(d.extra_args)
    return ServePlan(
        profile=profile,
        device=device,
        model=d.model,
        draft=d.draft,
        vllm_args=tuple(args),
        env=dict(d.env),
        warnings=tuple(d.warnings),
        memory=_memory(d),
        port=d.port,
        host=d.host,
        api_key_file=d.api_key_file,
    )


def describe(plan: ServePlan) -> str:
    """The human form of a plan (``qwen3090 plan`` without ``--json``)."""
    lines = [f"profile: {plan.profile}   device: {plan.device}   model: {plan.model}"]
    if plan.draft:
        lines.append(f"draft: {plan.draft}")
    lines.append("env:")
    lines += [f"  {k}={v}" for k, v in plan.env.items()] or ["  (none)"]
    lines.append("command:")
    lines.append("  " + shlex.join(plan.argv or ("vllm", "serve", *plan.vllm_args)))
    m = plan.memory
    lines.append(
        f"memory: {m.kv_bytes_per_token} B/token x context + {m.fixed_bytes_per_request >> 20} "
        f"MiB per request; one {plan.flag('--max-model-len')}-token request = "
        f"{m.request_bytes_at_max_len / (1 << 30):.2f} GiB"
        + (f"; the {m.pool_bytes / (1 << 30):.2f} GiB pool holds {m.full_length_requests} of them"
           if m.pool_bytes else "; pool sized by --gpu-memory-utilization")
    )
    if plan.warnings:
        lines.append("warnings:")
        lines += [f"  - {w}" for w in plan.warnings]
    return "\n".join(lines)
