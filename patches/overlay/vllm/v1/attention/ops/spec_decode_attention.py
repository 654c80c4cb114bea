# SPDX-License-Identifier: Apache-2.0
# qwen3090 patch spec-decode-attn: split-KV attention for speculative verify
# batches (1 < query length <= VLLM_SPEC_DECODE_ATTN_QMAX per request).
#
# Why: with k draft tokens the verify step has k+1 queries per request, and
# stock 0.28.0 then runs unified_attention's 2-D grid (one program per
# (query block, kv head)) while FA2 refuses num_splits > 1, so one request
# occupies num_kv_heads programs of a GPU with 80+ SMs (gotcha 12).
#
# Work layout:
#   split pass : grid (num_seqs * q_tiles, num_kv_heads, num_segments). A
#                program owns all rows of one query tile of one request for
#                ONE kv head (rows = query tokens x that kv head's G query
#                heads), so every KV byte of its segment is read once per
#                tile. A tile holds BLOCK_M // G query tokens; a longer verify
#                block gets more tiles, never a silent fallback (gotcha 12).
#   reduce pass: grid (num_seqs * max_query_len, num_heads); merges the
#                segments' (max, sum, normalised output) partials.
# The partials live in a workspace allocated once at startup from
# max_num_seqs x QMAX and never reallocated: a captured CUDA graph keeps its
# addresses (gotcha 17).
#
# On sm_90 (Hopper) the split pass is a warp-specialised Gluon kernel (TMA
# loads in their own warp, 64-row warpgroups): spec_decode_attention_hopper.py
# for 16-bit caches, spec_decode_attention_hopper_int8.py for
# int8_per_token_head ones; everywhere else, for fp8 caches and for caches
# those kernels cannot address, the portable Triton split pass below. All
# write the same partials. The launch planner, which decides from shapes only,
# is spec_decode_attention_plan.py.

import dataclasses
import functools
import importlib
from dataclasses import dataclass
from types import ModuleType

import torch

from vllm.logger import init_logger
from vllm.triton_utils import tl, triton
from vllm.v1.attention.ops.spec_decode_attention_plan import (
    DEFAULT_SHARED_MEM,
    MAX_BLOCK_M,
    MAX_SEGMENTS,
    MIN_SEGMENT_TOKENS,
    WORKSPACE_BUDGET_BYTES,
    LaunchPlan,
    WorkspaceShape,
    fusable_grid,
    int8_hopper_unsupported,
    plan_launch,
    plan_smem,
)

# The planner's names stay importable from here, where vLLM's backends and
# qwen3090's tests and benchmark look for them.
__all__ = [
    "ARCH_TILE_PLANS",
    "INT8_FUSED_REDUCE",
    "MAX_BLOCK_M",
    "MAX_SEGMENTS",
    "MIN_SEGMENT_TOKENS",
    "TILE_PLANS",
    "WORKSPACE_BUDGET_BYTES",
    "LaunchPlan",
    "SpecDecodeAttention",
    "SpecDecodeWorkspace",
    "TilePlan",
    "cache_tile_plan",
    "fusable_grid",
    "get_workspace",
    "hopper_available",
    "int8_rows_aligned",
    "kv_family",
    "launch_reduce",
    "plan_for_cache",
    "plan_launch",
    "plan_smem",
    "spec_decode_attention",
    "tile_plan",
    "use_fast_int8",
]

logger = init_logger(__name__)

# The KV cache dtypes the split passes read. qwen3090's planner keeps the same
# list, so it never asks for this path on a cache it would decline; a test holds
# the two equal. fp8_e5m2 and int4 caches take the stock path.
SUPPORTED_KV_CACHE_DTYPES = (
    "auto",
    "bfloat16",
    "float16",
    "int8_per_token_head",
    "fp8",
    "fp8_e4m3",
    "fp8_per_token_head",
)
# Quantized caches, with the backends whose forward hands the kernel their
# scales: TRITON_ATTN's (per-token-head scale views; per-tensor descales).
QUANTIZED_KV_BACKENDS = {
    dtype: ("TRITON_ATTN",)
    for dtype in ("int8_per_token_head", "fp8", "fp8_e4m3", "fp8_per_token_head")
}
# Per-tensor fp8 caches (one K and one V scale, the layer's _k_scale/_v_scale).
FP8_TENSOR_KV_DTYPES = ("fp8", "fp8_e4m3")
# The kernels' KV_SCALES modes.
_KV_PLAIN, _KV_TENSOR, _KV_TOKEN_HEAD = 0, 1, 2

# The kernels run the softmax in base 2 (exp2 is one instruction).
_LOG2E = 1.4426950408889634
# int8_per_token_head caches on the int8 Hopper pass: the pass merges its own
# partials (one launch, no reduce pass) wherever fusable_grid allows. Off: on an
# H100 it was as exact and 1.8-2.4 us a call slower at q = 8 (qwen3090's
# spec_decode_attn.md, session 36).
INT8_FUSED_REDUCE = False


@dataclass(frozen=True)
class TilePlan:
    """The Triton split pass's tile plan for one KV cache family: plan_launch
    overrides (None: the planner's shape-based choice) and kernel switches.

    tile_n: keys per chunk (the kernel's TILE_N); num_warps, num_stages: the
    launch's; num_segments: the KV split (a power of two); max_block_m: the
    largest query tile in rows (a longer verify block takes more tiles, each
    reading the segment's KV again); programs_per_sm: the split programs an
    SM holds, which sizes the KV split (None: the planner's rule, two below
    128 rows); fast_int8: widen int8
    tiles with _widen's float32 bit arithmetic instead of Triton's cast (None: only
    where that cast is a conversion instruction, see use_fast_int8); fp8_qk: Q.K
    as an fp8 MMA when q and K are both e4m3 (per-tensor fp8 caches with
    TRITON_ATTN's fp8 queries; sm_89+, where vLLM allows fp8 caches at all).
    int8_qk (int8 caches only): Q.K as an int8 MMA on the K codes, K not widened,
    each query row quantized in the kernel (symmetric, its own scale): 0 off (K
    widened, a 16-bit MMA); 1 one int8 term per row; 2 two terms, the second the
    first's remainder at 1/256 of its scale, both MMAs into one int32 accumulator
    (sm_80+ for the int8 MMA).
    k_align8 (per-token-head caches): tell the compiler K rows start 8-byte aligned, for
    8-byte rather than 4-byte K copies. TRITON_ATTN's rows are head_size + 4 bytes, so
    K rows (at 2 x (head_size + 4) x head) are 8-byte aligned and V rows 4-byte aligned
    only; the launcher checks the cache and says 4 where it is not.
    """

    tile_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    num_segments: int | None = None
    max_block_m: int | None = None
    programs_per_sm: int | None = None
    fast_int8: bool | None = None
    fp8_qk: bool = False
    int8_qk: int = 0
    k_align8: bool = False

    def __post_init__(self) -> None:
        if self.int8_qk not in (0, 1, 2):
            raise ValueError(
                f"TilePlan(int8_qk={self.int8_qk!r}): the int8 Q.K MMA takes 0 (off), 1 or 2 "
                "query terms"
            )

    def plan_overrides(self) -> dict[str, int]:
        fields = {"tile_n": self.tile_n, "num_warps": self.num_warps,
                  "num_stages": self.num_stages, "num_segments": self.num_segments,
                  "max_block_m": self.max_block_m, "programs_per_sm": self.programs_per_sm}
        return {k: v for k, v in fields.items() if v is not None}


