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
# On sm_90 (Hopper) the split pass is the warp-specialised Gluon kernel of
# spec_decode_attention_hopper.py (TMA loads in their own warp, 64-row
# warpgroups); everywhere else, and for caches TMA cannot address, the
# portable Triton split pass below. Both write the same partials.

from dataclasses import dataclass
from typing import Any

import torch

from vllm.logger import init_logger
from vllm.triton_utils import tl, triton

logger = init_logger(__name__)

# The kernels run the softmax in base 2 (exp2 is one instruction).
_LOG2E = 1.4426950408889634
# Rows of one query tile (query tokens x heads per kv head). 128 rows of
# head_dim 256 keep the fp32 accumulator at 128 registers/thread with 8 warps.
MAX_BLOCK_M = 128
# Segment-count ceiling per launch.
MAX_SEGMENTS = 128
# A segment never covers fewer KV tokens than this (see plan_launch).
MIN_SEGMENT_TOKENS = 256
# Workspace budget: segments per slot are granted up to this many bytes; a
# workspace always has at least one slot per (token, head).
WORKSPACE_BUDGET_BYTES = 64 << 20


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
def _attend_tile(
    q,
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
    MASKED: tl.constexpr,
):
    """One online-softmax step over KV tokens [start, start + TILE_N).

    m_i is kept in scaled base-2 units and starts at a large finite negative
    value, so that a row that has seen no key gives exp2(-inf - m_i) = 0
    rather than NaN without a per-tile select.
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
    if MASKED:
        v = tl.load(v_ptrs, mask=valid[:, None], other=0.0)
    else:
        v = tl.load(v_ptrs)
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
):
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

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_SIZE], dtype=tl.float32)
    bt_row = block_table_ptr + seq.to(tl.int64) * stride_bt
    k_base = key_cache_ptr + kv_head.to(tl.int64) * stride_k_head
    v_base = value_cache_ptr + kv_head.to(tl.int64) * stride_v_head

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
                q, acc, m_i, l_i, k_base, v_base, blk, slot, start, kv_hi,
                row_limit, qk_scale, offs_t, offs_d, stride_k_blk, stride_k_slot,
                stride_v_blk, stride_v_slot, False,
            )
            blk = blk_next
            slot = slot_next
    else:
        for start in range(kv_lo, full_end, TILE_N):
            blk, slot = _block_and_slot(bt_row, start, kv_hi, offs_t, BLOCK_SIZE, TILE_N)
            acc, m_i, l_i = _attend_tile(
                q, acc, m_i, l_i, k_base, v_base, blk, slot, start, kv_hi,
                row_limit, qk_scale, offs_t, offs_d, stride_k_blk, stride_k_slot,
                stride_v_blk, stride_v_slot, False,
            )
    for start in range(full_end, kv_hi, TILE_N):
        blk, slot = _block_and_slot(bt_row, start, kv_hi, offs_t, BLOCK_SIZE, TILE_N)
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, k_base, v_base, blk, slot, start, kv_hi, row_limit,
            qk_scale, offs_t, offs_d, stride_k_blk, stride_k_slot, stride_v_blk,
            stride_v_slot, True,
        )

    if NUM_SEGMENTS == 1:
        # One segment: normalise and write the result directly.
        res = acc * tl.where(l_i > 0.0, 1.0 / l_i, 0.0)[:, None]
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
        part = acc * tl.where(l_i > 0.0, 1.0 / l_i, 0.0)[:, None]
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


@dataclass(frozen=True)
class LaunchPlan:
    """Shapes of one split-KV launch (also what the tests inspect)."""

    block_m: int
    block_q: int
    q_tiles: int
    tile_n: int
    num_segments: int
    min_segment_tokens: int
    num_warps: int
    num_stages: int
    bt_lookahead: int
    split_grid: tuple[int, int, int]
    reduce_grid: tuple[int, int] | None
    # "triton" (portable) or "hopper" (warp-specialised, sm_90); the Hopper
    # kernel's consumer warpgroups and query tokens per warpgroup.
    kernel: str = "triton"
    num_wg: int = 0
    wg_q: int = 0


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _prev_pow2(n: int) -> int:
    return 0 if n <= 0 else 1 << (n.bit_length() - 1)


_HOPPER: list[Any] = []


def _hopper_module() -> Any:
    """spec_decode_attention_hopper, or None where this Triton lacks Gluon's
    Hopper API (imported once, on first use: only CUDA workspaces ask)."""
    if not _HOPPER:
        try:
            from vllm.v1.attention.ops import spec_decode_attention_hopper as mod
        except Exception as exc:  # ImportError, or an API this Triton renamed
            logger.info("spec-decode attention: no Hopper split pass (%s)", exc)
            mod = None
        _HOPPER.append(mod)
    return _HOPPER[0]


def hopper_available(device: torch.device) -> bool:
    """Whether the warp-specialised split pass can run on this device."""
    return (
        device.type == "cuda"
        and torch.cuda.get_device_capability(device)[0] == 9
        and _hopper_module() is not None
    )


class SpecDecodeWorkspace:
    """Partial-softmax scratch, sized once and never reallocated (gotcha 17).

    ``max_tokens`` = max_num_seqs x QMAX bounds the query tokens of any batch
    this path accepts. Each (token, head) gets ``segments_per_token`` slots;
    a batch with fewer tokens may use more segments per token, as long as
    tokens x segments stays within the same slots.
    """

    def __init__(
        self,
        max_tokens: int,
        num_heads: int,
        head_size: int,
        device: torch.device,
        num_sms: int,
        budget_bytes: int = WORKSPACE_BUDGET_BYTES,
        max_shared_mem: int = 227 << 10,
        hopper: bool = False,
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        # A slot: head_size fp32 partial outputs plus an fp32 max and sum.
        per_segment = max_tokens * num_heads * (head_size + 2) * 4
        self.segments_per_token = max(
            1, min(MAX_SEGMENTS, _prev_pow2(budget_bytes // per_segment))
        )
        self.max_tokens = max_tokens
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_sms = num_sms
        # Shared memory a program may use; plan_launch sizes tiles to fit, and
        # a launch that still runs out shrinks it (see SpecDecodeAttention).
        self.max_shared_mem = max_shared_mem
        # Plans use the warp-specialised Hopper split pass (see hopper_available).
        self.hopper = hopper
        slots = max_tokens * num_heads * self.segments_per_token
        self.slots_per_head = max_tokens * self.segments_per_token
        self.part_out = torch.empty(slots * head_size, dtype=torch.float32, device=device)
        self.part_max = torch.empty(slots, dtype=torch.float32, device=device)
        self.part_sum = torch.empty(slots, dtype=torch.float32, device=device)

    @property
    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for t in (self.part_out, self.part_max, self.part_sum)
        )


def _smem_estimate(block_m: int, tile_n: int, num_stages: int, head_size: int) -> int:
    return (num_stages * 2 * tile_n + block_m) * head_size * 2


def _hopper_smem_estimate(num_wg: int, tile_n: int, num_stages: int, head_size: int) -> int:
    # K and V stages plus each warpgroup's 64 query rows, and room for the
    # mbarriers and alignment (Triton allocated 248 bytes more than the tiles).
    return (num_stages * 2 * tile_n + num_wg * 64) * head_size * 2 + 512


def plan_smem(plan: "LaunchPlan", head_size: int) -> int:
    """Estimated shared memory of one split program of this plan."""
    if plan.kernel == "hopper":
        return _hopper_smem_estimate(plan.num_wg, plan.tile_n, plan.num_stages, head_size)
    return _smem_estimate(plan.block_m, plan.tile_n, plan.num_stages, head_size)


def _hopper_shape_ok(head_size: int, group: int) -> bool:
    # Whole 64-column head_dim chunks (one accumulator each, at most four),
    # and one query token's heads within a 64-row warpgroup.
    return head_size % 64 == 0 and head_size <= 256 and group <= 64


def _plan_hopper(
    num_seqs: int,
    max_query_len: int,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    workspace: SpecDecodeWorkspace,
    num_segments: int | None,
    tile_n: int | None,
    num_stages: int | None,
    min_segment_tokens: int | None,
) -> "LaunchPlan":
    g = num_heads // num_kv_heads
    # One consumer warpgroup of 64 rows while the verify block fits (q <= 10
    # at G=6), else two; longer blocks take more query tiles.
    per_wg = 64 // g
    num_wg = 1 if max_query_len <= per_wg else 2
    wg_q = min(per_wg, -(-max_query_len // num_wg))
    block_q = wg_q * num_wg
    q_tiles = -(-max_query_len // block_q)
    # H200 (python/benchmarks/spec_decode_attn.md): 64-token tiles in two
    # stages beat 32-token ones in three or four (192 KiB with two warpgroups,
    # 160 KiB with one); either way one program per SM.
    if tile_n is None:
        tile_n = 64
    if num_stages is None:
        num_stages = 2
    while _hopper_smem_estimate(num_wg, tile_n, num_stages, head_size) > workspace.max_shared_mem:
        if num_stages > 2:
            num_stages -= 1
        elif tile_n > 16:
            tile_n //= 2
        elif num_stages > 1:
            num_stages -= 1
        else:
            break
    if num_segments is None:
        programs = num_seqs * q_tiles * num_kv_heads
        capacity = workspace.slots_per_head // max(num_seqs * max_query_len, 1)
        num_segments = max(
            1,
            min(MAX_SEGMENTS, _prev_pow2(workspace.num_sms // programs), _prev_pow2(capacity)),
        )
    if num_segments < 1 or num_segments & (num_segments - 1):
        raise ValueError(f"num_segments must be a power of two, got {num_segments}")
    if min_segment_tokens is None:
        rows = min(max_query_len, block_q) * g
        min_segment_tokens = max(MIN_SEGMENT_TOKENS, _next_pow2(4 * rows))
    min_segment_tokens = -(-min_segment_tokens // tile_n) * tile_n
    return LaunchPlan(
        block_m=64 * num_wg,
        block_q=block_q,
        q_tiles=q_tiles,
        tile_n=tile_n,
        num_segments=num_segments,
        min_segment_tokens=min_segment_tokens,
        num_warps=4,
        num_stages=num_stages,
        bt_lookahead=0,
        split_grid=(num_seqs * q_tiles, num_kv_heads, num_segments),
        # The Hopper split pass always leaves partials, even in one segment.
        reduce_grid=(num_seqs * max_query_len, num_heads),
        kernel="hopper",
        num_wg=num_wg,
        wg_q=wg_q,
    )


def plan_launch(
    num_seqs: int,
    max_query_len: int,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    workspace: SpecDecodeWorkspace,
    num_segments: int | None = None,
    tile_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    min_segment_tokens: int | None = None,
    block_m: int | None = None,
    bt_lookahead: int | None = None,
    kernel: str | None = None,
) -> LaunchPlan:
    """Choose tiles and segments from shapes only (never from context lengths,
    which a captured graph does not see change). Defaults come from an H200
    sweep (python/benchmarks/spec_decode_attn.md in qwen3090)."""
    g = num_heads // num_kv_heads
    if kernel is None:
        kernel = (
            "hopper" if workspace.hopper and _hopper_shape_ok(head_size, g) else "triton"
        )
    if kernel == "hopper":
        if not _hopper_shape_ok(head_size, g):
            raise ValueError(
                f"the Hopper split pass takes head sizes in 64-column chunks up to "
                f"256 and at most 64 heads per kv head, not {head_size} / {g}"
            )
        return _plan_hopper(
            num_seqs, max_query_len, num_heads, num_kv_heads, head_size, workspace,
            num_segments, tile_n, num_stages, min_segment_tokens,
        )
    if kernel != "triton":
        raise ValueError(f"kernel must be 'triton' or 'hopper', not {kernel!r}")
    if block_m is None:
        block_m = min(MAX_BLOCK_M, _next_pow2(max_query_len * g))
    block_m = max(16, block_m, _next_pow2(g))
    block_q = block_m // g
    q_tiles = -(-max_query_len // block_q)
    tokens_bound = num_seqs * max_query_len
    capacity = workspace.slots_per_head // max(tokens_bound, 1)
    # A 128-row tile fills an SM's shared memory (one program per SM); smaller
    # tiles run two per SM. Aim for one full wave of programs: fewer, longer
    # segments cost less partial-output traffic than extra waves.
    per_sm = 1 if block_m >= 128 else 2
    if num_segments is None:
        programs = num_seqs * q_tiles * num_kv_heads
        want = _prev_pow2(per_sm * workspace.num_sms // programs)
        num_segments = max(1, min(MAX_SEGMENTS, want, _prev_pow2(capacity)))
    # 32-token KV tiles with the block table read a tile ahead: the loads of
    # three tiles in flight, and no spilled registers at 128 rows (64-token
    # tiles spill there; see the sweeps in the benchmark notes).
    if num_segments < 1 or num_segments & (num_segments - 1):
        raise ValueError(f"num_segments must be a power of two, got {num_segments}")
    if tile_n is None:
        tile_n = 32
    if num_warps is None:
        num_warps = 8 if block_m >= 128 else 4
    if num_stages is None:
        # Two 64-row programs share an SM; two stages leave room for both. A
        # 128-row program has an SM to itself: four stages (192 KiB with its
        # query tile) measured 0.5-1.5% faster than three.
        num_stages = 2 if block_m == 64 else 4 if block_m >= 128 else 3
    # Block-table entries are read this many tiles ahead of their K/V loads: 1, or 0
    # (in the same iteration, kept for the benchmark's comparison; H200: 1.45x slower).
    if bt_lookahead is None:
        bt_lookahead = 1
    if bt_lookahead not in (0, 1):
        raise ValueError(f"bt_lookahead must be 0 or 1, got {bt_lookahead}")
    # Fit shared memory (an RTX 3090 allows 99 KiB a program, an H200 227):
    # K and V tiles per stage plus the query tile. Keep two stages as long as
    # possible (narrower KV tiles first), then give up pipelining, then query
    # rows (more query tiles).
    while _smem_estimate(block_m, tile_n, num_stages, head_size) > workspace.max_shared_mem:
        if num_stages > 2:
            num_stages -= 1
        elif tile_n > 16:
            tile_n //= 2
        elif num_stages > 1:
            num_stages -= 1
        elif block_m > max(16, _next_pow2(g)):
            block_m //= 2
            block_q = block_m // g
            q_tiles = -(-max_query_len // block_q)
        else:
            break
    if min_segment_tokens is None:
        # Partial outputs cost rows x 4 bytes per head_size element against
        # segment tokens x 4 (bf16 K and V): keep them near 1/4 of the KV.
        rows = min(max_query_len, block_q) * g
        min_segment_tokens = max(MIN_SEGMENT_TOKENS, _next_pow2(4 * rows))
    # Whole tiles only: the split pass walks a segment tile by tile.
    min_segment_tokens = -(-min_segment_tokens // tile_n) * tile_n
    reduce_grid = None if num_segments == 1 else (num_seqs * max_query_len, num_heads)
    return LaunchPlan(
        block_m=block_m,
        block_q=block_q,
        q_tiles=q_tiles,
        tile_n=tile_n,
        num_segments=num_segments,
        min_segment_tokens=min_segment_tokens,
        num_warps=num_warps,
        num_stages=num_stages,
        bt_lookahead=bt_lookahead,
        split_grid=(num_seqs * q_tiles, num_kv_heads, num_segments),
        reduce_grid=reduce_grid,
    )


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
) -> None:
    num_heads, head_size = q.shape[1], q.shape[2]
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    _spec_decode_split_kernel[plan.split_grid](
        out,
        workspace.part_out,
        workspace.part_max,
        workspace.part_sum,
        q,
        key_cache,
        value_cache,
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
) -> LaunchPlan:
    """Causal paged attention for verify batches.

    q, out: [tokens, num_heads, head_size]; key_cache, value_cache:
    [num_blocks, block_size, num_kv_heads, head_size] (any strides, unit
    stride on head_size); cu_seqlens_q: [num_seqs + 1]; seq_lens: [num_seqs]
    (KV length including the verify block); block_table: [num_seqs, *].
    """
    if out.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"spec-decode attention writes 16-bit outputs, not {out.dtype}")
    num_seqs = seq_lens.shape[0]
    num_heads, head_size = q.shape[1], q.shape[2]
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    if plan is None:
        plan = plan_launch(
            num_seqs, max_query_len, num_heads, num_kv_heads, head_size, workspace
        )
    hopper = _hopper_module() if plan.kernel == "hopper" else None
    if plan.kernel == "hopper":
        if hopper is None or not hopper.tma_compatible(key_cache, value_cache, plan.tile_n):
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
    if plan.kernel == "hopper":
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
            max_query_len, softmax_scale, workspace, plan,
        )
    if plan.reduce_grid is not None:
        _spec_decode_reduce_kernel[plan.reduce_grid](
            out,
            workspace.part_out,
            workspace.part_max,
            workspace.part_sum,
            cu_seqlens_q,
            out.stride(0),
            out.stride(1),
            NUM_HEADS=num_heads,
            HEAD_SIZE=head_size,
            MAX_Q=max_query_len,
            NUM_SEGMENTS=plan.num_segments,
            # One pass over up to 64 segments: every load in flight at once.
            SEG_CHUNK=min(plan.num_segments, 64),
            num_warps=8 if plan.num_segments >= 32 else 4,
        )
    return plan


# Shared across layers of one process: layers run one after another on one
# stream, so one scratch per (device, heads, head size) suffices.
_WORKSPACES: dict[tuple[str, int, int, int], SpecDecodeWorkspace] = {}


def get_workspace(
    max_tokens: int, num_heads: int, head_size: int, device: torch.device
) -> SpecDecodeWorkspace:
    key = (str(device), num_heads, head_size, max_tokens)
    ws = _WORKSPACES.get(key)
    if ws is None:
        smem = 227 << 10
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
    ) -> None:
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.scale = scale
        self.qmax = qmax
        self.max_num_seqs = max_num_seqs
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
        if kv_cache_dtype not in ("auto", "bfloat16", "float16"):
            reasons.append(f"kv cache dtype {kv_cache_dtype}")
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
            logger.info_once(
                "spec-decode attention off for a layer: %s", ", ".join(reasons)
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
    ) -> bool:
        """Run the split-KV path if this batch qualifies; False means the
        caller runs its stock kernel. Only CPU-side facts decide."""
        if not 1 < max_query_len <= self.qmax or causal is not True:
            return False
        if key_cache.dtype not in (torch.bfloat16, torch.float16):
            return False
        if query.dtype != key_cache.dtype or key_cache.stride(-1) != 1:
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
        for _ in range(8):
            plan = plan_launch(
                num_seqs,
                max_query_len,
                self.num_heads,
                self.num_kv_heads,
                self.head_size,
                ws,
            )
            try:
                spec_decode_attention(
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
                smem = plan_smem(plan, self.head_size)
                ws.max_shared_mem = min(ws.max_shared_mem, smem) - 1
                logger.warning_once(
                    "spec-decode attention: %s; planning smaller tiles", exc
                )
                continue
            self.last_plan = plan
            return True
        raise RuntimeError("spec-decode attention: no launch plan fits this GPU")
