"""Issue 21, next step after int8_ws_candidate.py (session 20; compiled, not run): the same
warp-specialised int8 split pass with Q.K on the fp16 wgmma instead of two int8 terms.

Why (spec_decode_attn.md, "A widener warpgroup"): the candidate's consumer spends about 29 %
of its loop's samples issuing and waiting for its two int8 Q.K terms, and its straight-line
code (about 2,500 of 3,900 instructions a warp) quantizes the query into those terms in
every one of a head's 32 segment programs. Here:

- the widener warpgroup widens K as well as V, into one 16-bit K tile and one 16-bit V tile
  (int8 codes are exact in fp16). K is widened first: the consumer needs it first. One tile
  of each is enough on paper: the widener refills K during the consumer's softmax and P.V,
  and V during its next Q.K and softmax;
- the query is bf16, so its fp16 copy is exact (within fp16's range): Q.K is one fp16 wgmma
  chain of K-dim 272 (K's 256 codes at the box's shift, the query zero beside them) with a
  float32 result, where the candidate rounds the query into two int8 terms, combines two
  int32 results and converts them. No query quantization, one wait fewer a tile;
- shared memory: two int8 stages (68 KiB), the fp16 query (34), one K and one V tile (34
  each) and the epilogue's row conversion (32): about 202 KiB.

The loader, the V widening, the online softmax and the scale reads are the candidate's own
functions, imported; the candidate's module-level choices (5 boxes a block, narrow V loads,
row stores) apply. One warpgroup of rows (q x G <= 64) only.

    python benchmarks/int8_ws_fp16qk.py --compile-only [--json OUT]
    python benchmarks/int8_ws_fp16qk.py --tree DIR [--json OUT]   # an H200: errors, times

The device run checks every KV head against the float32 reference and times this pass, the
candidate and the production int8 plan side by side in one process.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path
from typing import Any

import int8_ws_candidate as cand
from int8_ws_candidate import (
    CH8,
    LOADER_REGS,
    SCB,
    V_LOADS,
    WG_ROWS,
    _k_scales,
    _loader8,
    _partition_barrier,
    _scales,
    _softmax8,
    _widen,
)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

HERE = Path(__file__).resolve().parent
WIDENER_REGS = gl.constexpr(80)
# The candidate's narrow V loads (8 codes a thread; its default since session 19).
LD_LAYOUT = gl.constexpr(V_LOADS["narrow"])


@gluon.jit
def _widen_tile(src0, src1, srct, dst, dstt):
    """Two 128-byte code chunks and a 16-byte tail into a 16-bit tile (fp16: the 1024 bias,
    exact) and its 16-column tail."""
    ld_layout: gl.constexpr = LD_LAYOUT
    vt_layout: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [4, 1], [1, 0])
    dst.index(0).store(_widen(src0.load(ld_layout), gl.float16))
    dst.index(1).store(_widen(src1.load(ld_layout), gl.float16))
    dstt.store(_widen(srct.load(vt_layout), gl.float16))


@gluon.jit
def _widener16(bufs, sc_bufs, kbf, kbft, vbf, vbft, ready, empty, kbars, vbars, n_tiles,
               STAGES: gl.constexpr):
    """Each tile's K then V into the one 16-bit K tile and the one V tile. kbars/vbars: 0
    says the tile is widened, 1 that the consumer's wgmma has read it. K's tail is the first
    16 bytes of V's first chunk (the 16-byte boundary below V is 256 bytes past K's)."""
    for i in range(n_tiles):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        mbarrier.wait(kbars.index(1), (i & 1) ^ 1)
        _widen_tile(bufs.index(s * 4), bufs.index(s * 4 + 1),
                    bufs.index(s * 4 + 2).slice(0, SCB, 1), kbf, kbft)
        fence_async_shared()
        _partition_barrier()
        mbarrier.arrive(kbars.index(0), count=1)
        mbarrier.wait(vbars.index(1), (i & 1) ^ 1)
        _widen_tile(bufs.index(s * 4 + 2), bufs.index(s * 4 + 3), sc_bufs.index(s * 2 + 1),
                    vbf, vbft)
        fence_async_shared()
        _partition_barrier()
        mbarrier.arrive(vbars.index(0), count=1)
        mbarrier.arrive(empty.index(s), count=1)


@gluon.jit
def _tile16(q16, q16t, kbf, kbft, vbf, vbft, bufs, sc_bufs, ready, empty, kbars, vbars, i,
            kv_lo, kv_hi, ctx, qi0, q_sc, k_at, v_at, m_i, l_i, acc0, acc1, acc2,
            G: gl.constexpr, TILE_N: gl.constexpr, STAGES: gl.constexpr,
            MASKED: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr,
            o2_layout: gl.constexpr, p_layout: gl.constexpr, p2_layout: gl.constexpr):
    """One tile: the fp16 Q.K over K's widened tile, the candidate's online softmax, P.V."""
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    s = i % STAGES
    start = kv_lo + i * TILE_N
    mbarrier.wait(ready.index(s), (i // STAGES) & 1)
    mbarrier.wait(kbars.index(0), i & 1)
    sacc = gl.zeros([WG_ROWS, TILE_N], gl.float32, layout=s_layout)
    sacc = warpgroup_mma(q16.index(0), kbf.index(0).permute((1, 0)), sacc, use_acc=False,
                         is_async=True)
    sacc = warpgroup_mma(q16.index(1), kbf.index(1).permute((1, 0)), sacc, is_async=True)
    sacc = warpgroup_mma(q16t, kbft.permute((1, 0)), sacc, is_async=True)
    sacc = warpgroup_mma_wait(num_outstanding=0, deps=(sacc,))
    k_sc = _k_scales(bufs, sc_bufs, s, k_at // 4, TILE_N, col_layout)
    v_sc = _scales(sc_bufs, s * 2 + 1, v_at // 4, TILE_N, col_layout)
    mbarrier.arrive(kbars.index(1), count=1)
    mbarrier.arrive(empty.index(s), count=1)
    m_new, l_i, p, acc0, acc1, acc2 = _softmax8(
        sacc * k_sc[None, :], v_sc, m_i, l_i, acc0, acc1, acc2, q_sc, start, kv_hi, ctx, qi0,
        G, TILE_N, MASKED, False, gl.float16, s_layout, o_layout, o2_layout)
    p2 = gl.convert_layout(p, p2_layout)
    p = gl.convert_layout(p, p_layout)
    mbarrier.wait(vbars.index(0), i & 1)
    acc0 = warpgroup_mma(p, vbf.index(0), acc0, is_async=True)
    acc1 = warpgroup_mma(p, vbf.index(1), acc1, is_async=True)
    acc2 = warpgroup_mma(p2, vbft, acc2, is_async=True)
    acc0, acc1, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1, acc2))
    mbarrier.arrive(vbars.index(1), count=1)
    return m_new, l_i, acc0, acc1, acc2


@gluon.jit
def _consume16(q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, q16, q16t, kbf, kbft, vbf,
               vbft, bufs, sc_bufs, ready, empty, kbars, vbars, seq, kv_head, seg, q_start,
               q_len, seq_len, kv_lo, kv_hi, n_tiles, qk_scale, max_q, stride_q_tok,
               stride_q_head, k_at, v_at, NUM_HEADS: gl.constexpr, G: gl.constexpr,
               WG_Q: gl.constexpr, TILE_N: gl.constexpr, NUM_SEGMENTS: gl.constexpr,
               STAGES: gl.constexpr):
    """The consumer warpgroup: the query into fp16 tiles shifted as K's box is, every tile,
    then the partials a row a warp (the candidate's epilogue with EPI_ROWS)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, TILE_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, CH8, 16])
    o2_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, SCB, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    p2_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o2_layout, k_width=2)
    ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    t_layout: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [4, 1], [1, 0])
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    row2_layout: gl.constexpr = gl.SliceLayout(1, o2_layout)
    # 0 or 8 and 4 or 12, written so the compiler can vectorise the shifted accesses.
    k_at = (k_at // 8) * 8
    v_at = (v_at // 4) * 4

    # The query in fp16 (exact: it is bf16), shifted k_at columns right as K's box is, zeros
    # where the box holds other bytes: two 128-column chunks and a 16-column tail.
    qi0 = 0
    r = gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, ld_layout))
    qi = qi0 + r // G
    row_ok = (r < WG_Q * G) & (qi < q_len)
    q_rows = (q_start + qi).to(gl.int64) * stride_q_tok + (kv_head * G + r % G) * stride_q_head
    for c in gl.static_range(2):
        d = gl.arange(0, CH8, layout=gl.SliceLayout(0, ld_layout)) + c * CH8 - k_at
        x = gl.load(q_ptr + q_rows[:, None] + d[None, :],
                    mask=row_ok[:, None] & (d >= 0)[None, :], other=0.0)
        q16.index(c).store(x.to(gl.float16))
    rt = gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, t_layout))
    dt = gl.arange(0, SCB, layout=gl.SliceLayout(0, t_layout)) + 2 * CH8 - k_at
    qit = qi0 + rt // G
    q_rows_t = ((q_start + qit).to(gl.int64) * stride_q_tok
                + (kv_head * G + rt % G) * stride_q_head)
    ok_t = ((rt < WG_Q * G) & (qit < q_len))[:, None] & (dt < 2 * CH8)[None, :]
    q16t.store(gl.load(q_ptr + q_rows_t[:, None] + dt[None, :], mask=ok_t,
                       other=0.0).to(gl.float16))
    fence_async_shared()
    q_sc = gl.full([WG_ROWS], 1.0, gl.float32, layout=gl.SliceLayout(1, s_layout)) * qk_scale

    ctx = seq_len - q_len
    m_i = gl.full([WG_ROWS], -1.0e30, gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([WG_ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc0 = gl.zeros([WG_ROWS, CH8], gl.float32, layout=o_layout)
    acc1 = gl.zeros([WG_ROWS, CH8], gl.float32, layout=o_layout)
    acc2 = gl.zeros([WG_ROWS, SCB], gl.float32, layout=o2_layout)
    n_full = gl.minimum(gl.maximum(gl.minimum(ctx + qi0 + 1, kv_hi) - kv_lo, 0) // TILE_N,
                        n_tiles)
    for i in range(0, n_full):
        m_i, l_i, acc0, acc1, acc2 = _tile16(
            q16, q16t, kbf, kbft, vbf, vbft, bufs, sc_bufs, ready, empty, kbars, vbars, i,
            kv_lo, kv_hi, ctx, qi0, q_sc, k_at, v_at, m_i, l_i, acc0, acc1, acc2, G, TILE_N,
            STAGES, False, s_layout, o_layout, o2_layout, p_layout, p2_layout)
    for i in range(n_full, n_tiles):
        m_i, l_i, acc0, acc1, acc2 = _tile16(
            q16, q16t, kbf, kbft, vbf, vbft, bufs, sc_bufs, ready, empty, kbars, vbars, i,
            kv_lo, kv_hi, ctx, qi0, q_sc, k_at, v_at, m_i, l_i, acc0, acc1, acc2, G, TILE_N,
            STAGES, True, s_layout, o_layout, o2_layout, p_layout, p2_layout)

    # The partials as the candidate stores them (a row a warp); accumulator column c holds
    # V's column c - v_at, and the eager fp16 tile carries P x 256 (the candidate's _p_scale).
    r_o = gl.arange(0, WG_ROWS, layout=row_layout)
    qi_o = qi0 + r_o // G
    ok_o = (r_o < WG_Q * G) & (qi_o < q_len)
    part_row = (((seq * max_q + qi_o).to(gl.int64) * NUM_HEADS + kv_head * G + r_o % G)
                * NUM_SEGMENTS + seg)
    l_o = gl.convert_layout(l_i, row_layout)
    gl.store(part_max_ptr + part_row, gl.convert_layout(m_i, row_layout), mask=ok_o)
    gl.store(part_sum_ptr + part_row, l_o, mask=ok_o)
    inv_l = gl.where(l_o > 0.0, 1.0 / (l_o * 256.0), 0.0)[:, None]
    st_layout: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])
    d_s = gl.arange(0, CH8, layout=gl.SliceLayout(0, st_layout)) - v_at
    row_s = gl.convert_layout(part_row, gl.SliceLayout(1, st_layout))
    ok_s = gl.convert_layout(ok_o, gl.SliceLayout(1, st_layout))
    s_base = part_out_ptr + row_s[:, None] * (2 * CH8) + d_s[None, :]
    gl.store(s_base, gl.convert_layout(acc0 * inv_l, st_layout),
             mask=ok_s[:, None] & (d_s >= 0)[None, :])
    gl.store(s_base + CH8, gl.convert_layout(acc1 * inv_l, st_layout), mask=ok_s[:, None])
    d_t = gl.arange(0, SCB, layout=gl.SliceLayout(0, o2_layout)) + 2 * CH8 - v_at
    part_row2 = gl.convert_layout(part_row, row2_layout)
    gl.store(part_out_ptr + part_row2[:, None] * (2 * CH8) + d_t[None, :],
             acc2 * gl.convert_layout(inv_l, o2_layout),
             mask=gl.convert_layout(ok_o, row2_layout)[:, None] & (d_t < 2 * CH8)[None, :])


@gluon.jit
def _ws_split_fp16qk_kernel(part_out_ptr, part_max_ptr, part_sum_ptr, q_ptr, desc, sc_desc,
                            block_table_ptr, seq_lens_ptr, cu_seqlens_q_ptr, qk_scale,
                            min_seg_tokens, max_q, stride_q_tok, stride_q_head, stride_bt,
                            rows_per_block, stride_kv_head, NUM_HEADS: gl.constexpr,
                            G: gl.constexpr, BLOCK_SIZE: gl.constexpr, WG_Q: gl.constexpr,
                            TILE_N: gl.constexpr, BOX_T: gl.constexpr,
                            NUM_SEGMENTS: gl.constexpr, STAGES: gl.constexpr,
                            HEAD: gl.constexpr):
    """Grid (num_seqs, num_kv_heads, NUM_SEGMENTS), segments split as the candidate's."""
    seq = gl.program_id(0)
    kv_head = gl.program_id(1)
    seg = gl.program_id(2)
    q_start = gl.load(cu_seqlens_q_ptr + seq)
    q_len = gl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    seq_len = gl.load(seq_lens_ptr + seq)
    per_seg = gl.cdiv(gl.cdiv(seq_len, NUM_SEGMENTS), TILE_N) * TILE_N
    seg_tokens = gl.maximum(per_seg, min_seg_tokens)
    kv_lo = seg * seg_tokens
    kv_hi = gl.minimum(kv_lo + seg_tokens, seq_len - q_len + gl.minimum(q_len, WG_Q))
    n_tiles = gl.cdiv(kv_hi - kv_lo, TILE_N)
    if kv_lo >= seq_len:
        e_layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        r = gl.arange(0, WG_ROWS, layout=e_layout)
        qi = r // G
        ok = (r < WG_Q * G) & (qi < q_len)
        row = ((seq * max_q + qi).to(gl.int64) * NUM_HEADS + kv_head * G + r % G) * NUM_SEGMENTS
        gl.store(part_max_ptr + row + seg,
                 gl.full([WG_ROWS], -1.0e30, gl.float32, layout=e_layout), mask=ok)
        gl.store(part_sum_ptr + row + seg, gl.zeros([WG_ROWS], gl.float32, layout=e_layout),
                 mask=ok)
    else:
        layout8: gl.constexpr = desc.layout
        sc_layout: gl.constexpr = sc_desc.layout
        f16_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128,
                                                        element_bitwidth=16, rank=2)
        f16t_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32,
                                                         element_bitwidth=16, rank=2)
        bufs = gl.allocate_shared_memory(gl.int8, [STAGES * 4, TILE_N, CH8], layout8)
        sc_bufs = gl.allocate_shared_memory(gl.int8, [STAGES * 2, TILE_N, SCB], sc_layout)
        q16 = gl.allocate_shared_memory(gl.float16, [2, WG_ROWS, CH8], f16_layout)
        q16t = gl.allocate_shared_memory(gl.float16, [WG_ROWS, SCB], f16t_layout)
        kbf = gl.allocate_shared_memory(gl.float16, [2, TILE_N, CH8], f16_layout)
        kbft = gl.allocate_shared_memory(gl.float16, [TILE_N, SCB], f16t_layout)
        vbf = gl.allocate_shared_memory(gl.float16, [2, TILE_N, CH8], f16_layout)
        vbft = gl.allocate_shared_memory(gl.float16, [TILE_N, SCB], f16t_layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        kbars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        vbars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            # The consumer (K's tail, the scales) and the widener (the codes) both read it.
            mbarrier.init(empty.index(i), count=2)
        for i in gl.static_range(2):
            mbarrier.init(kbars.index(i), count=1)
            mbarrier.init(vbars.index(i), count=1)
        bt_row = block_table_ptr + seq.to(gl.int64) * stride_bt
        col_k = kv_head * stride_kv_head
        col_v = col_k + HEAD + 4
        k_at = col_k % 16
        v_at = col_v % 16
        gl.warp_specialize([
            (_consume16, (q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, q16, q16t, kbf,
                          kbft, vbf, vbft, bufs, sc_bufs, ready, empty, kbars, vbars, seq,
                          kv_head, seg, q_start, q_len, seq_len, kv_lo, kv_hi, n_tiles,
                          qk_scale, max_q, stride_q_tok, stride_q_head, k_at, v_at,
                          NUM_HEADS, G, WG_Q, TILE_N, NUM_SEGMENTS, STAGES)),
            # The candidate's loader; with 5 boxes a block (its default) it never touches
            # K's own tail and scale boxes, so the code boxes stand in for them.
            (_loader8, (desc, desc, sc_desc, bufs, bufs, sc_bufs, ready, empty, bt_row, kv_lo,
                        kv_hi, n_tiles, rows_per_block, col_k - k_at, col_v - v_at,
                        BLOCK_SIZE, TILE_N, BOX_T, HEAD, STAGES)),
            (_widener16, (bufs, sc_bufs, kbf, kbft, vbf, vbft, ready, empty, kbars, vbars,
                          n_tiles, STAGES)),
        ], [1, 4], [LOADER_REGS, WIDENER_REGS])


# ---- host side -------------------------------------------------------------------------


def launch(batch: Any, workspace: Any, plan: Any, qk_scale: float, stages: int = 2) -> None:
    """The split pass into ``workspace``'s partials (qk_scale includes log2(e)); the tree's
    reduce pass (launch_reduce with the same plan) turns them into the output."""
    q, key_cache = batch.query, batch.key_cache
    num_heads, head_size = q.shape[1], q.shape[2]
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    if head_size != 2 * CH8.value or batch.max_query_len * group > WG_ROWS.value:
        raise ValueError(f"head size 256 and q x G <= 64 only: {head_size}, "
                         f"q={batch.max_query_len} x G={group}")
    if not cand.KT_FROM_V.value or block_size % cand.BOX_T:
        raise ValueError("needs the candidate's 5-box loader and blocks of a multiple of "
                         f"{cand.BOX_T} tokens")
    desc, _, sc_desc, rows_per_block, s_head = cand.descriptors(key_cache, cand.BOX_T)
    grid = (batch.seq_lens.shape[0], num_kv_heads, plan.num_segments)
    _ws_split_fp16qk_kernel[grid](
        workspace.part_out, workspace.part_max, workspace.part_sum, q, desc, sc_desc,
        batch.block_table, batch.seq_lens, batch.cu_seqlens_q, qk_scale,
        plan.min_segment_tokens, batch.max_query_len, q.stride(0), q.stride(1),
        batch.block_table.stride(0), rows_per_block, s_head,
        NUM_HEADS=num_heads, G=group, BLOCK_SIZE=block_size, WG_Q=batch.max_query_len,
        TILE_N=cand.TILE_N, BOX_T=cand.BOX_T, NUM_SEGMENTS=plan.num_segments, STAGES=stages,
        HEAD=head_size, num_warps=4, maxnreg=cand.MAXNREG,
    )


def compile_sm90(q: int = 8, stages: int = 2, segments: int = 32) -> Any:
    """The kernel compiled ahead of time for sm_90a (no GPU): 24/4 heads, head size 256,
    16-token blocks, the arguments marked as the launch's JIT marks them."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = _ws_split_fp16qk_kernel
    codes = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    plain = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)
    signature: dict[str, str] = {}
    for name in fn.arg_names:
        if name.startswith("part_"):
            signature[name] = "*fp32"
        elif name == "q_ptr":
            signature[name] = "*bf16"
        elif name == "desc":
            signature[name] = f"tensordesc<i8[{cand.BOX_T}, {CH8.value}],{codes!r}>"
        elif name == "sc_desc":
            signature[name] = f"tensordesc<i8[{cand.BOX_T}, {SCB.value}],{plain!r}>"
        elif name.endswith("_ptr"):
            signature[name] = "*i32"
        elif name == "qk_scale":
            signature[name] = "fp32"
        elif name.startswith("stride_q") or name == "stride_bt":
            signature[name] = "i64"
        elif name in ("min_seg_tokens", "max_q", "rows_per_block", "stride_kv_head"):
            signature[name] = "i32"
        else:
            signature[name] = "constexpr"
    constexprs = {"NUM_HEADS": 24, "G": 6, "BLOCK_SIZE": 16, "WG_Q": q, "TILE_N": cand.TILE_N,
                  "BOX_T": cand.BOX_T, "NUM_SEGMENTS": segments, "STAGES": stages,
                  "HEAD": 256}
    # Pointers 16-byte aligned and the query's strides multiples of 16, as a launch's JIT
    # marks them (the cache's head stride, 520 bytes, is not).
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name.endswith("_ptr") or name.startswith("stride_q")}
    source = GluonASTSource(
        fn, signature,
        constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()}, attrs=attrs,
    )
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "maxnreg": cand.MAXNREG})


def _print_budget(out: Path | None) -> int:
    """The consumer's whole-tile loop and the widener's loop, counted as the candidate's
    --compile-only counts them, beside the candidate's (two terms, fp16 V, eager)."""
    import tempfile

    sys.path.insert(0, str(HERE.parent))
    from split_pass_issue import sass_of

    from tests.support.sass_loops import loops as all_loops
    from tests.support.sass_loops import mma_loops, parse_sass

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, compiled in (("fp16qk", compile_sm90()),
                               ("candidate", cand.compile_sm90(2, 2, q=8, v_tile="fp16"))):
            sass = sass_of(compiled.asm["cubin"], Path(tmp))
            steady, tail = mma_loops(sass)
            found = [lp for lp in all_loops(parse_sass(sass))
                     if not lp.mma and lp.opcodes["STS"] >= 4]
            inner = [a for a in found if not any(a.contains(b) for b in found if b != a)]
            if len(inner) != 1:
                raise RuntimeError(f"{name}: {len(inner)} widener loops, expected 1")
            widener = inner[0]
            kernel = parse_sass(sass)
            rows.append({
                "variant": name, "shared": compiled.metadata.shared,
                "loop_insts_per_warp": steady.instructions,
                "tail_loop_insts_per_warp": tail.instructions,
                "classes": steady.classes(), "opcodes": dict(steady.opcodes),
                "widener_loop_insts_per_warp": widener.instructions,
                "warp_insts_per_token": (steady.instructions + widener.instructions) * 4
                / cand.TILE_N,
                "kernel_insts": len(kernel),
                # The query's int8 rounding (FRND, F2I): the candidate's prologue only.
                "kernel_rounds": sum(i.opcode in ("FRND", "F2I") for i in kernel),
            })
            print(json.dumps(rows[-1]), flush=True)
    if out:
        out.write_text(json.dumps(rows, indent=1))
    return 0


def _device_run(tree: str, contexts: list[int], out: Path | None) -> int:
    """On an H200, q = 8: every KV head against the float32 reference, then this pass, the
    candidate (two terms, fp16 V) and the production int8 plan timed side by side."""
    import importlib

    sys.path.insert(0, tree)
    sys.path.insert(1, str(HERE.parent))
    import spec_decode_attn as bench
    import torch

    from tests.support import spec_decode_ref as ref

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("needs an sm_90 GPU (H100/H200)", file=sys.stderr)
        return 2
    sda = importlib.import_module("vllm.v1.attention.ops.spec_decode_attention")
    bench.KV = "int8"
    env = {"torch": torch, "ref": ref, "sda": sda}
    heads = bench.NUM_KV_HEADS * bench.GROUP
    ws = sda.get_workspace(64, heads, bench.HEAD_SIZE, torch.device("cuda"))
    copy_bw = bench.measure_copy_bandwidth(torch)
    scale = bench.HEAD_SIZE**-0.5
    qk_scale = scale * 1.4426950408889634
    q = 8
    tiles = sda.TILE_PLANS["int8"]
    prod_plan = sda.plan_launch(1, q, heads, bench.NUM_KV_HEADS, bench.HEAD_SIZE, ws,
                                kernel="triton", **tiles.plan_overrides())
    plan = sda.plan_launch(1, q, heads, bench.NUM_KV_HEADS, bench.HEAD_SIZE, ws,
                           kernel="hopper")
    rows = []
    for ctx in contexts:
        cell = bench.Cell(env, 1, ctx)
        batches = cell.batches(q)
        want = ref.reference(batches[0], scale)
        prod_outs = [torch.empty_like(b.query) for b in batches]
        t_prod = bench._time_graph(torch, [
            bench.split_reduce_calls(env, b, o, ws, prod_plan, tiles)[0]
            for b, o in zip(batches, prod_outs, strict=True)])
        row: dict[str, Any] = {"context": ctx, "q": q, "production_us": t_prod * 1e6,
                               "floor_us": cell.kv_bytes / copy_bw * 1e6}

        def split16(b: Any) -> None:
            launch(b, ws, plan, qk_scale)

        def split8(b: Any) -> None:
            cand.launch(b, ws, plan, qk_scale, 2, 2, False, "fp16")

        for name, split in (("fp16qk", split16), ("candidate", split8)):
            outs = [torch.full(b.query.shape, float("nan"), dtype=torch.bfloat16,
                               device="cuda") for b in batches]

            def call(b: Any, o: Any, split: Any = split) -> None:
                split(b)
                sda.launch_reduce(o, b.cu_seqlens_q, b.max_query_len, ws, plan)

            try:
                call(batches[0], outs[0])
                torch.cuda.synchronize()
                g = bench.GROUP
                per_head = [float((outs[0][:, h * g:(h + 1) * g].float()
                                   - want[:, h * g:(h + 1) * g]).norm()
                                  / want[:, h * g:(h + 1) * g].norm())
                            for h in range(bench.NUM_KV_HEADS)]
                t = bench._time_graph(torch, [functools.partial(call, b, o)
                                              for b, o in zip(batches, outs, strict=True)])
                row[name] = {"us": t * 1e6, "rel_err_per_kv_head": per_head,
                             "pct_floor": 100 * row["floor_us"] / (t * 1e6),
                             "vs_production": t_prod / t}
            except Exception as exc:  # a first device run: record, go on
                row[name] = {"error": bench.error_text(exc)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if out:
        out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows},
                                  indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", help="directory that contains patched vllm/ (device runs)")
    parser.add_argument("--compile-only", action="store_true",
                        help="compile for sm_90a and count the loops beside the candidate's")
    parser.add_argument("--contexts", default="16384,65536,131072")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.compile_only:
        return _print_budget(args.json)
    if not args.tree:
        parser.error("--tree is needed for a device run")
    return _device_run(args.tree, [int(c) for c in args.contexts.split(",") if c], args.json)


if __name__ == "__main__":
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    sys.exit(main())