# Production tile plans per KV cache family (kv_family). Why each is what it is:
# - "16bit": the planner's own defaults, which come from the H200 bf16 sweeps
#   (qwen3090's benchmarks/spec_decode_attn.md); unchanged by issue 21.
# - "int8": 32-key chunks and 3 stages, warps left to the planner (4 below 128
#   query rows, 8 from there). The H200 sweep (`spec_decode_attn.py --sweep-8bit`,
#   batch 1, 16k-128k) found this the fastest at q = 8 (1.40x faster than the
#   planner's 64-key, 2-stage tiles at 128k) and within 1 % of the fastest at
#   q = 16; the 8-bit path sits at 255 registers and spills, so smaller chunks
#   pay. The widening is use_fast_int8's per-arch choice (_widen's bit arithmetic
#   below sm_90, Triton's own packed cast above). Not measured on an sm_86 card.
#   int8_qk stays off until the H200 sweep times it: on the interpreter one query term
#   gave 1.5x stock's error on the same data (9.4e-3 against 6.2e-3), two terms stock's
#   own (6.1e-3); ptxas reports no fewer spills at these tiles, none at all at 8 warps
#   for q = 8 on sm_90a (the benchmark doc); the H200 sweep then found it no faster.
#   k_align8: K copied 8 bytes at a time; the H200 sweep of 2026-12-03 measured it the
#   fastest config at every context for q = 16 and within 4 % of the fastest for q = 8
#   (234 -> 221 us at 128k, q = 8; 54 -> 44 us at 16k). 16-byte-aligned windows before the
#   rows and TMA boxes of them were tried there too and were slower (the benchmark doc).
# - "fp8": the planner's tiles with the fp8 Q.K MMA: the sweep measured it the
#   fastest config at every context and q (1.6x at q = 8, 1.8x at q = 16 over the
#   widened path at worst) at the same error against the float32 reference
#   (2.3e-3 against 2.2e-3). It only acts where q and K are both e4m3
#   (per-tensor fp8 caches with fp8 queries), which needs sm_89+.
TILE_PLANS: dict[str, TilePlan] = {
    "16bit": TilePlan(),
    "int8": TilePlan(tile_n=32, num_stages=3, k_align8=True),
    "fp8": TilePlan(fp8_qk=True),
}

# Where a card's own numbers choose other plans than the H200's, by compute
# capability; families not listed keep TILE_PLANS. sm_86 (the RTX 3090): chosen
# by qwen3090's benchmarks/rtx3090_tile_model.py, a cost model over the kernels
# ptxas compiles for sm_86 (not timed on a 3090). A GeForce GA102 SM does four
# times as many int8 MACs a clock as bf16 FMAs into float32, and from q = 8 (64
# rows) the tile's MMAs outlast its loads at 936 GB/s, so Q.K on the int8 MMA
# with two query terms (stock's error; one term misses it) bounds the call 1.33x
# lower than widened K. Eight warps: at q = 8 these tiles hold one program an
# SM (99 KiB of shared memory), and eight warps compile without spills at
# q <= 8 where four spill 240-416 bytes a thread; the model's bounds tie.
# Query tiles of at most 64 rows: q = 16 takes two, reading the KV twice
# (under the MMA bound) with the 64-row kernel, which does not spill where the
# 128-row one spills 248 (bf16) or 528 bytes (int8). One program an SM (what
# these kernels' shared memory and registers allow): the KV split is sized to
# one wave of those, half the segments of the planner's rule, and the reduce
# pass reads half the partials back.
ARCH_TILE_PLANS: dict[tuple[int, int], dict[str, TilePlan]] = {
    (8, 6): {
        "16bit": TilePlan(num_warps=8, max_block_m=64, programs_per_sm=1),
        "int8": TilePlan(tile_n=32, num_warps=8, num_stages=2, max_block_m=64,
                         programs_per_sm=1, int8_qk=2, k_align8=True),
    },
}


def tile_plan(family: str, capability: tuple[int, int] | None) -> TilePlan:
    """The production tile plan of a cache family on a card of this compute
    capability (None: no CUDA card, the H200's plans)."""
    return ARCH_TILE_PLANS.get(capability or (0, 0), {}).get(family, TILE_PLANS[family])


@functools.cache
def _capability(device: torch.device) -> tuple[int, int] | None:
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return major, minor


def cache_tile_plan(key_cache: torch.Tensor) -> TilePlan:
    """The production tile plan for this cache on the card it lives on."""
    return tile_plan(kv_family(key_cache), _capability(key_cache.device))


def use_fast_int8(tiles: TilePlan, device: torch.device) -> bool:
    """Whether int8 tiles take _widen's bit arithmetic. Left to the plan (None), only
    below sm_90: there Triton 3.9's int8 -> bf16 cast is one cvt.rn.f32.s8 (a
    quarter-rate conversion) per element, while for sm_90 it emits its own packed trick
    (prmt, two ands, one sub.bf16x2 per two elements: fewer instructions than _widen's,
    which bf16x2 arithmetic below sm_90 cannot do); ptxas-compiled counts in qwen3090's
    benchmarks/spec_decode_attn.md."""
    if tiles.fast_int8 is not None:
        return tiles.fast_int8
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] < 9


def kv_family(key_cache: torch.Tensor) -> str:
    """TILE_PLANS' key for a cache: "int8", "fp8" (any e4m3 cache, per tensor
    or per token and head) or "16bit"."""
    if key_cache.dtype == torch.int8:
        return "int8"
    return "fp8" if key_cache.element_size() == 1 else "16bit"


@triton.jit
def _block_and_slot(
    block_table_row_ptr,
    start,
    end,
    offs_t,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
):
    """Physical block (scalar or per token) and in-block slot of the KV tile
    at ``start``; tokens at or past ``end`` read no block-table entry."""
    if BLOCK_SIZE % TILE_N == 0:
        # The tile lies inside one cache block: a single block-table read.
        blk = tl.load(
            block_table_row_ptr + start // BLOCK_SIZE, mask=start < end, other=0
        ).to(tl.int64)
        slot = (start % BLOCK_SIZE) + offs_t
    else:
        tok = start + offs_t
        blk = tl.load(
            block_table_row_ptr + tok // BLOCK_SIZE, mask=tok < end, other=0
        ).to(tl.int64)
        slot = tok % BLOCK_SIZE
    return blk, slot


@triton.jit
def _widen(x, OUT_FP16: tl.constexpr, FAST_INT8: tl.constexpr):
    """An 8- or 16-bit K/V tile as the MMA's 16-bit input (the output's dtype).

    FAST_INT8 (int8 tiles only): integer and float adds on bit patterns instead of
    Triton's int8 -> bf16 cast, which below sm_90 is one cvt.rn.f32.s8 per element, a
    quarter-rate conversion-unit instruction (at 128k context ~268 M of them per layer
    call). Here every step is a full-rate ALU op and every step is exact:
      u = x + 128 in [0, 255] (flip the sign bit, then zero-extend);
      bf16: float32 bits 0x4B000000 | u are 2^23 + u; minus 2^23 + 128 leaves x exactly,
            and x (|x| <= 128) has a zero low half, so truncating to bf16 is exact;
      fp16: fp16 bits 0x6400 | u are 1024 + u; minus 1152 leaves x exactly.
    """
    if FAST_INT8:
        u = x.to(tl.uint8, bitcast=True) ^ 0x80
        if OUT_FP16:
            h = (u.to(tl.uint16) | 0x6400).to(tl.uint16)
            return h.to(tl.float16, bitcast=True) - 1152.0
        else:
            w = (u.to(tl.uint32) | 0x4B000000).to(tl.uint32)
            f = w.to(tl.float32, bitcast=True) - 8388736.0
            hi = (f.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16)
            return hi.to(tl.bfloat16, bitcast=True)
    else:
        if OUT_FP16:
            return x.to(tl.float16)
        else:
            return x.to(tl.bfloat16)


@triton.jit
def _int8_rows(x):
    """x (float32, |x| <= 128) rounded to the nearest integer, half up, as int8 codes
    clamped to +-127: a row's max is 127 up to float32 rounding, and a second term's
    remainder can round to 128, where the clamp loses at most one of its steps."""
    return tl.minimum(tl.maximum(tl.floor(x + 0.5), -127.0), 127.0).to(tl.int8)


