"""Rules every profile shares: model directories, server basics, vision, int8 activations and
the pinned-pool warnings."""

from __future__ import annotations

from dataclasses import dataclass

from qwen3090 import profiles as P
from qwen3090.capabilities import NEEDS
from qwen3090.errors import Qwen3090Error
from qwen3090.modelcheck import METHOD_WORDS
from qwen3090.resolver.builder import PlanBuilder, PlatformFacts, no_effect
from qwen3090.resolver.capgate import CapabilityGate
from qwen3090.settings import Device, Profile, Settings


def default_model(facts: PlatformFacts) -> str:
    """The first existing default target directory in the models directory (else the last)."""
    for name in P.MODEL_NAMES:
        if (facts.cwd / facts.models_dir / name).is_dir():
            return str(facts.models_dir / name)
    return str(facts.models_dir / P.MODEL_NAMES[-1])


def default_draft(facts: PlatformFacts) -> str:
    """The first default drafter directory holding weights (else the first)."""
    for name in P.DRAFT_NAMES:
        if (facts.cwd / facts.models_dir / name / P.DRAFT_WEIGHTS_FILE).is_file():
            return str(facts.models_dir / name)
    return str(facts.models_dir / P.DRAFT_NAMES[0])


def _check_model_path(settings: Settings, model: str) -> None:
    # gotcha 14: vLLM 0.28.0 picks the speculative method from the path; refuse before start.
    for word in METHOD_WORDS:
        if word in model.lower():
            raise Qwen3090Error(
                f"MODEL={model!r} (from {settings.source('MODEL')}) contains {word!r}: vLLM "
                "0.28.0 picks the speculative method from the model path, so the target would "
                f"run as {word.strip('-')} and crash (gotcha 14)",
                fix="rename the model directory (and its parents) so the path lacks that word, "
                "then point MODEL (--model) at it",
            )


def common(
    settings: Settings, facts: PlatformFacts, profile: Profile, device: Device
) -> PlanBuilder:
    """The builder with what every profile sets: model, server, tools, base environment."""
    s = settings
    model = s.model if s.model is not None else default_model(facts)
    _check_model_path(s, model)
    b = PlanBuilder(profile=profile, device=device, model=model)
    b.host = s.host or P.DEFAULT_HOST
    b.port = s.port or P.DEFAULT_PORT
    b.api_servers = s.api_servers or P.DEFAULT_API_SERVERS
    b.language_model_only = not bool(s.vision)
    b.prefix_cache = bool(s.prefix_cache)
    tools = True if s.tools is None else s.tools
    b.tool_parser = (s.tool_parser or P.DEFAULT_TOOL_PARSER) if tools else None
    if not tools:
        b.warnings += no_effect(s, ("TOOL_PARSER",), "TOOLS=0 turns tool calling off")
    b.extra_args = s.extra_args or ()
    b.api_key_file = s.api_key_file
    b.env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    # gotcha 3: expandable segments need CUDA VMM, which WSL2's paravirtual driver rejects.
    b.env["PYTORCH_CUDA_ALLOC_CONF"] = (
        "expandable_segments:False" if facts.wsl2 else "expandable_segments:True"
    )
    return b


def vision(settings: Settings, b: PlanBuilder, gate: CapabilityGate) -> None:
    """VISION and VISION_OFFLOAD (gotcha 8)."""
    s = settings
    if not s.vision:
        b.warnings += no_effect(s, ("VISION_OFFLOAD",), "VISION is off (--language-model-only)")
        return
    offload = True if s.vision_offload is None else s.vision_offload
    if offload:
        offload = gate.admit_env("VLLM_VISION_TOWER_CPU_OFFLOAD", "1", knob="VISION_OFFLOAD",
                                 explicit=s.given("VISION_OFFLOAD"))
    if not offload and b.speculative is not None and b.speculative.get("method") == "dflash":
        b.warnings.append(
            "VISION=1 with the vision tower resident under SPEC=dflash2: the 0.86 GiB tower "
            "comes out of the ~1.1 GiB transient margin of the pinned pool; the engine boots "
            "at the headroom cliff or dies in graph capture (gotcha 8). Lower KV_MEM by 1 GiB "
            "(VISION_OFFLOAD=1 needs the tower-offload patch, which this repository's series "
            "does not carry)"
        )


