"""The numbers of PROFILES.md, as data. Measured values of the original system, not tuning.

The rules that combine them live in ``qwen3090.plan``; keep this module free of logic so a
reviewer can hold it against the tables line by line.
"""

from __future__ import annotations

from dataclasses import dataclass

SERVED_MODEL_NAME = "qwen3.8-27b"
DEFAULT_PORT = 18020
DEFAULT_HOST = "127.0.0.1"
MAX_NUM_BATCHED_TOKENS = 2048  # gotchas 7, 43: more costs pool; 8192 does not boot
MAMBA_SSM_CACHE_DTYPE = "float16"  # gotcha 10: the state dtype is the decode lever
REASONING_PARSER = "qwen3"
DEFAULT_TOOL_PARSER = "qwen3_coder"  # the chat template asks for XML calls; hermes drops them
CUSTOM_OPS = ("+rms_norm", "+silu_and_mul")
PREFIX_MATCH_UNIT_HUGE = 128

# Model directories, relative to the working directory, first existing wins.
MODEL_CANDIDATES = (
    "models/Qwen3.8-27B-W4A16-AutoRound-fast",
    "models/Qwen3.8-27B-W4A16-AutoRound",
)
DRAFT_CANDIDATES = (
    "models/Qwen3.8-27B-DFlash2-W4A16",
    "models/Qwen3.8-27B-DFlash2",
)
DRAFT_WEIGHTS_FILE = "model.safetensors"

# single-user ---------------------------------------------------------------------------------
SINGLE_USER_GPU_UTIL = 0.93  # gotcha 4: MTP workspace outgrows the profile at 0.95+


@dataclass(frozen=True)
class CtxRow:
    """One row of the single-user CTX table."""

    max_len: int
    mtp_draft_tokens: int
    kv_cache_dtype: str
    attention_backend: str | None
    block_size: int | None
    spec_decode_attn: bool
    """The row sets VLLM_SPEC_DECODE_ATTN=${SPEC_ATTN:-1}."""
    kvarn_pool_mem_frac: str | None


CTX_TABLE: dict[str, CtxRow] = {
    "fast": CtxRow(65536, 4, "bfloat16", "FLASH_ATTN", None, True, None),
    # fp8 KV: FlashInfer is the only sm86 backend that takes it (gotcha 40), so none is named.
    "long": CtxRow(150000, 3, "fp8", None, None, False, None),
    "huge": CtxRow(200000, 3, "kvarn_k4v2_g128", None, 128, False, "0.15"),
}

MTP_MAX_SEQS = 8
MTP_CG = 32
DEFAULT_DRAFT_SAMPLE = "probabilistic"

DFLASH_DEFAULT_TOKENS = 7
DFLASH_LONG_BLOCK = 7  # "k > 7" is the long verify block: lookup + async rules (gotchas 18, 19)
DFLASH_CG_CAP = 64  # gotcha 34
DFLASH_LONG_KV = ("TRITON_ATTN", "int8_per_token_head")
KV_MEM_DEFAULT = 5583457484
KV_MEM_HUGE = 5261334938
V2_CUDAGRAPH_MEM_MIB_SHORT = 1400
V2_CUDAGRAPH_MEM_MIB_LONG = 1900


@dataclass(frozen=True)
class DflashRow:
    """One row of the dflash2 table, for a block length k."""

    max_seqs: int
    max_len: int
    kv_mem: int
    v2_cudagraph_mem_mib: int


def dflash_row(ctx: str, k: int) -> DflashRow:
    """The dflash2 table of PROFILES.md."""
    long_block = k > DFLASH_LONG_BLOCK
    graph_mib = V2_CUDAGRAPH_MEM_MIB_LONG if long_block else V2_CUDAGRAPH_MEM_MIB_SHORT
    if ctx == "fast":
        return DflashRow(4 if long_block else 8, 57344 if long_block else 65536, KV_MEM_DEFAULT,
                         graph_mib)
    if ctx == "long":
        return DflashRow(4, 131072, KV_MEM_DEFAULT, graph_mib)
    return DflashRow(2, 221184 if long_block else 245760, KV_MEM_HUGE, graph_mib)


# Warnings' thresholds.
HUGE_MAX_SEQS_WARN = 12  # gotcha 35
INT8_ALL_LAYERS_GPU_UTIL = 0.95  # gotcha 16

# batch ---------------------------------------------------------------------------------------
BATCH_MAX_SEQS = 64
BATCH_CG = 64


@dataclass(frozen=True)
class KvRow:
    """One row of the batch KV table."""

    max_len: int
    gpu_util: float
    kv_cache_dtype: str
    attention_backend: str | None
    block_size: int | None
    kvarn_pool_mem_frac: str | None


KV_TABLE: dict[str, KvRow] = {
    "fp8": KvRow(150000, 0.972, "fp8", None, None, None),
    "int4pth": KvRow(262144, 0.93, "int4_per_token_head", "TRITON_ATTN", None, None),
    "kvarn": KvRow(262144, 0.93, "kvarn_k4v2_g128", None, 128, "0.25"),
}
BATCH_INT8_ACT = "int8"
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
    # KVarN: 4-bit keys, 2-bit values; an approximation (its group scales are left out).
    "kvarn_k4v2_g128": 65536 * 3 // 16,
}