@triton.jit
def _quantize_q(q, INT8_QK: tl.constexpr):
    """A query tile as int8 codes for Q.K on the int8 MMA, once per program: each row
    symmetric with its own scale absmax / 127 (a zero row gets codes 0). INT8_QK = 2
    adds the remainder as a second term at 1/256 of that scale, so that
    q ~= (256 * q_hi + q_lo) * q_sc exactly as the kernel combines the two MMAs.
    Returns (q_hi, q_lo, q_sc); q_lo is q_hi for one term (never read)."""
    qf = q.to(tl.float32)
    amax = tl.max(tl.abs(qf), axis=1)
    # A masked (zero) row divides by the floor, not by 0: its codes stay 0.
    x = qf * (127.0 / tl.maximum(amax, 1.0e-30))[:, None]
    q_hi = _int8_rows(x)
    q_sc = amax / 127.0
    if INT8_QK == 2:
        # x - q_hi is in [-0.5, 0.5]: at 256x it fills the int8 range.
        q_lo = _int8_rows((x - q_hi.to(tl.float32)) * 256.0)
        q_sc = q_sc / 256.0
    else:
        q_lo = q_hi
    return q_hi, q_lo, q_sc


@triton.jit
def _attend_tile(
    q,
    q_lo,
    q_sc,
    acc,
    m_i,
    l_i,
    k_base,
    v_base,
    blk,
    slot,
    start,
    kv_end,
    row_limit,
    qk_scale,
    offs_t,
    offs_d,
    stride_k_blk: tl.int64,
    stride_k_slot: tl.int64,
    stride_v_blk: tl.int64,
    stride_v_slot: tl.int64,
    ks_base,
    vs_base,
    stride_ks_blk: tl.int64,
    stride_ks_slot: tl.int64,
    stride_vs_blk: tl.int64,
    stride_vs_slot: tl.int64,
    MASKED: tl.constexpr,
    KV_PTH: tl.constexpr,
    OUT_FP16: tl.constexpr,
    FAST_INT8: tl.constexpr,
    FP8_QK: tl.constexpr,
    INT8_QK: tl.constexpr,
):
    """One online-softmax step over KV tokens [start, start + TILE_N).

    m_i is kept in scaled base-2 units and starts at a large finite negative
    value, so that a row that has seen no key gives exp2(-inf - m_i) = 0
    rather than NaN without a per-tile select.

    K and V tiles are widened to the output's 16-bit dtype (the compute dtype)
    as they load (_widen): a no-op for 16-bit caches, exact for int8 (|x| <=
    128) and fp8 e4m3 (its values are bf16 and fp16 values). The raw codes go
    into the MMA; no scale touches a [TILE_N, HEAD_SIZE] tile. Per-tensor fp8
    scales are folded into qk_scale and the output by the caller. FP8_QK: q
    and K are both e4m3 (an fp8 cache with TRITON_ATTN's fp8 queries) and
    Q.K runs as an fp8 MMA on the codes, K not widened at all (sm_89+ only).
    INT8_QK (int8 per-token-head caches): q is _quantize_q's int8 codes (q_lo its
    second term for 2) and Q.K an int8 MMA on them and the raw K codes, into int32;
    the scores are that times q's row scale q_sc and K's token scale.

    KV_PTH: one float32 scale per (token, kv head) (vLLM's int8_per_token_head
    and fp8_per_token_head), applied to the scores' and P's columns, a TILE_N
    vector each, rather than to the [TILE_N, HEAD_SIZE] tiles: the same
    arithmetic as stock unified_attention.
    """
    k_ptrs = k_base + (blk * stride_k_blk + slot * stride_k_slot)[:, None]
    k_ptrs = k_ptrs + offs_d[None, :]
    v_ptrs = v_base + (blk * stride_v_blk + slot * stride_v_slot)[:, None]
    v_ptrs = v_ptrs + offs_d[None, :]
    if MASKED:
        valid = (start + offs_t) < kv_end
        k = tl.load(k_ptrs, mask=valid[:, None], other=0.0)
    else:
        k = tl.load(k_ptrs)
    if not FP8_QK and not INT8_QK:
        k = _widen(k, OUT_FP16, FAST_INT8)
    if KV_PTH:
        # Masked slots read scale 1 (an unused slot's scale may be anything).
        scale_off = blk * stride_ks_blk + slot * stride_ks_slot
        if MASKED:
            k_sc = tl.load(ks_base + scale_off, mask=valid, other=1.0)
            v_sc = tl.load(vs_base + (blk * stride_vs_blk + slot * stride_vs_slot),
                           mask=valid, other=1.0)
        else:
            k_sc = tl.load(ks_base + scale_off)
            v_sc = tl.load(vs_base + (blk * stride_vs_blk + slot * stride_vs_slot))
        if INT8_QK:
            # int8 x int8 -> int32. Two terms: |256 * hi + lo| <= 257 * 127 * 128 a
            # product, x 256 of them (the largest head size maybe_create admits) < 2^31.
            s_i = tl.dot(q, tl.trans(k))
            if INT8_QK == 2:
                # Two MMAs summed outside, not the second accumulating onto the
                # first: Triton 3.6 refused that form for sm_90 (the H200 sweep).
                s_i = s_i * 256 + tl.dot(q_lo, tl.trans(k))
            s = s_i.to(tl.float32) * q_sc[:, None] * k_sc[None, :]
        else:
            s = tl.dot(q, tl.trans(k)) * k_sc[None, :]
    else:
        s = tl.dot(q, tl.trans(k))
    if MASKED:
        # Causal inside the verify block: row r sees keys < row_limit[r]; keys
        # at or past kv_end belong to the next segment.
        visible = ((start + offs_t)[None, :] < row_limit[:, None]) & valid[None, :]
        s = tl.where(visible, s, float("-inf"))
    # qk_scale > 0, so the scaled max is the max of the scaled scores.
    m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    # A constexpr branch (only the taken one is compiled), kept as statements
    # rather than a conditional expression, as the K load above it is.
    if MASKED:  # noqa: SIM108
        v = tl.load(v_ptrs, mask=valid[:, None], other=0.0)
    else:
        v = tl.load(v_ptrs)
    v = _widen(v, OUT_FP16, FAST_INT8)
    if KV_PTH:
        # l_i sums the unscaled p: the V scale weights values, not keys.
        acc = tl.dot((p * v_sc[None, :]).to(v.dtype), v, acc * alpha[:, None])
    else:
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i


@triton.jit
def _segment_tokens(seq_len, min_seg_tokens, NUM_SEGMENTS: tl.constexpr,
                    TILE_N: tl.constexpr):
    """KV tokens per segment: an even split in whole tiles, never too small.

    Computed from the device-side seq_len so a captured graph adapts to the
    context length it replays at; the split and reduce passes agree on it.
    """
    per_seg = tl.cdiv(tl.cdiv(seq_len, NUM_SEGMENTS), TILE_N) * TILE_N
    return tl.maximum(per_seg, min_seg_tokens)