def int8(settings: Settings, b: PlanBuilder, gate: CapabilityGate, *, default_on: bool) -> None:
    """INT8_ACT and INT8_LAYERS (gotcha 16); on by default only in batch."""
    s = settings
    act = s.int8_act if s.int8_act is not None else (P.BATCH_INT8_ACT if default_on else "")
    layers = s.int8_layers if s.int8_layers is not None else P.BATCH_INT8_LAYERS
    if act == "" or layers == "":
        # Off means NOT exported: vLLM rejects an empty value at startup.
        if act == "" and s.int8_act is not None:
            b.warnings += no_effect(s, ("INT8_LAYERS",), "INT8_ACT is empty (int8 off)")
        return
    explicit = s.given("INT8_LAYERS") or s.given("INT8_ACT")
    if layers != ".":
        # Stock vLLM applies VLLM_MARLIN_INPUT_DTYPE to EVERY layer; without the selection
        # patch a default "mlp" would silently become ".", which gotcha 16 says OOMs at 0.972.
        knob, setting = ("INT8_LAYERS", layers) if s.given("INT8_LAYERS") else ("INT8_ACT", act)
        if not gate.admit("VLLM_MARLIN_INT8_INCLUDE_RE", layers, knob=knob, explicit=explicit,
                          setting=setting):
            b.warnings.append(
                f"int8 activations are OFF: INT8_LAYERS={layers} needs the layer-selection "
                "patch, and stock vLLM would quantize every layer instead (gotcha 16)"
            )
            return
        b.env["VLLM_MARLIN_INT8_INCLUDE_RE"] = layers
    elif gate.reads("VLLM_MARLIN_INT8_INCLUDE_RE"):
        b.env["VLLM_MARLIN_INT8_INCLUDE_RE"] = layers
    b.env["VLLM_MARLIN_INPUT_DTYPE"] = act
    if layers == "." and b.gpu_util > P.INT8_ALL_LAYERS_GPU_UTIL:
        b.warnings.append(
            f"INT8_LAYERS=. (every layer) with GPU_UTIL={b.gpu_util}: the extra per-layer "
            "scratch does not fit above 0.95; the engine dies in chunk_fwd_o once ~17 requests "
            "are resident while /health still answers (gotcha 16). Set GPU_UTIL=0.95 or lower"
        )


def kv_mem_warnings(s: Settings, facts: PlatformFacts, b: PlanBuilder, default: int) -> None:
    """A pinned pool above the profile default (other processes' memory: ``memory``)."""
    if b.kv_mem is None:
        return
    if s.kv_mem is not None and s.kv_mem != "" and s.kv_mem > default:
        loud = (
            " THIS IS WSL2: running out of VRAM there does not fail, it runs 2-6x slower with "
            "nothing in the log (gotchas 35, 53); ladder prompt lengths before trusting it."
            if facts.wsl2 else ""
        )
        b.warnings.append(
            f"KV_MEM={s.kv_mem} is above the profile default {default}: the engine needs "
            "non-KV headroom for its first real batch; past it the server boots and dies on a "
            f"real request (gotcha 35).{loud}"
        )


def cache_row(row: P.CacheRow, b: PlanBuilder, gate: CapabilityGate, *, knob: str,
              explicit: bool, setting: str) -> None:
    """A table row's KV cache and attention, with the capability check of a patched dtype."""
    b.attention_backend = row.attention_backend
    b.kv_cache_dtype = row.kv_cache_dtype
    b.block_size = row.block_size
    flag_value = f"--kv-cache-dtype={row.kv_cache_dtype}"
    if flag_value in NEEDS:
        gate.admit(flag_value, row.kv_cache_dtype, knob=knob, explicit=explicit, setting=setting)


