# SPDX-License-Identifier: Apache-2.0
# qwen3090 patch spec-decode-attn: the split pass of spec_decode_attention.py
# as a warp-specialised Hopper kernel (Gluon), for sm_90 GPUs.
#
# Why: the portable Triton split pass runs each tile's MMAs and softmax one
# after the other in the same warps, and its cp.async loads wait on those
# warps too; on an H200 that held a 128-row verify tile at ~60% of the HBM
# floor. Here one warp streams K and V tiles into shared memory with TMA while
# one or two warpgroups (64 query rows each) compute, synchronised by
# mbarriers, so loads, tensor-core work and softmax overlap (measured in
# qwen3090's python/benchmarks/spec_decode_attn.md).
#
# It writes the same (max, sum, normalised output) partials as the Triton
# split pass, so the reduce pass is shared. Planned by plan_launch in
# spec_decode_attention.py (head sizes of up to four 64-column chunks) and
# used only where tma_compatible() holds (spec_decode_attention_plan.py);
# otherwise the Triton split pass runs.

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from vllm.v1.attention.ops.spec_decode_attention_plan import box_tokens, tma_compatible

# box_tokens and tma_compatible live with the planner (no Triton import, tested
# on their own); spec_decode_attention.py asks this module for them.
__all__ = ["box_tokens", "tma_compatible", "ws_split"]

# Triton 3.9 renamed the TMA load; 3.6 and 3.7 have only the old name.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

# Query rows of one consumer warpgroup (wgmma's M).
WG_ROWS = gl.constexpr(64)
# head_dim columns per shared-memory chunk: 128 bytes of 16-bit values, the
# widest swizzle, so every K/V chunk is one TMA box wide.
CHUNK = gl.constexpr(64)
# Registers a thread over the launch: 12 warps x 168 fit an SM's 64K. The
# loader warp keeps 24 and the consumer warpgroups get 240 each.
MAXNREG = 168
CONSUMER_REGS = gl.constexpr(240)
LOADER_REGS = gl.constexpr(24)


def _descriptors(
    key_cache: torch.Tensor, value_cache: torch.Tensor, box_t: int
) -> tuple[TensorDescriptor, TensorDescriptor, int, int]:
    num_blocks, block_size, num_kv_heads, head_size = key_cache.shape
    s_blk, s_slot, s_head = key_cache.stride()[:3]
    rows_per_block = s_blk // s_slot
    # Rows reach the last block's last slot; columns the last head's last dim.
    rows = (num_blocks - 1) * rows_per_block + block_size
    cols = (num_kv_heads - 1) * s_head + head_size
    bits = key_cache.element_size() * 8
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=bits, rank=2)
    box = [box_t, CHUNK.value]
    k_desc = TensorDescriptor(key_cache, [rows, cols], [s_slot, 1], box, layout)
    v_desc = TensorDescriptor(value_cache, [rows, cols], [s_slot, 1], box, layout)
    return k_desc, v_desc, rows_per_block, s_head