@triton.jit
def _spec_decode_split_kernel(
    out_ptr,
    part_out_ptr,
    part_max_ptr,
    part_sum_ptr,
    q_ptr,
    key_cache_ptr,
    value_cache_ptr,
    k_scale_ptr,
    v_scale_ptr,
    q_scale_ptr,
    block_table_ptr,
    seq_lens_ptr,
    cu_seqlens_q_ptr,
    qk_scale,
    min_seg_tokens,
    max_q,
    stride_q_tok: tl.int64,
    stride_q_head: tl.int64,
    stride_o_tok: tl.int64,
    stride_o_head: tl.int64,
    stride_k_blk: tl.int64,
    stride_k_slot: tl.int64,
    stride_k_head: tl.int64,
    stride_v_blk: tl.int64,
    stride_v_slot: tl.int64,
    stride_v_head: tl.int64,
    stride_ks_blk: tl.int64,
    stride_ks_slot: tl.int64,
    stride_ks_head: tl.int64,
    stride_vs_blk: tl.int64,
    stride_vs_slot: tl.int64,
    stride_vs_head: tl.int64,
    stride_bt: tl.int64,
    NUM_HEADS: tl.constexpr,
    G: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    Q_TILES: tl.constexpr,
    TILE_N: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
    BT_LOOKAHEAD: tl.constexpr,
    KV_SCALES: tl.constexpr,
    Q_SCALED: tl.constexpr,
    OUT_FP16: tl.constexpr = False,
    FAST_INT8: tl.constexpr = False,
    FP8_QK: tl.constexpr = False,
    INT8_QK: tl.constexpr = 0,
    K_ALIGN: tl.constexpr = 4,
):
    """KV_SCALES: 0 for a 16-bit cache; 1 for a per-tensor fp8 cache, whose
    descales k_scale_ptr / v_scale_ptr are [num_seqs, num_kv_heads] (strides
    stride_ks_blk, stride_ks_head; TRITON_ATTN's expanded per-tensor scalar);
    2 for per-token-head scales, [num_blocks, block_size, num_kv_heads] views.
    Q_SCALED: q is fp8 with the per-tensor descale q_scale_ptr[0] (TRITON_ATTN
    quantizes queries for fp8 caches on CUDA). FAST_INT8, FP8_QK, INT8_QK: _widen's
    and _attend_tile's (TilePlan). K_ALIGN: the bytes a per-token-head cache's K rows
    are known aligned to (4, or 8 with TilePlan.k_align8 where the launcher checked)."""
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    seg = tl.program_id(2)
    seq = pid // Q_TILES
    q_tile = pid % Q_TILES

    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    tile_q0 = q_tile * BLOCK_Q
    if tile_q0 >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    seg_tokens = _segment_tokens(seq_len, min_seg_tokens, NUM_SEGMENTS, TILE_N)
    kv_lo = seg * seg_tokens
    offs_m = tl.arange(0, BLOCK_M)
    q_idx = tile_q0 + offs_m // G
    head = kv_head * G + offs_m % G
    row_ok = (offs_m < BLOCK_Q * G) & (q_idx < q_len)
    # Partials are addressed by (request, query index), not by token, so that
    # the reduce pass can load them before it knows where the request starts.
    part_row = ((seq * max_q + q_idx).to(tl.int64) * NUM_HEADS + head) * NUM_SEGMENTS + seg
    if kv_lo >= seq_len:
        # Past the end of this request's KV: an empty partial (sum 0), so the
        # reduce pass can take every segment without reading seq_lens.
        if NUM_SEGMENTS > 1:
            tl.store(part_max_ptr + part_row, tl.full([BLOCK_M], -1.0e30, tl.float32),
                     mask=row_ok)
            tl.store(part_sum_ptr + part_row, tl.zeros([BLOCK_M], tl.float32), mask=row_ok)
        return

    # Keys before the verify block; query row i sees keys [0, ctx + i].
    ctx = seq_len - q_len
    row_limit = ctx + q_idx + 1
    tile_rows = tl.minimum(q_len - tile_q0, BLOCK_Q)
    lim_lo = ctx + tile_q0 + 1  # the tile's first row sees the fewest keys
    lim_hi = ctx + tile_q0 + tile_rows  # its last row sees the most
    kv_hi = tl.minimum(kv_lo + seg_tokens, lim_hi)

    offs_d = tl.arange(0, HEAD_SIZE)
    offs_t = tl.arange(0, TILE_N)
    tok = (q_start + q_idx).to(tl.int64)
    q = tl.load(
        q_ptr + tok[:, None] * stride_q_tok + head[:, None] * stride_q_head
        + offs_d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )
    # The products run in the output's 16-bit dtype; an fp8 q converts exactly
    # (or stays fp8 for an fp8 Q.K, FP8_QK).
    if not FP8_QK:
        q = q.to(out_ptr.dtype.element_ty)
    # _attend_tile's int8 Q.K operands; placeholders (never read) without it.
    q_lo = q
    q_sc = tl.full([BLOCK_M], 1.0, tl.float32)
    if INT8_QK:
        # Quantized once here, from the 16-bit q the products would otherwise take.
        q, q_lo, q_sc = _quantize_q(q, INT8_QK)
    if Q_SCALED:
        qk_scale = qk_scale * tl.load(q_scale_ptr)
    v_sc_tensor = 1.0
    if KV_SCALES == 1:
        # Per-tensor scales: K's folds into the score scale, V's into the
        # output, so the loop runs as for a 16-bit cache.
        descale_off = seq.to(tl.int64) * stride_ks_blk + kv_head.to(tl.int64) * stride_ks_head
        qk_scale = qk_scale * tl.load(k_scale_ptr + descale_off)
        v_sc_tensor = tl.load(
            v_scale_ptr + seq.to(tl.int64) * stride_vs_blk + kv_head.to(tl.int64) * stride_vs_head
        )

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_SIZE], dtype=tl.float32)
    bt_row = block_table_ptr + seq.to(tl.int64) * stride_bt
    k_base = key_cache_ptr + kv_head.to(tl.int64) * stride_k_head
    v_base = value_cache_ptr + kv_head.to(tl.int64) * stride_v_head
    ks_base = k_scale_ptr
    vs_base = v_scale_ptr
    if KV_SCALES == 2:
        # TRITON_ATTN's per-token-head rows are (head_size + 4)-byte runs: a head's K and
        # V rows start 4-byte aligned, never 16 (the launcher checks), so Triton
        # specialises neither pointer as aligned; say what holds, for 4-byte rather than
        # 1-byte loads (8-byte for K where K_ALIGN says so).
        k_base = tl.multiple_of(k_base, K_ALIGN)
        v_base = tl.multiple_of(v_base, 4)
        ks_base = k_scale_ptr + kv_head.to(tl.int64) * stride_ks_head
        vs_base = v_scale_ptr + kv_head.to(tl.int64) * stride_vs_head

    # Whole tiles that every row of the tile sees need no mask at all.
    full_end = kv_lo + tl.maximum(tl.minimum(kv_hi, lim_lo) - kv_lo, 0) // TILE_N * TILE_N
    if BT_LOOKAHEAD:
        # The next tile's block-table entries are read one tile ahead, so the
        # K/V addresses never wait on a dependent global load.
        blk, slot = _block_and_slot(bt_row, kv_lo, full_end, offs_t, BLOCK_SIZE, TILE_N)
        for start in range(kv_lo, full_end, TILE_N):
            blk_next, slot_next = _block_and_slot(
                bt_row, start + TILE_N, full_end, offs_t, BLOCK_SIZE, TILE_N
            )
            acc, m_i, l_i = _attend_tile(
                q, q_lo, q_sc, acc, m_i, l_i, k_base, v_base, blk, slot, start, kv_hi,
                row_limit, qk_scale, offs_t, offs_d, stride_k_blk, stride_k_slot,
                stride_v_blk, stride_v_slot, ks_base, vs_base, stride_ks_blk,
                stride_ks_slot, stride_vs_blk, stride_vs_slot, False, KV_SCALES == 2,
                OUT_FP16, FAST_INT8, FP8_QK, INT8_QK,
            )
            blk = blk_next
            slot = slot_next
    else:
        for start in range(kv_lo, full_end, TILE_N):
            blk, slot = _block_and_slot(bt_row, start, kv_hi, offs_t, BLOCK_SIZE, TILE_N)
            acc, m_i, l_i = _attend_tile(
                q, q_lo, q_sc, acc, m_i, l_i, k_base, v_base, blk, slot, start, kv_hi,
                row_limit, qk_scale, offs_t, offs_d, stride_k_blk, stride_k_slot,
                stride_v_blk, stride_v_slot, ks_base, vs_base, stride_ks_blk,
                stride_ks_slot, stride_vs_blk, stride_vs_slot, False, KV_SCALES == 2,
                OUT_FP16, FAST_INT8, FP8_QK, INT8_QK,
            )
    for start in range(full_end, kv_hi, TILE_N):
        blk, slot = _block_and_slot(bt_row, start, kv_hi, offs_t, BLOCK_SIZE, TILE_N)
        acc, m_i, l_i = _attend_tile(
            q, q_lo, q_sc, acc, m_i, l_i, k_base, v_base, blk, slot, start, kv_hi, row_limit,
            qk_scale, offs_t, offs_d, stride_k_blk, stride_k_slot, stride_v_blk,
            stride_v_slot, ks_base, vs_base, stride_ks_blk, stride_ks_slot, stride_vs_blk,
            stride_vs_slot, True, KV_SCALES == 2, OUT_FP16, FAST_INT8, FP8_QK, INT8_QK,
        )

    if NUM_SEGMENTS == 1:
        # One segment: normalise and write the result directly.
        res = acc * (tl.where(l_i > 0.0, 1.0 / l_i, 0.0) * v_sc_tensor)[:, None]
        tl.store(
            out_ptr + tok[:, None] * stride_o_tok + head[:, None] * stride_o_head
            + offs_d[None, :],
            res.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None],
        )
    else:
        # Partial outputs are stored normalised, in fp32 (16-bit partials were
        # measured: no faster on an H200, and more rounding).
        tl.store(part_max_ptr + part_row, m_i, mask=row_ok)
        tl.store(part_sum_ptr + part_row, l_i, mask=row_ok)
        part = acc * (tl.where(l_i > 0.0, 1.0 / l_i, 0.0) * v_sc_tensor)[:, None]
        tl.store(
            part_out_ptr + part_row[:, None] * HEAD_SIZE + offs_d[None, :],
            part,
            mask=row_ok[:, None],
        )