@dataclass(frozen=True)
class AttentionShape:
    """The widths of a model's full-attention layers that size the KVARN backend's buffers."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int


# Qwen3.8-27B: 16 full-attention layers, 24 query heads and 4 KV heads of 256.
QWEN_27B_ATTENTION = AttentionShape(layers=16, heads=24, kv_heads=4, head_dim=256)


def kvarn_staging_bytes(max_seqs: int, shape: AttentionShape = QWEN_27B_ATTENTION) -> int:
    """The KVARN backend's bf16 staging over ``shape``'s attention layers at ``max_seqs``."""
    tiles = P.KVARN_STAGE_TILES_PER_SEAT * max_seqs + 1
    return tiles * P.KVARN_TILE_TOKENS * shape.kv_heads * shape.head_dim * 2 * 2 * shape.layers


def kvarn_workspace_bytes(max_seqs: int, *, spec_tokens: int,
                          max_batched_tokens: int = P.MAX_NUM_BATCHED_TOKENS,
                          shape: AttentionShape = QWEN_27B_ATTENTION) -> int:
    """The KVARN backend's fp32 split-pass workspace (one for all layers): partial outputs
    and their (max, sum) pairs, per query row and head. A seat brings its sampled token and
    the ``spec_tokens`` drafts it verifies to a split step, at every segment; a prefill
    chunk's tokens take one segment each."""
    queries = min(1 + spec_tokens, P.KVARN_SPLIT_QUERY_MAX)
    rows = max(max_seqs * queries * P.KVARN_SPLIT_SEGMENTS, max_batched_tokens)
    return rows * shape.heads * (shape.head_dim + 2) * 4


def kvarn_staging_warning(b: PlanBuilder) -> None:
    """Seats cost pool under KVarN: each keeps its open tiles' rows at bf16 and room in the
    split pass's workspace, allocated at model construction and charged by vLLM's profiler
    before the pool is sized (the original capped seats by KVARN_POOL_MEM_FRAC instead)."""
    if b.kv_cache_dtype != "kvarn_k4v2_g128":
        return
    staging = kvarn_staging_bytes(b.max_seqs)
    workspace = kvarn_workspace_bytes(b.max_seqs, spec_tokens=b.num_spec_tokens)
    if staging + workspace >= P.KVARN_BUFFERS_WARN_BYTES:
        b.warnings.append(
            f"KVarN at MAX_SEQS={b.max_seqs} allocates {(staging + workspace) / (1 << 30):.2f} "
            f"GiB on the 27B before the KV pool is sized, taken from it: "
            f"{staging / (1 << 30):.2f} GiB of bf16 staging for open 128-token tiles "
            f"({P.KVARN_STAGE_TILES_PER_SEAT} tiles a seat across 16 attention layers) and "
            f"{workspace / (1 << 30):.2f} GiB of split-pass workspace; lower MAX_SEQS to give "
            "the pool that memory back"
        )


# vLLM 0.28.0 with an attention backend that captures no full graph (the KVARN builder's
# support is NEVER): a mode whose mixed batches are FULL raises at start-up once the weights
# are loaded; the modes that capture only decode graphs FULL are lowered to PIECEWISE with a
# warning (vllm/config/compilation.py, the cudagraph-mode resolution).
_FULL_DECODE_MODES = ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


def kvarn_cudagraph_check(settings: Settings, b: PlanBuilder) -> None:
    """The KVarN cache serves under PIECEWISE graphs only: refuse FULL before the engine
    loads the model only to refuse it, and say that a full-decode mode becomes PIECEWISE."""
    if b.kv_cache_dtype != "kvarn_k4v2_g128" or b.cudagraph_mode is None:
        return
    mode = b.cudagraph_mode
    if mode == "FULL":
        raise Qwen3090Error(
            f"CUDAGRAPH_MODE=FULL (from {settings.source('CUDAGRAPH_MODE')}) with the KVarN "
            "cache: the KVARN attention backend captures no CUDA graph of its own, and vLLM "
            "0.28.0 refuses FULL for it at start-up, after loading the weights",
            fix="set CUDAGRAPH_MODE=PIECEWISE (or leave it unset)",
        )
    if mode in _FULL_DECODE_MODES:
        b.warnings.append(
            f"CUDAGRAPH_MODE={mode} with the KVarN cache: the KVARN attention backend captures "
            "no CUDA graph of its own, so vLLM 0.28.0 lowers the mode to PIECEWISE (set "
            "CUDAGRAPH_MODE=PIECEWISE to say so)"
        )