@gluon.jit
def _loader(k_desc, v_desc, k_bufs, v_bufs, ready_k, ready_v, empty, bt_row_ptr,
            kv_lo, kv_hi, n_tiles, rows_per_block, col0,
            BLOCK_SIZE: gl.constexpr, TILE_N: gl.constexpr, BOX_T: gl.constexpr,
            NCH: gl.constexpr, STAGES: gl.constexpr):
    """One warp: the K and V tiles of the segment, STAGES ahead of the consumers."""
    tile_bytes: gl.constexpr = TILE_N * NCH * k_desc.block_type.nbytes // BOX_T
    for i in range(n_tiles):
        s = i % STAGES
        # A stage's first use waits on the phase before the barrier's first.
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        start = kv_lo + i * TILE_N
        mbarrier.expect(ready_k.index(s), tile_bytes)
        mbarrier.expect(ready_v.index(s), tile_bytes)
        for j in gl.static_range(TILE_N // BOX_T):
            tok = start + j * BOX_T
            # Past the segment: block 0 (always allocated); the consumers zero
            # those V rows and mask those keys.
            blk = gl.load(bt_row_ptr + tok // BLOCK_SIZE, mask=tok < kv_hi, other=0)
            row = blk * rows_per_block + tok % BLOCK_SIZE
            for c in gl.static_range(NCH):
                _tma_load(k_desc, [row, col0 + c * CHUNK], ready_k.index(s),
                          k_bufs.index(s * NCH + c).slice(j * BOX_T, BOX_T))
            for c in gl.static_range(NCH):
                _tma_load(v_desc, [row, col0 + c * CHUNK], ready_v.index(s),
                          v_bufs.index(s * NCH + c).slice(j * BOX_T, BOX_T))


@gluon.jit
def _softmax_step(sacc, m_i, l_i, start, kv_hi, lim_lo, ctx, qi0, qk_scale,
                  G: gl.constexpr, TILE_N: gl.constexpr, s_layout: gl.constexpr):
    """Online softmax over one tile's scores (base 2; m_i starts finite, so a
    row with no visible key yet gets p = 0, not NaN)."""
    if start + TILE_N > lim_lo:
        # Causal inside the verify block (row r sees keys < ctx + its index +
        # 1), and nothing at or past the segment's end.
        r = gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, s_layout))
        t = start + gl.arange(0, TILE_N, layout=gl.SliceLayout(0, s_layout))
        limit = ctx + qi0 + r // G + 1
        visible = (t[None, :] < limit[:, None]) & (t[None, :] < kv_hi)
        sacc = gl.where(visible, sacc, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(sacc, axis=1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(sacc * qk_scale - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _zero_v_tail(v_bufs, s, start, kv_end, TILE_N: gl.constexpr, NCH: gl.constexpr):
    """Zero V rows at or past the segment's end: they hold other slots or
    block 0, possibly NaN, and 0 * NaN is NaN in P @ V. Both warpgroups may
    do it at once; they write the same values."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    t = start + gl.arange(0, TILE_N, layout=gl.SliceLayout(1, layout))
    for c in gl.static_range(NCH):
        buf = v_bufs.index(s * NCH + c)
        v = buf.load(layout)
        buf.store(gl.where((t < kv_end)[:, None], v, gl.zeros_like(v)))
    fence_async_shared()


@gluon.jit
def _consume(q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, q_smem, k_bufs, v_bufs,
             ready_k, ready_v, empty, seq, kv_head, seg, q_start, q_len, seq_len, tile_q0,
             kv_lo, kv_hi, n_tiles, qk_scale, max_q, stride_q_tok, stride_q_head,
             W: gl.constexpr, NUM_HEADS: gl.constexpr, G: gl.constexpr, WG_Q: gl.constexpr,
             TILE_N: gl.constexpr, NCH: gl.constexpr, NUM_SEGMENTS: gl.constexpr,
             STAGES: gl.constexpr):
    """One warpgroup: WG_Q query tokens x G heads (padded to 64 rows) against
    every tile of the segment; writes that segment's partials."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, TILE_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, CHUNK, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)

    # Row r of this warpgroup: query token qi0 + r // G, head kv_head * G + r % G.
    qi0 = tile_q0 + W * WG_Q
    r = gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, ld_layout))
    d = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, ld_layout))
    qi = qi0 + r // G
    row_ok = (r < WG_Q * G) & (qi < q_len)
    q_rows = (q_start + qi).to(gl.int64) * stride_q_tok + (kv_head * G + r % G) * stride_q_head
    q_base = q_ptr + q_rows[:, None] + d[None, :]
    for c in gl.static_range(NCH):
        q_smem.index(c).store(gl.load(q_base + c * CHUNK, mask=row_ok[:, None], other=0.0))
    fence_async_shared()

    ctx = seq_len - q_len
    # This warpgroup's first row sees the fewest keys: tiles below its limit
    # need no mask.
    lim_lo = ctx + qi0 + 1
    m_i = gl.full([WG_ROWS], -1.0e30, gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([WG_ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
    s_zero = gl.zeros([WG_ROWS, TILE_N], gl.float32, layout=s_layout)
    # One fp32 accumulator per head_dim chunk (wgmma's N = 64 each).
    acc0 = gl.zeros([WG_ROWS, CHUNK], gl.float32, layout=o_layout)
    acc1 = gl.zeros([WG_ROWS, CHUNK], gl.float32, layout=o_layout)
    acc2 = gl.zeros([WG_ROWS, CHUNK], gl.float32, layout=o_layout)
    acc3 = gl.zeros([WG_ROWS, CHUNK], gl.float32, layout=o_layout)
    for i in range(n_tiles):
        s = i % STAGES
        phase = (i // STAGES) & 1
        start = kv_lo + i * TILE_N
        mbarrier.wait(ready_k.index(s), phase)
        sacc = warpgroup_mma(q_smem.index(0), k_bufs.index(s * NCH).permute((1, 0)), s_zero,
                             use_acc=False, is_async=True)
        for c in gl.static_range(1, NCH):
            sacc = warpgroup_mma(q_smem.index(c), k_bufs.index(s * NCH + c).permute((1, 0)),
                                 sacc, is_async=True)
        sacc = warpgroup_mma_wait(num_outstanding=0, deps=(sacc,))
        p, alpha, m_i, l_i = _softmax_step(sacc, m_i, l_i, start, kv_hi, lim_lo, ctx, qi0,
                                           qk_scale, G, TILE_N, s_layout)
        p = gl.convert_layout(p.to(q_ptr.dtype.element_ty), p_layout)
        alpha = gl.convert_layout(alpha, row_layout)[:, None]
        acc0 = acc0 * alpha
        if NCH > 1:
            acc1 = acc1 * alpha
        if NCH > 2:
            acc2 = acc2 * alpha
        if NCH > 3:
            acc3 = acc3 * alpha
        mbarrier.wait(ready_v.index(s), phase)
        if start + TILE_N > kv_hi:
            _zero_v_tail(v_bufs, s, start, kv_hi, TILE_N, NCH)
        acc0 = warpgroup_mma(p, v_bufs.index(s * NCH), acc0, is_async=True)
        if NCH > 1:
            acc1 = warpgroup_mma(p, v_bufs.index(s * NCH + 1), acc1, is_async=True)
        if NCH > 2:
            acc2 = warpgroup_mma(p, v_bufs.index(s * NCH + 2), acc2, is_async=True)
        if NCH > 3:
            acc3 = warpgroup_mma(p, v_bufs.index(s * NCH + 3), acc3, is_async=True)
        acc0, acc1, acc2, acc3 = warpgroup_mma_wait(
            num_outstanding=0, deps=(acc0, acc1, acc2, acc3))
        # This warpgroup is done with the stage; the loader refills it once
        # every consumer has arrived.
        mbarrier.arrive(empty.index(s), count=1)

    # Partials addressed by (request, query index, head, segment), as the
    # reduce pass reads them; outputs normalised, in fp32.
    r_o = gl.arange(0, WG_ROWS, layout=row_layout)
    d_o = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, o_layout))
    qi_o = qi0 + r_o // G
    ok_o = (r_o < WG_Q * G) & (qi_o < q_len)
    part_row = (((seq * max_q + qi_o).to(gl.int64) * NUM_HEADS + kv_head * G + r_o % G)
                * NUM_SEGMENTS + seg)
    l_o = gl.convert_layout(l_i, row_layout)
    gl.store(part_max_ptr + part_row, gl.convert_layout(m_i, row_layout), mask=ok_o)
    gl.store(part_sum_ptr + part_row, l_o, mask=ok_o)
    inv = gl.where(l_o > 0.0, 1.0 / l_o, 0.0)[:, None]
    o_base = part_out_ptr + part_row[:, None] * (NCH * CHUNK) + d_o[None, :]
    gl.store(o_base, acc0 * inv, mask=ok_o[:, None])
    if NCH > 1:
        gl.store(o_base + CHUNK, acc1 * inv, mask=ok_o[:, None])
    if NCH > 2:
        gl.store(o_base + 2 * CHUNK, acc2 * inv, mask=ok_o[:, None])
    if NCH > 3:
        gl.store(o_base + 3 * CHUNK, acc3 * inv, mask=ok_o[:, None])


@gluon.jit
def _consume_second(q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, q_smem, k_bufs, v_bufs,
                    ready_k, ready_v, empty, seq, kv_head, seg, q_start, q_len, seq_len,
                    tile_q0, kv_lo, kv_hi, n_tiles, qk_scale, max_q, stride_q_tok,
                    stride_q_head, NUM_HEADS: gl.constexpr, G: gl.constexpr,
                    WG_Q: gl.constexpr, TILE_N: gl.constexpr, NCH: gl.constexpr,
                    NUM_SEGMENTS: gl.constexpr, STAGES: gl.constexpr):
    # The second warpgroup runs as a worker partition: its index is fixed here.
    _consume(q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, q_smem, k_bufs, v_bufs,
             ready_k, ready_v, empty, seq, kv_head, seg, q_start, q_len, seq_len, tile_q0,
             kv_lo, kv_hi, n_tiles, qk_scale, max_q, stride_q_tok, stride_q_head,
             1, NUM_HEADS, G, WG_Q, TILE_N, NCH, NUM_SEGMENTS, STAGES)


@gluon.jit
def _ws_split_kernel(part_out_ptr, part_max_ptr, part_sum_ptr, q_ptr, k_desc, v_desc,
                     block_table_ptr, seq_lens_ptr, cu_seqlens_q_ptr, qk_scale,
                     min_seg_tokens, max_q, stride_q_tok, stride_q_head, stride_bt,
                     rows_per_block, stride_kv_head,
                     NUM_HEADS: gl.constexpr, G: gl.constexpr, BLOCK_SIZE: gl.constexpr,
                     WG_Q: gl.constexpr, NUM_WG: gl.constexpr, Q_TILES: gl.constexpr,
                     TILE_N: gl.constexpr, BOX_T: gl.constexpr, NUM_SEGMENTS: gl.constexpr,
                     STAGES: gl.constexpr, NCH: gl.constexpr):
    """Grid (num_seqs * Q_TILES, num_kv_heads, NUM_SEGMENTS), as the Triton
    split pass; segments are split exactly as there (_segment_tokens)."""
    pid = gl.program_id(0)
    kv_head = gl.program_id(1)
    seg = gl.program_id(2)
    seq = pid // Q_TILES
    tile_q0 = (pid % Q_TILES) * (WG_Q * NUM_WG)
    q_start = gl.load(cu_seqlens_q_ptr + seq)
    q_len = gl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    seq_len = gl.load(seq_lens_ptr + seq)
    per_seg = gl.cdiv(gl.cdiv(seq_len, NUM_SEGMENTS), TILE_N) * TILE_N
    seg_tokens = gl.maximum(per_seg, min_seg_tokens)
    kv_lo = seg * seg_tokens
    tile_rows = gl.minimum(q_len - tile_q0, WG_Q * NUM_WG)
    # The tile's last row sees the most keys.
    kv_hi = gl.minimum(kv_lo + seg_tokens, seq_len - q_len + tile_q0 + tile_rows)
    n_tiles = gl.cdiv(kv_hi - kv_lo, TILE_N)
    if tile_q0 < q_len:
        if kv_lo >= seq_len:
            # Past the end of this request's KV: an empty partial (sum 0), so
            # the reduce pass can take every segment without reading seq_lens.
            e_layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
            r = gl.arange(0, WG_ROWS * NUM_WG, layout=e_layout)
            qi = tile_q0 + r // G
            ok = (r < WG_Q * NUM_WG * G) & (qi < q_len)
            row = (((seq * max_q + qi).to(gl.int64) * NUM_HEADS + kv_head * G + r % G)
                   * NUM_SEGMENTS + seg)
            gl.store(part_max_ptr + row,
                     gl.full([WG_ROWS * NUM_WG], -1.0e30, gl.float32, layout=e_layout), mask=ok)
            gl.store(part_sum_ptr + row,
                     gl.zeros([WG_ROWS * NUM_WG], gl.float32, layout=e_layout), mask=ok)
        else:
            dtype: gl.constexpr = k_desc.dtype
            layout: gl.constexpr = k_desc.layout
            k_bufs = gl.allocate_shared_memory(dtype, [STAGES * NCH, TILE_N, CHUNK], layout)
            v_bufs = gl.allocate_shared_memory(dtype, [STAGES * NCH, TILE_N, CHUNK], layout)
            q0 = gl.allocate_shared_memory(dtype, [NCH, WG_ROWS, CHUNK], layout)
            ready_k = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            ready_v = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            for i in gl.static_range(STAGES):
                mbarrier.init(ready_k.index(i), count=1)
                mbarrier.init(ready_v.index(i), count=1)
                # Every consumer warpgroup releases a stage.
                mbarrier.init(empty.index(i), count=NUM_WG)
            bt_row = block_table_ptr + seq.to(gl.int64) * stride_bt
            col0 = kv_head * stride_kv_head
            if NUM_WG == 2:
                q1 = gl.allocate_shared_memory(dtype, [NCH, WG_ROWS, CHUNK], layout)
                gl.warp_specialize([
                    (_consume, (q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, q0, k_bufs,
                                v_bufs, ready_k, ready_v, empty, seq, kv_head, seg, q_start,
                                q_len, seq_len, tile_q0, kv_lo, kv_hi, n_tiles, qk_scale, max_q,
                                stride_q_tok, stride_q_head, 0, NUM_HEADS, G, WG_Q, TILE_N, NCH,
                                NUM_SEGMENTS, STAGES)),
                    (_consume_second, (q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, q1,
                                       k_bufs, v_bufs, ready_k, ready_v, empty, seq, kv_head,
                                       seg, q_start, q_len, seq_len, tile_q0, kv_lo, kv_hi,
                                       n_tiles, qk_scale, max_q, stride_q_tok, stride_q_head,
                                       NUM_HEADS, G, WG_Q, TILE_N, NCH, NUM_SEGMENTS, STAGES)),
                    (_loader, (k_desc, v_desc, k_bufs, v_bufs, ready_k, ready_v, empty, bt_row,
                               kv_lo, kv_hi, n_tiles, rows_per_block, col0, BLOCK_SIZE, TILE_N,
                               BOX_T, NCH, STAGES)),
                ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
            else:
                gl.warp_specialize([
                    (_consume, (q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, q0, k_bufs,
                                v_bufs, ready_k, ready_v, empty, seq, kv_head, seg, q_start,
                                q_len, seq_len, tile_q0, kv_lo, kv_hi, n_tiles, qk_scale, max_q,
                                stride_q_tok, stride_q_head, 0, NUM_HEADS, G, WG_Q, TILE_N, NCH,
                                NUM_SEGMENTS, STAGES)),
                    (_loader, (k_desc, v_desc, k_bufs, v_bufs, ready_k, ready_v, empty, bt_row,
                               kv_lo, kv_hi, n_tiles, rows_per_block, col0, BLOCK_SIZE, TILE_N,
                               BOX_T, NCH, STAGES)),
                ], [1], [LOADER_REGS])


def ws_split(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_query_len: int,
    qk_scale: float,
    part_out: torch.Tensor,
    part_max: torch.Tensor,
    part_sum: torch.Tensor,
    num_wg: int,
    wg_q: int,
    q_tiles: int,
    tile_n: int,
    stages: int,
    num_segments: int,
    min_segment_tokens: int,
) -> tuple[int, int, int]:
    """Launch the split pass (qk_scale already includes log2(e)); returns the grid."""
    num_heads, head_size = q.shape[1], q.shape[2]
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    box_t = box_tokens(block_size, tile_n)
    assert box_t is not None
    k_desc, v_desc, rows_per_block, s_head = _descriptors(key_cache, value_cache, box_t)
    grid = (seq_lens.shape[0] * q_tiles, num_kv_heads, num_segments)
    _ws_split_kernel[grid](
        part_out, part_max, part_sum, q, k_desc, v_desc, block_table, seq_lens,
        cu_seqlens_q, qk_scale, min_segment_tokens, max_query_len, q.stride(0),
        q.stride(1), block_table.stride(0), rows_per_block, s_head,
        NUM_HEADS=num_heads, G=num_heads // num_kv_heads, BLOCK_SIZE=block_size,
        WG_Q=wg_q, NUM_WG=num_wg, Q_TILES=q_tiles, TILE_N=tile_n, BOX_T=box_t,
        NUM_SEGMENTS=num_segments, STAGES=stages, NCH=head_size // CHUNK.value,
        num_warps=4, maxnreg=MAXNREG,
    )
    return grid