@triton.jit
def _spec_decode_reduce_kernel(
    out_ptr,
    part_out_ptr,
    part_max_ptr,
    part_sum_ptr,
    cu_seqlens_q_ptr,
    stride_o_tok: tl.int64,
    stride_o_head: tl.int64,
    NUM_HEADS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    MAX_Q: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
    SEG_CHUNK: tl.constexpr,
):
    pid = tl.program_id(0)
    head = tl.program_id(1)
    seq = pid // MAX_Q
    q_i = pid % MAX_Q
    # Every segment of a valid row was written by the split pass (an empty one
    # with sum 0), so nothing here waits on the request's lengths: the partials
    # and cu_seqlens are loaded together and only the store depends on them.
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    row0 = ((seq * MAX_Q + q_i).to(tl.int64) * NUM_HEADS + head) * NUM_SEGMENTS
    offs_d = tl.arange(0, HEAD_SIZE)
    offs_c = tl.arange(0, SEG_CHUNK)
    if NUM_SEGMENTS == SEG_CHUNK:
        seg_max = tl.load(part_max_ptr + row0 + offs_c)
        top = tl.max(seg_max, axis=0)
        # Segment weight: its softmax sum rescaled to the common max; 0 for a
        # segment none of this row's keys fell in (sum 0).
        w = tl.exp2(seg_max - top) * tl.load(part_sum_ptr + row0 + offs_c)
        part = tl.load(
            part_out_ptr + (row0 + offs_c)[:, None] * HEAD_SIZE + offs_d[None, :]
        )
        denom = tl.sum(w, axis=0)
        acc = tl.sum(tl.where(w[:, None] > 0.0, w[:, None] * part, 0.0), axis=0)
    else:
        top = tl.max(tl.load(part_max_ptr + row0 + tl.arange(0, NUM_SEGMENTS)), axis=0)
        acc = tl.zeros([HEAD_SIZE], dtype=tl.float32)
        denom = 0.0
        for c0 in range(0, NUM_SEGMENTS, SEG_CHUNK):
            cs = row0 + c0 + offs_c
            w = tl.exp2(tl.load(part_max_ptr + cs) - top) * tl.load(part_sum_ptr + cs)
            part = tl.load(part_out_ptr + cs[:, None] * HEAD_SIZE + offs_d[None, :])
            denom += tl.sum(w, axis=0)
            acc += tl.sum(tl.where(w[:, None] > 0.0, w[:, None] * part, 0.0), axis=0)
    res = tl.where(denom > 0.0, acc / denom, 0.0)
    tok = (q_start + q_i).to(tl.int64)
    tl.store(
        out_ptr + tok * stride_o_tok + head * stride_o_head + offs_d,
        res.to(out_ptr.dtype.element_ty),
        mask=(offs_d * 0 + q_i) < q_len,
    )


_GLUON_MODULES: dict[str, ModuleType | None] = {}


def _gluon_module(name: str) -> ModuleType | None:
    """vllm.v1.attention.ops.<name>, a Gluon split pass, or None where this
    Triton lacks Gluon's Hopper API (imported once, on first use: only CUDA
    workspaces ask)."""
    if name not in _GLUON_MODULES:
        mod: ModuleType | None
        try:
            mod = importlib.import_module(f"vllm.v1.attention.ops.{name}")
        except Exception as exc:  # ImportError, or an API this Triton renamed
            logger.info("spec-decode attention: no %s split pass (%s)", name, exc)
            mod = None
        _GLUON_MODULES[name] = mod
    return _GLUON_MODULES[name]


def _hopper_module() -> ModuleType | None:
    return _gluon_module("spec_decode_attention_hopper")


def _hopper_int8_module() -> ModuleType | None:
    return _gluon_module("spec_decode_attention_hopper_int8")


def hopper_available(device: torch.device) -> bool:
    """Whether the warp-specialised split pass can run on this device."""
    return (
        device.type == "cuda"
        and torch.cuda.get_device_capability(device)[0] == 9
        and _hopper_module() is not None
    )


class SpecDecodeWorkspace(WorkspaceShape):
    """Partial-softmax scratch, sized once and never reallocated (gotcha 17);
    its shape (what the planner reads) is the WorkspaceShape it extends."""

    def __init__(
        self,
        max_tokens: int,
        num_heads: int,
        head_size: int,
        device: torch.device,
        num_sms: int,
        budget_bytes: int = WORKSPACE_BUDGET_BYTES,
        max_shared_mem: int = DEFAULT_SHARED_MEM,
        hopper: bool = False,
    ) -> None:
        super().__init__(
            max_tokens,
            num_heads,
            head_size,
            num_sms,
            budget_bytes=budget_bytes,
            max_shared_mem=max_shared_mem,
            hopper=hopper,
        )
        self.part_out = torch.empty(
            self.slots * head_size, dtype=torch.float32, device=device
        )
        self.part_max = torch.empty(self.slots, dtype=torch.float32, device=device)
        self.part_sum = torch.empty(self.slots, dtype=torch.float32, device=device)
        # The int8 Hopper pass's arrival counters when it merges its own partials:
        # two a (request, kv head), zero between launches (it puts them back).
        self.sync = torch.zeros(2 * max_tokens * num_heads, dtype=torch.int32, device=device)

    @property
    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for t in (self.part_out, self.part_max, self.part_sum, self.sync)
        )


def rows_aligned(t: torch.Tensor, align: int) -> bool:
    """Whether every row of a cache view (its last dimension) starts ``align``-byte
    aligned."""
    return t.data_ptr() % align == 0 and all(
        st * t.element_size() % align == 0 for st in t.stride()[:-1])


def int8_rows_aligned(key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    """Whether every K and V row of a per-token-head cache (int8 or fp8) starts 4-byte
    aligned, as the split pass's per-token-head variant tells the compiler (TRITON_ATTN's
    layout does: rows of head_size + 4 bytes)."""
    return all(rows_aligned(t, 4) for t in (key_cache, value_cache))


def _launch_triton_split(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_query_len: int,
    softmax_scale: float,
    workspace: SpecDecodeWorkspace,
    plan: LaunchPlan,
    k_scale_cache: torch.Tensor | None,
    v_scale_cache: torch.Tensor | None,
    q_descale: torch.Tensor | None,
    k_descale: torch.Tensor | None,
    v_descale: torch.Tensor | None,
    tiles: TilePlan,
) -> None:
    num_heads, head_size = q.shape[1], q.shape[2]
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    kv_scales = _KV_PLAIN
    k_scales, v_scales = k_scale_cache, v_scale_cache
    if k_scale_cache is not None and v_scale_cache is not None:
        kv_scales = _KV_TOKEN_HEAD
        ks_strides, vs_strides = k_scale_cache.stride(), v_scale_cache.stride()
    elif k_descale is not None and v_descale is not None:
        # [num_seqs, num_kv_heads] descales ride in the (block, slot, head) stride
        # slots as (seq, unused, head).
        kv_scales = _KV_TENSOR
        k_scales, v_scales = k_descale, v_descale
        ks_strides = (k_descale.stride(0), 0, k_descale.stride(1))
        vs_strides = (v_descale.stride(0), 0, v_descale.stride(1))
    else:
        ks_strides = vs_strides = (0, 0, 0)
    _spec_decode_split_kernel[plan.split_grid](
        out,
        workspace.part_out,
        workspace.part_max,
        workspace.part_sum,
        q,
        key_cache,
        value_cache,
        k_scales,
        v_scales,
        q_descale,
        block_table,
        seq_lens,
        cu_seqlens_q,
        softmax_scale * _LOG2E,
        plan.min_segment_tokens,
        max_query_len,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        *ks_strides,
        *vs_strides,
        block_table.stride(0),
        NUM_HEADS=num_heads,
        G=num_heads // num_kv_heads,
        HEAD_SIZE=head_size,
        BLOCK_SIZE=block_size,
        BLOCK_M=plan.block_m,
        BLOCK_Q=plan.block_q,
        Q_TILES=plan.q_tiles,
        TILE_N=plan.tile_n,
        NUM_SEGMENTS=plan.num_segments,
        BT_LOOKAHEAD=plan.bt_lookahead,
        KV_SCALES=kv_scales,
        Q_SCALED=q_descale is not None,
        OUT_FP16=out.dtype == torch.float16,
        FAST_INT8=key_cache.dtype == torch.int8 and use_fast_int8(tiles, q.device),
        # Per-tensor fp8 only: a per-token-head cache's queries are 16-bit.
        FP8_QK=(tiles.fp8_qk and kv_scales == _KV_TENSOR
                and q.dtype == key_cache.dtype == torch.float8_e4m3fn),
        # int8 per-token-head caches only (16-bit queries there).
        INT8_QK=tiles.int8_qk if kv_scales == _KV_TOKEN_HEAD and key_cache.dtype == torch.int8
        else 0,
        K_ALIGN=8 if (tiles.k_align8 and kv_scales == _KV_TOKEN_HEAD
                      and rows_aligned(key_cache, 8)) else 4,
        num_warps=plan.num_warps,
        num_stages=plan.num_stages,
    )


def spec_decode_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_query_len: int,
    softmax_scale: float,
    workspace: SpecDecodeWorkspace,
    plan: LaunchPlan | None = None,
    k_scale_cache: torch.Tensor | None = None,
    v_scale_cache: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    tiles: TilePlan | None = None,
) -> LaunchPlan:
    """Causal paged attention for verify batches.

    q, out: [tokens, num_heads, head_size]; key_cache, value_cache:
    [num_blocks, block_size, num_kv_heads, head_size or more] (any strides,
    unit stride on head_size); cu_seqlens_q: [num_seqs + 1]; seq_lens:
    [num_seqs] (KV length including the verify block); block_table:
    [num_seqs, *]. A per-token-head cache (int8_per_token_head,
    fp8_per_token_head) comes with its float32 scales, k_scale_cache and
    v_scale_cache: [num_blocks, block_size, num_kv_heads], any strides
    (TRITON_ATTN's views into the cache's padding). A per-tensor fp8 cache
    (fp8, fp8_e4m3) comes with k_descale and v_descale: float32 [num_seqs,
    num_kv_heads], any strides (TRITON_ATTN expands the layer's scalar); an
    fp8 q (TRITON_ATTN's quantized queries) with its scalar q_descale.
    tiles: the Triton split pass's tile plan and switches (default:
    cache_tile_plan, TILE_PLANS or the card's ARCH_TILE_PLANS entry); its
    plan_launch overrides apply only when plan is None.
    """
    if out.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"spec-decode attention writes 16-bit outputs, not {out.dtype}")
    one_byte = key_cache.element_size() == 1
    per_token_head = k_scale_cache is not None and v_scale_cache is not None
    per_tensor = not per_token_head and k_descale is not None and v_descale is not None
    if one_byte != (per_token_head or per_tensor):
        raise ValueError(
            f"spec-decode attention: a {key_cache.dtype} KV cache "
            f"{'without' if one_byte else 'with'} scales; 8-bit caches, and only "
            "those, take k_scale_cache/v_scale_cache (per token and head) or "
            "k_descale/v_descale (per tensor)"
        )
    if per_tensor and key_cache.dtype != torch.float8_e4m3fn:
        raise ValueError(
            f"spec-decode attention: per-tensor scales on a {key_cache.dtype} cache; "
            "only fp8 e4m3 caches take k_descale/v_descale"
        )
    if (q.dtype == torch.float8_e4m3fn) != (q_descale is not None):
        raise ValueError(
            f"spec-decode attention: a {q.dtype} query "
            f"{'without' if q_descale is None else 'with'} q_descale; fp8 queries, "
            "and only those, take it"
        )
    if per_token_head and not int8_rows_aligned(key_cache, value_cache):
        raise ValueError(
            "spec-decode attention: a per-token-head KV cache whose rows are not 4-byte "
            f"aligned (strides {tuple(key_cache.stride())}, {tuple(value_cache.stride())})"
        )
    num_seqs = seq_lens.shape[0]
    num_heads, head_size = q.shape[1], q.shape[2]
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    if tiles is None:
        tiles = cache_tile_plan(key_cache)
    if plan is None:
        plan = plan_for_cache(
            num_seqs, max_query_len, num_heads, num_kv_heads, head_size, workspace,
            key_cache, per_token_head, tiles,
        )
    int8_hopper = None
    if plan.kernel == "hopper" and (one_byte or q_descale is not None):
        int8_hopper, why = _int8_hopper_for(
            key_cache, value_cache, k_scale_cache, v_scale_cache, q_descale, plan
        )
        if int8_hopper is None:
            # fp8 caches, and int8 ones the int8 Hopper pass cannot address: the
            # Triton split pass with the cache's tile plan, same partials.
            logger.warning_once(
                "spec-decode attention: no Hopper split pass for this %s cache (%s); "
                "using the Triton one",
                key_cache.dtype,
                why,
            )
            plan = plan_launch(
                num_seqs, max_query_len, num_heads, num_kv_heads, head_size, workspace,
                kernel="triton", **tiles.plan_overrides(),
            )
    hopper = _hopper_module() if plan.kernel == "hopper" and int8_hopper is None else None
    if plan.kernel == "hopper" and int8_hopper is None and (
        hopper is None or not hopper.tma_compatible(key_cache, value_cache, plan.tile_n)
    ):
        # A cache TMA cannot address (block size, strides, alignment): the
        # portable split pass, same partials.
        logger.warning_once(
            "spec-decode attention: this KV cache layout (block size %d, strides "
            "%s) does not suit the Hopper split pass; using the Triton one",
            block_size,
            tuple(key_cache.stride()),
        )
        plan = plan_launch(
            num_seqs, max_query_len, num_heads, num_kv_heads, head_size, workspace,
            kernel="triton",
        )
    if plan.num_segments > 1 or plan.kernel == "hopper":
        needed = num_seqs * max_query_len * plan.num_segments
        if needed > workspace.slots_per_head:
            raise RuntimeError(
                f"spec-decode attention workspace holds {workspace.slots_per_head} "
                f"token-segments per head, this batch needs {needed}"
            )
    fused = int8_hopper is not None and plan.fused_reduce
    if fused and not fusable_grid(plan, head_size, workspace.num_sms):
        raise ValueError(
            f"spec-decode attention: a fused-reduce plan whose grid {plan.split_grid} "
            f"does not fit {workspace.num_sms} SMs at once or splits head size "
            f"{head_size} unevenly"
        )
    if int8_hopper is not None:
        int8_hopper.ws_split_int8(
            q,
            key_cache,
            cu_seqlens_q,
            seq_lens,
            block_table,
            max_query_len,
            softmax_scale * _LOG2E,
            workspace.part_out,
            workspace.part_max,
            workspace.part_sum,
            plan.num_wg,
            plan.wg_q,
            plan.num_segments,
            plan.min_segment_tokens,
            out,
            workspace.sync,
            fused,
        )
    elif plan.kernel == "hopper" and hopper is not None:
        hopper.ws_split(
            q,
            key_cache,
            value_cache,
            cu_seqlens_q,
            seq_lens,
            block_table,
            max_query_len,
            softmax_scale * _LOG2E,
            workspace.part_out,
            workspace.part_max,
            workspace.part_sum,
            plan.num_wg,
            plan.wg_q,
            plan.q_tiles,
            plan.tile_n,
            plan.num_stages,
            plan.num_segments,
            plan.min_segment_tokens,
        )
    else:
        _launch_triton_split(
            q, key_cache, value_cache, out, cu_seqlens_q, seq_lens, block_table,
            max_query_len, softmax_scale, workspace, plan, k_scale_cache, v_scale_cache,
            q_descale, k_descale if per_tensor else None, v_descale if per_tensor else None,
            tiles,
        )
    if not fused:
        launch_reduce(out, cu_seqlens_q, max_query_len, workspace, plan)
    return plan


def plan_for_cache(
    num_seqs: int,
    max_query_len: int,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    workspace: SpecDecodeWorkspace,
    key_cache: torch.Tensor,
    per_token_head: bool,
    tiles: TilePlan,
) -> LaunchPlan:
    """The plan a batch on this cache gets by default. 16-bit caches: the
    planner's choice (the Hopper split pass where the workspace runs it), with
    the cache family's overrides. int8_per_token_head caches on such a
    workspace: the Hopper planner's own plan, whose segments the int8 Hopper
    pass walks in its own tiles (spec_decode_attention checks the cache
    itself). Other 8-bit caches, and int8 ones elsewhere: the Triton split
    pass with the family's tile plan."""
    kernel = None
    if key_cache.element_size() == 1:
        if workspace.hopper and per_token_head and key_cache.dtype == torch.int8:
            plan = plan_launch(
                num_seqs, max_query_len, num_heads, num_kv_heads, head_size, workspace
            )
            if plan.kernel == "hopper":
                return dataclasses.replace(
                    plan,
                    fused_reduce=INT8_FUSED_REDUCE
                    and fusable_grid(plan, head_size, workspace.num_sms),
                )
        kernel = "triton"
    return plan_launch(
        num_seqs, max_query_len, num_heads, num_kv_heads, head_size, workspace,
        kernel=kernel, **tiles.plan_overrides(),
    )


def _int8_hopper_for(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    k_scale_cache: torch.Tensor | None,
    v_scale_cache: torch.Tensor | None,
    q_descale: torch.Tensor | None,
    plan: LaunchPlan,
) -> tuple[ModuleType | None, str]:
    """The int8 Hopper split pass for this cache under this Hopper plan, or None
    and why not."""
    if key_cache.dtype != torch.int8 or q_descale is not None:
        return None, "only int8_per_token_head caches have a Hopper split pass"
    if k_scale_cache is None or v_scale_cache is None:
        return None, "an int8 cache without its per-token-head scales"
    why = int8_hopper_unsupported(key_cache, value_cache, k_scale_cache, v_scale_cache, plan)
    if why is not None:
        return None, why
    mod = _hopper_int8_module()
    if mod is None:
        return None, "this Triton has no Gluon Hopper API"
    return mod, ""


def launch_reduce(
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    max_query_len: int,
    workspace: SpecDecodeWorkspace,
    plan: LaunchPlan,
) -> None:
    """The reduce pass of a split launch (nothing for a one-segment plan); its own
    function so that the benchmark can time it apart from the split pass."""
    if plan.reduce_grid is None:
        return
    _spec_decode_reduce_kernel[plan.reduce_grid](
        out,
        workspace.part_out,
        workspace.part_max,
        workspace.part_sum,
        cu_seqlens_q,
        out.stride(0),
        out.stride(1),
        NUM_HEADS=out.shape[1],
        HEAD_SIZE=out.shape[2],
        MAX_Q=max_query_len,
        NUM_SEGMENTS=plan.num_segments,
        # One pass over up to 64 segments: every load in flight at once.
        SEG_CHUNK=min(plan.num_segments, 64),
        num_warps=8 if plan.num_segments >= 32 else 4,
    )


# Shared across layers of one process: layers run one after another on one
# stream, so one scratch per (device, heads, head size) suffices.
_WORKSPACES: dict[tuple[str, int, int, int], SpecDecodeWorkspace] = {}


def get_workspace(
    max_tokens: int, num_heads: int, head_size: int, device: torch.device
) -> SpecDecodeWorkspace:
    key = (str(device), num_heads, head_size, max_tokens)
    ws = _WORKSPACES.get(key)
    if ws is None:
        smem = DEFAULT_SHARED_MEM
        if device.type == "cuda":
            props = torch.cuda.get_device_properties(device)
            num_sms = props.multi_processor_count
            smem = getattr(props, "shared_memory_per_block_optin", 0) or smem
        else:
            # No SM count off-GPU (the Triton interpreter): plan as for a large
            # GPU so that the split path is the one exercised.
            num_sms = 128
        ws = SpecDecodeWorkspace(
            max_tokens,
            num_heads,
            head_size,
            device,
            num_sms,
            max_shared_mem=smem,
            hopper=hopper_available(device),
        )
        _WORKSPACES[key] = ws
        logger.info(
            "spec-decode attention: %.1f MiB scratch for %d tokens x %d heads "
            "(%d segments per token); split pass: %s",
            ws.nbytes / (1 << 20),
            max_tokens,
            num_heads,
            ws.segments_per_token,
            "warp-specialised Hopper kernel" if ws.hopper else "Triton kernel",
        )
    return ws


def _workspace_device() -> torch.device:
    # Model construction runs under ``with torch.device(target)``.
    device = torch.get_default_device()
    if device.type == "cpu" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


class SpecDecodeAttention:
    """The split-KV path as one attention layer's impl sees it.

    Built at startup (impl ``__init__``) when ``VLLM_SPEC_DECODE_ATTN`` is on
    and the layer qualifies; ``forward`` then takes a batch iff its largest
    query length is in (1, QMAX] and returns False otherwise (stock path).
    """

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_size: int,
        scale: float,
        qmax: int,
        max_num_seqs: int,
        device: torch.device,
        kv_cache_dtype: str = "auto",
    ) -> None:
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.scale = scale
        self.qmax = qmax
        self.max_num_seqs = max_num_seqs
        # Per-token-head caches: forward takes the caches' scale views too;
        # per-tensor fp8 ones the layer's descales (and an fp8 query's).
        self.kv_pth = kv_cache_dtype in ("int8_per_token_head", "fp8_per_token_head")
        self.kv_fp8_tensor = kv_cache_dtype in FP8_TENSOR_KV_DTYPES
        self.workspace = get_workspace(max_num_seqs * qmax, num_heads, head_size, device)
        self.last_plan: LaunchPlan | None = None

    @classmethod
    def maybe_create(
        cls,
        num_heads: int,
        num_kv_heads: int,
        head_size: int,
        scale: float,
        kv_cache_dtype: str,
        sliding_window: int | None,
        has_alibi: bool,
        logits_soft_cap: float | None,
        has_sinks: bool,
        is_decoder: bool,
        backend: str = "attention",
    ) -> "SpecDecodeAttention | None":
        import vllm.envs as envs

        if not envs.VLLM_SPEC_DECODE_ATTN:
            return None
        qmax = envs.VLLM_SPEC_DECODE_ATTN_QMAX
        if qmax < 2:
            raise ValueError(
                f"VLLM_SPEC_DECODE_ATTN_QMAX={qmax}: the split-KV verify path "
                "needs at least 2 query tokens per request; set it to the verify "
                "block length (num_speculative_tokens + 1)."
            )
        reasons = []
        if kv_cache_dtype not in SUPPORTED_KV_CACHE_DTYPES:
            reasons.append(f"kv cache dtype {kv_cache_dtype}")
        elif backend not in QUANTIZED_KV_BACKENDS.get(kv_cache_dtype, (backend,)):
            reasons.append(f"kv cache dtype {kv_cache_dtype} on {backend}")
        if head_size & (head_size - 1) or not 16 <= head_size <= 256:
            reasons.append(f"head size {head_size}")
        if num_heads % num_kv_heads:
            reasons.append(f"{num_heads} heads over {num_kv_heads} kv heads")
        if sliding_window is not None:
            reasons.append("sliding window")
        if has_alibi:
            reasons.append("alibi")
        if logits_soft_cap:
            reasons.append("soft cap")
        if has_sinks:
            reasons.append("sinks")
        if not is_decoder:
            reasons.append("non-decoder attention")
        if envs.VLLM_BATCH_INVARIANT:
            reasons.append("batch invariance")
        if reasons:
            # A warning, not info: VLLM_SPEC_DECODE_ATTN=1 was asked for, and
            # this layer's verify batches take the stock 2-D grid instead.
            logger.warning_once(
                "spec-decode attention declines a %s layer (%s): its verify "
                "batches take the stock attention path",
                backend,
                ", ".join(reasons),
            )
            return None

        from vllm.config import get_current_vllm_config_or_none

        config = get_current_vllm_config_or_none()
        max_num_seqs = 1
        if config is not None:
            max_num_seqs = config.scheduler_config.max_num_seqs
            spec = config.speculative_config
            k = getattr(spec, "num_speculative_tokens", None) if spec else None
            if k is not None and k + 1 > qmax:
                raise ValueError(
                    f"num_speculative_tokens={k} makes verify blocks of {k + 1} "
                    f"query tokens, above VLLM_SPEC_DECODE_ATTN_QMAX={qmax}. The "
                    "split-KV scratch is sized at startup and never grows (a "
                    "captured CUDA graph keeps its addresses); set "
                    f"VLLM_SPEC_DECODE_ATTN_QMAX={k + 1} or larger."
                )
        return cls(
            num_heads,
            num_kv_heads,
            head_size,
            scale,
            qmax,
            max_num_seqs,
            _workspace_device(),
            kv_cache_dtype,
        )

    def forward(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        output: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_table: torch.Tensor,
        max_query_len: int,
        causal: object,
        k_scale_cache: torch.Tensor | None = None,
        v_scale_cache: torch.Tensor | None = None,
        q_descale: torch.Tensor | None = None,
        k_descale: torch.Tensor | None = None,
        v_descale: torch.Tensor | None = None,
    ) -> bool:
        """Run the split-KV path if this batch qualifies; False means the
        caller runs its stock kernel. Only CPU-side facts decide. A
        per-token-head layer passes its scale caches (TRITON_ATTN's views); a
        per-tensor fp8 one its descales (TRITON_ATTN passes them for every
        cache: only an fp8 layer reads them)."""
        if not 1 < max_query_len <= self.qmax or causal is not True:
            return False
        if output.dtype not in (torch.bfloat16, torch.float16):
            return False
        fp8_query = (self.kv_fp8_tensor and query.dtype == torch.float8_e4m3fn
                     and q_descale is not None)
        if query.dtype != output.dtype and not fp8_query:
            return False
        if not fp8_query:
            q_descale = None
        if self.kv_pth:
            if (key_cache.dtype not in (torch.int8, torch.float8_e4m3fn)
                    or k_scale_cache is None or v_scale_cache is None
                    or not int8_rows_aligned(key_cache, value_cache)):
                return False
            k_descale = v_descale = None
        elif self.kv_fp8_tensor:
            if (key_cache.dtype != torch.float8_e4m3fn or k_descale is None
                    or v_descale is None or k_scale_cache is not None):
                return False
        elif query.dtype != key_cache.dtype or k_scale_cache is not None:
            return False
        else:
            k_descale = v_descale = None
        if key_cache.stride(-1) != 1:
            return False
        num_seqs = seq_lens.shape[0]
        if num_seqs > self.max_num_seqs:
            logger.warning_once(
                "spec-decode attention: %d sequences exceed max_num_seqs=%d the "
                "scratch was sized for; using the stock kernel",
                num_seqs,
                self.max_num_seqs,
            )
            return False
        ws = self.workspace
        tiles = cache_tile_plan(key_cache)
        for _ in range(8):
            plan = plan_for_cache(
                num_seqs,
                max_query_len,
                self.num_heads,
                self.num_kv_heads,
                self.head_size,
                ws,
                key_cache,
                self.kv_pth,
                tiles,
            )
            try:
                # The plan it ran: the int8 and TMA checks may have turned it
                # into a Triton one.
                plan = spec_decode_attention(
                    query,
                    key_cache,
                    value_cache,
                    output,
                    query_start_loc,
                    seq_lens,
                    block_table,
                    max_query_len,
                    self.scale,
                    ws,
                    plan,
                    k_scale_cache,
                    v_scale_cache,
                    q_descale,
                    k_descale,
                    v_descale,
                    tiles,
                )
            except Exception as exc:
                if plan.kernel == "hopper" and type(exc).__name__ == "CompilationError":
                    # Gluon is experimental: a Triton whose Gluon API moved fails
                    # to compile the Hopper split pass before launching anything.
                    # Use the Triton split pass from here on, for every layer.
                    ws.hopper = False
                    logger.warning(
                        "spec-decode attention: the Hopper split pass does not compile "
                        "with this Triton (%s); using the Triton split pass",
                        str(exc).strip().splitlines()[-1] if str(exc).strip() else exc,
                    )
                    continue
                # The shared-memory estimate is Triton's allocation only roughly;
                # a compile that does not fit fails before anything is launched,
                # so plan below it (for every layer: the workspace is shared).
                if type(exc).__name__ != "OutOfResources":
                    raise
                # A Hopper plan over an int8 cache ran the int8 Hopper pass.
                smem = plan_smem(
                    plan,
                    self.head_size,
                    int8_hopper=plan.kernel == "hopper" and key_cache.dtype == torch.int8,
                )
                ws.max_shared_mem = min(ws.max_shared_mem, smem) - 1
                logger.warning_once(
                    "spec-decode attention: %s; planning smaller tiles", exc
                )
                continue
            self.last_plan = plan
            return True
        raise RuntimeError("spec-decode attention: no launch plan fits this GPU")
