# SPDX-License-Identifier: Apache-2.0
# qwen3090 patch spec-decode-attn: the split pass of spec_decode_attention.py
# over TRITON_ATTN's int8_per_token_head cache as a warp-specialised Hopper
# kernel (Gluon), for sm_90 GPUs.
#
# Why a kernel of its own: the portable Triton split pass issues about 160
# warp instructions a KV token on this cache at q = 8, which an H200 runs at
# well under half of the int8 HBM floor. Here, for each (request, kv head,
# segment):
# - one loader warp copies each 64-key tile with TMA. A box must start on a
#   16-byte boundary and a head's K starts 0 or 8 bytes past one (its V 4 or
#   12: rows are [K | K scale | V | V scale], 520 bytes), so every box starts
#   at the boundary below: K as two 128-byte chunks, V as two chunks and a
#   16-byte tail holding V's scale; K's 32-byte tail and scale are the first
#   bytes of V's first chunk (5 boxes a cache block). The query is shifted by
#   K's offset (zeros beside it) and the accumulators hold V's column d at
#   d + V's offset, which the partials' stores shift back.
# - the consumer warpgroup (64 rows: query tokens x G heads) runs Q.K on the
#   int8 wgmma: each query row is quantized once, in two int8 terms (the
#   second the first's remainder at 1/256 of its scale), and K is used as TMA
#   wrote it; a score is scaled by its key's scale, the row's own scale rides
#   in the exponent's FMA.
#   With two consumer warpgroups each quantizes its rows a 16-row chunk at
#   a time in a loop (Q_CHUNKS: the straight run is cold code).
# - V is not K-major for P.V, so a widener warpgroup turns each tile's codes
#   into an fp16 tile (the 1024 bias) while the consumer runs Q.K and the
#   softmax. It also takes work off the consumer's chain: it hands over K's
#   scales as a float32 vector in the scores' column order, applies V's
#   per-token scales as it widens (code x scale, rounded once to fp16), and
#   writes a column of ones that no output column reads, so P.V sums P and the
#   softmax keeps no row sums. With two consumer warpgroups (q x G > 64) each
#   widens half of V, and V's scales are folded into P's columns.
# - the partials are the Triton split pass's, so the reduce pass is shared.
#
# Measured on an H200 (qwen3090's python/benchmarks/spec_decode_attn.md, the
# int8 candidate sections; this file is that candidate with its benchmark
# options taken out, and a patch-tier test holds it to the same machine code):
# at q = 8 2.0x the Triton split pass at 64k and 2.1x at 128k, relative error
# 1.7e-3 against 2.3e-3. The widener's three extra jobs (session 32) were
# measured on an H100: a q = 8 call 3-4 % faster at 64k-128k, the same error.
# spec_decode_attention.py runs it where
# int8_hopper_unsupported() (spec_decode_attention_plan.py) finds nothing
# against the cache and plan, and says why not where it does.

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

from vllm.v1.attention.ops.spec_decode_attention_plan import (
    INT8_HOPPER_BOX_TOKENS,
    INT8_HOPPER_TILE_N,
    int8_hopper_unsupported,
)

__all__ = ["int8_hopper_unsupported", "merge_layout", "ws_split_int8"]

# Triton 3.9 renamed the TMA load; 3.6 and 3.7 have only the old name.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
# A barrier over the calling partition's threads: Triton 3.9 calls it
# barrier, 3.6 and 3.7 thread_barrier.
_partition_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

WG_ROWS = gl.constexpr(64)
# int8 columns a chunk: 128 bytes, the widest swizzle.
CH8 = gl.constexpr(128)
# Bytes of a scale box, and of V's tail box (its scale inside).
SCB = gl.constexpr(16)
# Bytes of K's tail: one int8 k-step of the Q.K wgmma.
KT = gl.constexpr(32)
# Registers a thread over the launch (12 warps with the widener: 384 x 168
# fit an SM's 65,536), and each partition's after setmaxnreg.
MAXNREG = 168
LOADER_REGS = gl.constexpr(24)
CONSUMER_REGS = gl.constexpr(240)
WIDENER_REGS = gl.constexpr(64)
STAGES = 2
TILE_N = INT8_HOPPER_TILE_N
BOX_T = INT8_HOPPER_BOX_TOKENS
# With the lazy rescale (two consumer warpgroups): how far (log2) a row's
# maximum may pass its reference before the accumulator is rescaled.
RESCALE_LOG2 = gl.constexpr(8.0)
# A scale box read a row a thread, then converted to the score columns.
SCALE_LOAD_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 4], [32, 1], [4, 1], [1, 0]))
# V's codes as the widener reads them: 8 codes (an 8-byte load) a thread, 16
# threads a row, so the 8 threads of a store phase hit 8 different swizzled
# chunks (16 codes a thread conflicted 2-way).
V_LOAD_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0]))
# With two consumer warpgroups (q = 16) each quantizes its query rows this many row
# chunks at a time in a loop: the straight run over 64 rows is about 2,400
# instructions, run once and cold in the instruction cache (ncu, H100: a quarter to
# a third of a consumer's samples, most waiting on instruction fetch). Side by side
# on the H100, 4 chunks took 2-8 us off a call; with one warpgroup they cost 1-3 us,
# so q <= 8 keeps the straight run (session 26).
Q_CHUNKS = gl.constexpr(4)


# A shared memory view as float32: Triton 3.9 renamed the view's _reinterpret
# to reinterpret, so the one this Triton has is compiled in.
@gluon.jit
def _f32_view_old(buf, rows: gl.constexpr, cols: gl.constexpr, layout: gl.constexpr):
    return buf._reinterpret(gl.float32, [rows, cols], layout)


@gluon.jit
def _f32_view_new(buf, rows: gl.constexpr, cols: gl.constexpr, layout: gl.constexpr):
    return buf.reinterpret(gl.float32, [rows, cols], layout)


_f32_view = (_f32_view_new if hasattr(gl.shared_memory_descriptor, "reinterpret")
             else _f32_view_old)


@gluon.jit
def _view_old(buf, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
    return buf._reinterpret(dtype, shape, layout)


@gluon.jit
def _view_new(buf, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
    return buf.reinterpret(dtype, shape, layout)


_view = _view_new if hasattr(gl.shared_memory_descriptor, "reinterpret") else _view_old


@gluon.jit
def _loader8(desc, sc_desc, bufs, sc_bufs, ready, empty, bt_row_ptr, kv_lo, kv_hi, n_tiles,
             rows_per_block, a_k, a_v, BLOCK_SIZE: gl.constexpr, TILE_N: gl.constexpr,
             BOX_T: gl.constexpr, HEAD: gl.constexpr, STAGES: gl.constexpr):
    """One warp: each tile's codes and scales, STAGES tiles ahead of the consumer."""
    for i in range(n_tiles):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        start = kv_lo + i * TILE_N
        _load_tile8(desc, sc_desc, bufs, sc_bufs, ready, s, start, kv_hi, bt_row_ptr,
                    rows_per_block, a_k, a_v, BLOCK_SIZE, TILE_N, BOX_T, HEAD)


@gluon.jit
def _load_tile8(desc, sc_desc, bufs, sc_bufs, ready, s, start, kv_hi, bt_row_ptr,
                rows_per_block, a_k, a_v, BLOCK_SIZE: gl.constexpr, TILE_N: gl.constexpr,
                BOX_T: gl.constexpr, HEAD: gl.constexpr):
    """One tile's boxes into stage s, BOX_T tokens (one box a cache block's run) at a
    time, every box at a 16-byte boundary (a_k and a_v, at or below a head's K and V):
    K and V as two 128-byte chunks each, and V's 16-byte tail with its scale."""
    mbarrier.expect(ready.index(s), TILE_N * (4 * CH8 + SCB))
    for j in gl.static_range(TILE_N // BOX_T):
        tok = start + j * BOX_T
        # Block 0 past the segment's end: always allocated, its keys masked.
        blk = gl.load(bt_row_ptr + tok // BLOCK_SIZE, mask=tok < kv_hi, other=0)
        row = blk * rows_per_block + tok % BLOCK_SIZE
        for c in gl.static_range(2):
            _tma_load(desc, [row, a_k + c * CH8], ready.index(s),
                      bufs.index(s * 4 + c).slice(j * BOX_T, BOX_T))
            _tma_load(desc, [row, a_v + c * CH8], ready.index(s),
                      bufs.index(s * 4 + 2 + c).slice(j * BOX_T, BOX_T))
        _tma_load(sc_desc, [row, a_v + HEAD], ready.index(s),
                  sc_bufs.index(s * 2 + 1).slice(j * BOX_T, BOX_T))


@gluon.jit
def _low8(y):
    """The int8 code held in the low byte of y = n + 1.5 * 2**23 (n an integer of
    |n| <= 127; 0x4B400000's low byte is zero)."""
    return y.to(gl.int32, bitcast=True).to(gl.int8)


@gluon.jit
def _low_term(x, r):
    """The low int8 term of x (|x| <= 127) whose high term's code is r (as a float): 256
    x the remainder, rounded as the high term is. The clamp keeps a tie's 128 a code."""
    return _low8(gl.minimum(gl.maximum((x - r) * 256.0, -127.0), 127.0) + 12582912.0)


@gluon.jit
def _scale_column(x, at, layout: gl.constexpr, sc_layout: gl.constexpr):
    """Column ``at`` of a [TILE_N, 4] float32 tile (the scale, 4 x at bytes into
    each row's 16-byte box), in ``layout``."""
    col = gl.arange(0, 4, layout=gl.SliceLayout(0, sc_layout))
    return gl.convert_layout(gl.sum(gl.where(col[None, :] == at, x, 0.0), axis=1), layout)


@gluon.jit
def _scales(sc_bufs, idx, at, TILE_N: gl.constexpr, layout: gl.constexpr):
    """The scales of a [TILE_N, 16]-byte scale box, column ``at``, as float32."""
    sc_layout: gl.constexpr = SCALE_LOAD_LAYOUT
    f32_smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32,
                                                  rank=2)
    x = _f32_view(sc_bufs.index(idx), TILE_N, 4, f32_smem).load(sc_layout)
    return _scale_column(x, at, layout, sc_layout)


@gluon.jit
def _k_scales(bufs, s, at, TILE_N: gl.constexpr, layout: gl.constexpr):
    """Stage s's K scales (column ``at`` of the first 16 bytes of V's first chunk,
    0 or 2 there) in the score columns' layout."""
    sc_layout: gl.constexpr = SCALE_LOAD_LAYOUT
    f32_sw: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32,
                                                rank=2)
    x = _f32_view(bufs.index(s * 4 + 2), TILE_N, CH8 // 4, f32_sw).slice(0, 4, 1).load(
        sc_layout)
    return _scale_column(x, at, layout, sc_layout)


@gluon.jit
def _k_tail(bufs, s):
    """Stage s's K tail as the B operand of the tail k-step: the first KT bytes of
    V's first chunk (the 128-byte swizzle's first 32-byte step)."""
    return bufs.index(s * 4 + 2).slice(0, KT, 1).permute((1, 0))


@gluon.jit
def _qk_term(q_smem, qt, bufs, s, s_zero):
    """One query term's Q.K on stage s, issued and left running: K's two 128-byte
    chunks, then its tail k-step."""
    acc = warpgroup_mma(q_smem.index(0), bufs.index(s * 4).permute((1, 0)), s_zero,
                        use_acc=False, is_async=True)
    acc = warpgroup_mma(q_smem.index(1), bufs.index(s * 4 + 1).permute((1, 0)), acc,
                        is_async=True)
    return warpgroup_mma(qt, _k_tail(bufs, s), acc, is_async=True)


@gluon.jit
def _widen(v8):
    """int8 V codes into fp16, exactly: x ^ 0x80 is x + 128 as a byte; under the
    exponent byte 0x64 it is the fp16 1024 + (x + 128); 1152 (0x6480) off leaves x.
    1 LOP3 + 2 PRMT + 2 HSUB2 for 4 codes, against 8 for Triton's bf16 cast."""
    return gl.inline_asm_elementwise(
        "{ .reg .b32 t, m; xor.b32 t, $2, 0x80808080; mov.b32 m, 0x64806480;"
        " prmt.b32 $0, t, 0x64646464, 0x5140; prmt.b32 $1, t, 0x64646464, 0x5342;"
        " sub.f16x2 $0, $0, m; sub.f16x2 $1, $1, m; }",
        "=r,=r,r", [v8], dtype=gl.float16, is_pure=True, pack=4)


@gluon.jit
def _p_scale(LAZY: gl.constexpr):
    """What P's columns are multiplied by before the P.V MMA (the stores divide it
    out). Eager, P <= 1: 256 lifts small P x V-scale products out of fp16's
    subnormals; lazy, P stays below 2**RESCALE_LOG2 = 256 by itself."""
    if LAZY:
        return 1.0
    else:
        return 256.0


@gluon.jit
def _widen_scaled(bufs, sc_bufs, vbf, vbft, empty, s, b, i, v_at, kv_lo, kv_hi,
                  ld_layout: gl.constexpr, vt_layout: gl.constexpr):
    """Stage s's V into fp16 tile b with each token's scale applied (code x scale,
    rounded once; zero past the segment's end, so that a slot's garbage never meets
    P's zeros), and 1.0 in the tail tile's last column: no output column reads it
    (V's codes end 4 or 12 columns into the tail), so P.V sums P there. The stage is
    released once its codes and scales are in registers, before the stores."""
    tn: gl.constexpr = bufs.shape[1]
    rows: gl.constexpr = gl.SliceLayout(1, ld_layout)
    t = kv_lo + i * tn + gl.arange(0, tn, layout=rows)
    v_sc = gl.where(t < kv_hi, _scales(sc_bufs, s * 2 + 1, v_at // 4, tn, rows), 0.0)
    v_sc = v_sc.to(gl.float16)[:, None]
    v0 = bufs.index(s * 4 + 2).load(ld_layout)
    v1 = bufs.index(s * 4 + 3).load(ld_layout)
    t8 = sc_bufs.index(s * 2 + 1).load(vt_layout)
    # Every thread's loads are in before the one thread's arrival.
    _partition_barrier()
    mbarrier.arrive(empty.index(s), count=1)
    vbf.index(b * 2).store(_widen(v0) * v_sc)
    vbf.index(b * 2 + 1).store(_widen(v1) * v_sc)
    tail = _widen(t8) * gl.convert_layout(v_sc, vt_layout)
    col = gl.arange(0, tail.shape[1], layout=gl.SliceLayout(0, vt_layout))
    vbft.index(b).store(gl.where((col == tail.shape[1] - 1)[None, :], 1.0, tail).to(gl.float16))


@gluon.jit
def _widener8(bufs, sc_bufs, vbf, vbft, scv, ready, empty, vbars, n_tiles, k_at, v_at, kv_lo,
              kv_hi, STAGES: gl.constexpr):
    """One warpgroup of rows: a worker warpgroup that takes three jobs off the
    consumer's chain each tile. It stores the tile's K scales as a float32 vector
    into scv[i % 2] and says so on vbars[4 + i % 2] (the consumer then loads them in
    its columns' layout, with no conversion through shared memory); it widens V into
    fp16 tile i % 2 with V's scales applied and a column of ones (_widen_scaled: the
    softmax then needs neither V's scales nor row sums), says so on vbars[i % 2], and
    waits on vbars[2 + i % 2] until the consumer's P.V of tile i - 2 has read that
    tile. A stage's empty barrier takes its arrival and the consumer's."""
    ld_layout: gl.constexpr = V_LOAD_LAYOUT
    vt_layout: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [4, 1], [1, 0])
    for i in range(n_tiles):
        s = i % STAGES
        b = i % 2
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        mbarrier.wait(vbars.index(2 + b), ((i // 2) & 1) ^ 1)
        rows: gl.constexpr = gl.SliceLayout(1, SCALE_LOAD_LAYOUT)
        tn: gl.constexpr = bufs.shape[1]
        scv.index(b * 2).store(_k_scales(bufs, s, k_at // 4, tn, rows))
        # A barrier of their own, so that the softmax waits for the scales only,
        # not for the whole tile's widening.
        _partition_barrier()
        mbarrier.arrive(vbars.index(4 + b), count=1)
        _widen_scaled(bufs, sc_bufs, vbf, vbft, empty, s, b, i, v_at, kv_lo, kv_hi,
                      ld_layout, vt_layout)
        fence_async_shared()
        # Every thread's stores are in before the one thread's arrival.
        _partition_barrier()
        mbarrier.arrive(vbars.index(b), count=1)


@gluon.jit
def _softmax8(sacc, v_sc, m_i, l_i, acc0, acc1, acc2, row_scale, start, kv_hi, ctx, qi0,
              G: gl.constexpr, TILE_N: gl.constexpr, MASKED: gl.constexpr,
              LAZY: gl.constexpr, VS: gl.constexpr, s_layout: gl.constexpr,
              o_layout: gl.constexpr, o2_layout: gl.constexpr):
    """One tile's online softmax over sacc x row_scale (K's scale in sacc; the query
    row's scale and qk_scale, log2 units, in row_scale): the new row maxima and sums,
    the accumulators rescaled, and P x V's scales (x _p_scale) in fp16. MASKED builds
    the causal and segment-end mask. VS (one warpgroup, eager): the widener has
    applied V's scales and P.V sums P, so P goes out unscaled and l_i is left as it
    is."""
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    row2_layout: gl.constexpr = gl.SliceLayout(1, o2_layout)
    if MASKED:
        t = start + gl.arange(0, TILE_N, layout=col_layout)
        rr = gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, s_layout))
        limit = ctx + qi0 + rr // G + 1
        visible = (t[None, :] < limit[:, None]) & (t[None, :] < kv_hi)
        sacc = gl.where(visible, sacc, float("-inf"))
        if not VS:
            # A slot past the segment's end may hold any scale (NaN too): 0 there,
            # so P's zeros stay zeros.
            v_sc = gl.where(t < kv_hi, v_sc, 0.0)
    m_new = gl.maximum(m_i, gl.max(sacc, axis=1) * row_scale)
    if LAZY:
        # The rows keep their reference maximum until one grows past it by more
        # than RESCALE_LOG2; the accumulator's rescale then runs on few tiles. Exact
        # either way: m_i, l_i and the accumulator always share one reference.
        if gl.max(m_new - m_i, axis=0) > RESCALE_LOG2:
            alpha = gl.exp2(m_i - m_new)
            l_i = l_i * alpha
            a = gl.convert_layout(alpha, row_layout)[:, None]
            acc0 = acc0 * a
            acc1 = acc1 * a
            acc2 = acc2 * gl.convert_layout(alpha, row2_layout)[:, None]
            m_i = m_new
        p = gl.exp2(sacc * row_scale[:, None] - m_i[:, None])
        l_i = l_i + gl.sum(p, axis=1)
        m_new = m_i
    else:
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(sacc * row_scale[:, None] - m_new[:, None])
        if not VS:
            l_i = l_i * alpha + gl.sum(p, axis=1)
        a = gl.convert_layout(alpha, row_layout)[:, None]
        acc0 = acc0 * a
        acc1 = acc1 * a
        acc2 = acc2 * gl.convert_layout(alpha, row2_layout)[:, None]
    if VS:
        return m_new, l_i, (p * _p_scale(LAZY)).to(gl.float16), acc0, acc1, acc2
    else:
        return (m_new, l_i, (p * (v_sc * _p_scale(LAZY))[None, :]).to(gl.float16), acc0, acc1,
                acc2)


@gluon.jit
def _tile8(qh_smem, ql_smem, qht, qlt, bufs, sc_bufs, vbf, vbft, scv, ready, empty, widened,
           i, kv_lo, kv_hi, ctx, qi0, q_sc, k_at, v_at, m_i, l_i, acc0, acc1, acc2,
           G: gl.constexpr, TILE_N: gl.constexpr, STAGES: gl.constexpr,
           MASKED: gl.constexpr, LAZY: gl.constexpr, W: gl.constexpr, NUM_WG: gl.constexpr,
           s_layout: gl.constexpr, o_layout: gl.constexpr, o2_layout: gl.constexpr,
           p_layout: gl.constexpr, p2_layout: gl.constexpr, ld_layout: gl.constexpr,
           vt_layout: gl.constexpr):
    """One tile of the segment for warpgroup W: both Q.K terms, the online softmax and
    P.V. MASKED builds the causal and segment-end mask (False only for tiles every row
    of the warpgroup sees whole). K's codes sit k_at bytes into their boxes (the query
    is shifted to match); V's v_at bytes, so the accumulators hold V's column d at
    d + v_at. With one warpgroup the widener hands over K's scales (scv) and V with its
    scales applied."""
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    s = i % STAGES
    phase = (i // STAGES) & 1
    start = kv_lo + i * TILE_N
    s_zero = gl.zeros([WG_ROWS, TILE_N], gl.int32, layout=s_layout)
    mbarrier.wait(ready.index(s), phase)
    si = _qk_term(qh_smem, qht, bufs, s, s_zero)
    if NUM_WG == 1:
        # Both terms queued before one wait: the tensor cores run the second while
        # nothing else is left to do.
        sl = _qk_term(ql_smem, qlt, bufs, s, s_zero)
        si, sl = warpgroup_mma_wait(num_outstanding=0, deps=(si, sl))
        si = si * 256 + sl
        # K's scales from the widener, loaded once Q.K is in (loaded before the
        # wait, their registers made the masked tail loop spill).
        mbarrier.wait(widened.index(4 + i % 2), (i // 2) & 1)
        k_sc = scv.index((i % 2) * 2).load(col_layout)
        v_sc = k_sc
    else:
        si = warpgroup_mma_wait(num_outstanding=0, deps=(si,))
        sl = _qk_term(ql_smem, qlt, bufs, s, s_zero)
        sl = warpgroup_mma_wait(num_outstanding=0, deps=(sl,))
        si = si * 256 + sl
        k_sc = _k_scales(bufs, s, k_at // 4, TILE_N, col_layout)
        v_sc = _scales(sc_bufs, s * 2 + 1, v_at // 4, TILE_N, col_layout)
    m_new, l_i, p, acc0, acc1, acc2 = _softmax8(
        si.to(gl.float32) * k_sc[None, :], v_sc, m_i, l_i, acc0, acc1, acc2, q_sc, start,
        kv_hi, ctx, qi0, G, TILE_N, MASKED, LAZY, NUM_WG == 1, s_layout, o_layout,
        o2_layout)
    p2 = gl.convert_layout(p, p2_layout)
    p = gl.convert_layout(p, p_layout)
    if NUM_WG == 1:
        # The widener has V in fp16 tile i % 2 (widened: its barriers, full 0..1,
        # free 2..3, K's scales 4..5); K is read, so the stage is released here.
        b = i % 2
        mbarrier.arrive(empty.index(s), count=1)
        mbarrier.wait(widened.index(b), (i // 2) & 1)
        acc0 = warpgroup_mma(p, vbf.index(b * 2), acc0, is_async=True)
        acc1 = warpgroup_mma(p, vbf.index(b * 2 + 1), acc1, is_async=True)
        acc2 = warpgroup_mma(p2, vbft.index(b), acc2, is_async=True)
        acc0, acc1, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1, acc2))
        mbarrier.arrive(widened.index(2 + b), count=1)
    else:
        # Two warpgroups share the widening: W widens V's chunk W into this stage's
        # fp16 tile (W = 0 the tail too), and both wait for both halves. The stage
        # is released only after this warpgroup's P.V has read it.
        v8 = bufs.index(s * 4 + 2 + W).load(ld_layout)
        vbf.index(s * 2 + W).store(_widen(v8))
        if W == 0:
            vbft.index(s).store(_widen(sc_bufs.index(s * 2 + 1).load(vt_layout)))
        fence_async_shared()
        _partition_barrier()
        mbarrier.arrive(widened.index(s), count=1)
        mbarrier.wait(widened.index(s), phase)
        acc0 = warpgroup_mma(p, vbf.index(s * 2), acc0, is_async=True)
        acc1 = warpgroup_mma(p, vbf.index(s * 2 + 1), acc1, is_async=True)
        acc2 = warpgroup_mma(p2, vbft.index(s), acc2, is_async=True)
        acc0, acc1, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1, acc2))
        mbarrier.arrive(empty.index(s), count=1)
    return m_new, l_i, acc0, acc1, acc2


@gluon.jit
def _query_scaled(q_ptr, r0, q_start, q_len, qi0, kv_head, stride_q_tok, stride_q_head, k_at,
                  ROWS: gl.constexpr, G: gl.constexpr, WG_Q: gl.constexpr,
                  ld_layout: gl.constexpr, kt_layout: gl.constexpr):
    """Rows r0 .. r0 + ROWS of a consumer warpgroup's query tile (WG_Q tokens x G heads
    from token qi0), shifted k_at columns right as K's boxes are (zeros where the boxes
    hold other bytes), each scaled by 127 over its maximum for the int8 terms of the
    Triton pass's _quantize_q: its two 128-column chunks and its tail, and the maxima."""
    r = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, ld_layout))
    d = gl.arange(0, CH8, layout=gl.SliceLayout(0, ld_layout)) - k_at
    qi = qi0 + r // G
    row_ok = (r < WG_Q * G) & (qi < q_len)
    q_rows = (q_start + qi).to(gl.int64) * stride_q_tok + (kv_head * G + r % G) * stride_q_head
    q_base = q_ptr + q_rows[:, None] + d[None, :]
    qa = gl.load(q_base, mask=row_ok[:, None] & (d >= 0)[None, :], other=0.0).to(gl.float32)
    qb = gl.load(q_base + CH8, mask=row_ok[:, None], other=0.0).to(gl.float32)
    rt = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, kt_layout))
    dt = gl.arange(0, KT, layout=gl.SliceLayout(0, kt_layout)) + 2 * CH8 - k_at
    qit = qi0 + rt // G
    q_rows_t = ((q_start + qit).to(gl.int64) * stride_q_tok
                + (kv_head * G + rt % G) * stride_q_head)
    qc_ok = ((rt < WG_Q * G) & (qit < q_len))[:, None] & (dt < 2 * CH8)[None, :]
    qc = gl.load(q_ptr + q_rows_t[:, None] + dt[None, :], mask=qc_ok, other=0.0).to(gl.float32)
    amax = gl.maximum(gl.maximum(gl.max(gl.abs(qa), axis=1), gl.max(gl.abs(qb), axis=1)),
                      gl.convert_layout(gl.max(gl.abs(qc), axis=1),
                                        gl.SliceLayout(1, ld_layout)))
    inv = (127.0 / gl.maximum(amax, 1.0e-30))[:, None]
    inv_t = gl.convert_layout(127.0 / gl.maximum(amax, 1.0e-30),
                              gl.SliceLayout(1, kt_layout))[:, None]
    return qa * inv, qb * inv, qc * inv_t, amax


@gluon.jit
def _quantize_chunked(q_ptr, qh_smem, ql_smem, qht, qlt, qsc, q_start, q_len, qi0, kv_head,
                      stride_q_tok, stride_q_head, k_at, G: gl.constexpr, WG_Q: gl.constexpr,
                      W: gl.constexpr, ld_layout: gl.constexpr, kt_layout: gl.constexpr,
                      out_layout: gl.constexpr):
    """The consumer's quantization (_query_scaled), Q_CHUNKS row chunks at a time in a loop.
    The codes go to the same tiles through views of QR-row chunks (QR a multiple of 8
    keeps the tile's swizzle); each chunk's row maxima go to qsc, read back as one row
    vector. Returns the rows' scales."""
    QR: gl.constexpr = WG_ROWS // Q_CHUNKS
    # A view's leading dimension is indexed, so its layout has one chunk's rank.
    codes: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8,
                                               rank=2)
    tail: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=8,
                                              rank=2)
    flat1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    ha_v = _view(qh_smem.index(0), gl.int8, [Q_CHUNKS, QR, CH8], codes)
    hb_v = _view(qh_smem.index(1), gl.int8, [Q_CHUNKS, QR, CH8], codes)
    la_v = _view(ql_smem.index(0), gl.int8, [Q_CHUNKS, QR, CH8], codes)
    lb_v = _view(ql_smem.index(1), gl.int8, [Q_CHUNKS, QR, CH8], codes)
    ht_v = _view(qht, gl.int8, [Q_CHUNKS, QR, KT], tail)
    lt_v = _view(qlt, gl.int8, [Q_CHUNKS, QR, KT], tail)
    sc_v = _view(qsc.index(W), gl.float32, [Q_CHUNKS, QR], flat1)
    for c in range(0, Q_CHUNKS):
        xa, xb, xc, amax = _query_scaled(
            q_ptr, c * QR, q_start, q_len, qi0, kv_head, stride_q_tok, stride_q_head, k_at,
            QR, G, WG_Q, ld_layout, kt_layout)
        ya = xa + 12582912.0
        yb = xb + 12582912.0
        yc = xc + 12582912.0
        ha_v.index(c).store(_low8(ya))
        hb_v.index(c).store(_low8(yb))
        ht_v.index(c).store(_low8(yc))
        la_v.index(c).store(_low_term(xa, ya - 12582912.0))
        lb_v.index(c).store(_low_term(xb, yb - 12582912.0))
        lt_v.index(c).store(_low_term(xc, yc - 12582912.0))
        sc_v.index(c).store(amax)
    fence_async_shared()
    _partition_barrier()
    q_sc = qsc.index(W).load(out_layout) / 127.0
    q_sc = q_sc / 256.0
    return q_sc


@gluon.jit
def _consume8(q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, qh_smem, ql_smem, qht, qlt,
              qsc, bufs, sc_bufs, vbf, vbft, scv, ready, empty, widened, seq, kv_head, seg,
              q_start, q_len, seq_len, kv_lo, kv_hi, n_tiles, qk_scale, max_q, stride_q_tok,
              stride_q_head, k_at, v_at, NUM_HEADS: gl.constexpr, G: gl.constexpr,
              WG_Q: gl.constexpr, TILE_N: gl.constexpr, NUM_SEGMENTS: gl.constexpr,
              STAGES: gl.constexpr, LAZY: gl.constexpr, W: gl.constexpr,
              NUM_WG: gl.constexpr):
    """Consumer warpgroup W: every tile of the segment for its 64 query rows (WG_Q
    tokens x G heads from token W x WG_Q), then the segment's partials as the Triton
    split pass writes them."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, TILE_N, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, CH8, 16])
    o2_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, SCB, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    p2_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o2_layout, k_width=2)
    ld_layout: gl.constexpr = V_LOAD_LAYOUT
    kt_layout: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
    vt_layout: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [4, 1], [1, 0])
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    row2_layout: gl.constexpr = gl.SliceLayout(1, o2_layout)

    # K's codes start 0 or 8 bytes past a 16-byte boundary and V's 4 or 12. Said so
    # (a product by a constant carries its divisibility into the compiler's alignment
    # analysis; gl.multiple_of on the scalars did not), the query's loads and the
    # partials' stores are 16-byte vectors; unsaid, 2- and 4-byte ones.
    k_at = (k_at // 8) * 8
    v_at = (v_at // 4) * 4
    # Query rows quantized per row to two int8 terms, as the Triton pass's
    # _quantize_q, shifted k_at columns right as K's boxes are: zeros where the
    # boxes hold other bytes.
    qi0 = W * WG_Q
    if NUM_WG == 2:
        q_sc = _quantize_chunked(q_ptr, qh_smem, ql_smem, qht, qlt, qsc, q_start, q_len,
                                 qi0, kv_head, stride_q_tok, stride_q_head, k_at, G,
                                 WG_Q, W, ld_layout, kt_layout,
                                 gl.SliceLayout(1, s_layout))
    else:
        xa, xb, xc, amax = _query_scaled(
            q_ptr, 0, q_start, q_len, qi0, kv_head, stride_q_tok, stride_q_head, k_at,
            WG_ROWS, G, WG_Q, ld_layout, kt_layout)
        ya = xa + 12582912.0
        yb = xb + 12582912.0
        yc = xc + 12582912.0
        ha = _low8(ya)
        hb = _low8(yb)
        hc = _low8(yc)
        ra = ya - 12582912.0
        rb = yb - 12582912.0
        rc = yc - 12582912.0
        q_sc = amax / 127.0 / 256.0
        qh_smem.index(0).store(ha)
        qh_smem.index(1).store(hb)
        qht.store(hc)
        ql_smem.index(0).store(_low_term(xa, ra))
        ql_smem.index(1).store(_low_term(xb, rb))
        qlt.store(_low_term(xc, rc))
        fence_async_shared()
    # The query's scale and qk_scale in one factor a row: a score costs one FMUL (by
    # K's scale) before the exponent's FFMA. Positive, so a masked -inf stays -inf.
    q_sc = gl.convert_layout(gl.maximum(q_sc, 1.0e-30) * qk_scale, gl.SliceLayout(1, s_layout))

    ctx = seq_len - q_len
    m_i = gl.full([WG_ROWS], -1.0e30, gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([WG_ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc0 = gl.zeros([WG_ROWS, CH8], gl.float32, layout=o_layout)
    acc1 = gl.zeros([WG_ROWS, CH8], gl.float32, layout=o_layout)
    acc2 = gl.zeros([WG_ROWS, SCB], gl.float32, layout=o2_layout)
    # The tiles every row sees whole (before the first row's causal limit and inside
    # the segment) run without a mask; only the tail tiles build one, so the steady
    # loop holds no masking block.
    n_full = gl.minimum(gl.maximum(gl.minimum(ctx + qi0 + 1, kv_hi) - kv_lo, 0) // TILE_N,
                        n_tiles)
    for i in range(0, n_full):
        m_i, l_i, acc0, acc1, acc2 = _tile8(
            qh_smem, ql_smem, qht, qlt, bufs, sc_bufs, vbf, vbft, scv, ready, empty, widened,
            i, kv_lo, kv_hi, ctx, qi0, q_sc, k_at, v_at, m_i, l_i, acc0, acc1, acc2, G, TILE_N,
            STAGES, False, LAZY, W, NUM_WG, s_layout, o_layout, o2_layout, p_layout,
            p2_layout, ld_layout, vt_layout)
    for i in range(n_full, n_tiles):
        m_i, l_i, acc0, acc1, acc2 = _tile8(
            qh_smem, ql_smem, qht, qlt, bufs, sc_bufs, vbf, vbft, scv, ready, empty, widened,
            i, kv_lo, kv_hi, ctx, qi0, q_sc, k_at, v_at, m_i, l_i, acc0, acc1, acc2, G, TILE_N,
            STAGES, True, LAZY, W, NUM_WG, s_layout, o_layout, o2_layout, p_layout,
            p2_layout, ld_layout, vt_layout)

    r_o = gl.arange(0, WG_ROWS, layout=row_layout)
    d_o = gl.arange(0, CH8, layout=gl.SliceLayout(0, o_layout)) - v_at
    qi_o = qi0 + r_o // G
    ok_o = (r_o < WG_Q * G) & (qi_o < q_len)
    part_row = (((seq * max_q + qi_o).to(gl.int64) * NUM_HEADS + kv_head * G + r_o % G)
                * NUM_SEGMENTS + seg)
    if NUM_WG == 1:
        # The row sums are acc2's last column (P x the widener's ones), in P's scale.
        c2 = gl.arange(0, SCB, layout=gl.SliceLayout(0, o2_layout))
        l2 = gl.sum(gl.where((c2 == SCB - 1)[None, :], acc2, 0.0), axis=1)
        l_i = gl.convert_layout(l2 / _p_scale(LAZY), l_i.type.layout)
    l_o = gl.convert_layout(l_i, row_layout)
    gl.store(part_max_ptr + part_row, gl.convert_layout(m_i, row_layout), mask=ok_o)
    gl.store(part_sum_ptr + part_row, l_o, mask=ok_o)
    inv_l = gl.where(l_o > 0.0, 1.0 / (l_o * _p_scale(LAZY)), 0.0)[:, None]
    # Accumulator column c holds V's column c - v_at.
    if NUM_WG == 1:
        # Each warp stores whole rows (32 threads x 4 columns) through a layout
        # conversion, not the accumulator's 8-byte pairs of 8 rows (a quarter of each
        # sector used): about 6 us a call less on an H200. The conversion's 32 KiB of
        # shared memory fit beside one warpgroup's stages, not two.
        st_layout: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])
        d_s = gl.arange(0, CH8, layout=gl.SliceLayout(0, st_layout)) - v_at
        row_s = gl.convert_layout(part_row, gl.SliceLayout(1, st_layout))
        ok_s = gl.convert_layout(ok_o, gl.SliceLayout(1, st_layout))
        s_base = part_out_ptr + row_s[:, None] * (2 * CH8) + d_s[None, :]
        gl.store(s_base, gl.convert_layout(acc0 * inv_l, st_layout),
                 mask=ok_s[:, None] & (d_s >= 0)[None, :])
        gl.store(s_base + CH8, gl.convert_layout(acc1 * inv_l, st_layout),
                 mask=ok_s[:, None])
    else:
        o_base = part_out_ptr + part_row[:, None] * (2 * CH8) + d_o[None, :]
        gl.store(o_base, acc0 * inv_l, mask=ok_o[:, None] & (d_o >= 0)[None, :])
        gl.store(o_base + CH8, acc1 * inv_l, mask=ok_o[:, None])
    d_t = gl.arange(0, SCB, layout=gl.SliceLayout(0, o2_layout)) + 2 * CH8 - v_at
    part_row2 = gl.convert_layout(part_row, row2_layout)
    gl.store(part_out_ptr + part_row2[:, None] * (2 * CH8) + d_t[None, :],
             acc2 * gl.convert_layout(inv_l, o2_layout),
             mask=gl.convert_layout(ok_o, row2_layout)[:, None] & (d_t < 2 * CH8)[None, :])


@gluon.jit
def _consume8_second(q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, qh_smem, ql_smem, qht,
                     qlt, qsc, bufs, sc_bufs, vbf, vbft, scv, ready, empty, widened, seq, kv_head,
                     seg, q_start, q_len, seq_len, kv_lo, kv_hi, n_tiles, qk_scale, max_q,
                     stride_q_tok, stride_q_head, k_at, v_at, NUM_HEADS: gl.constexpr,
                     G: gl.constexpr, WG_Q: gl.constexpr, TILE_N: gl.constexpr,
                     NUM_SEGMENTS: gl.constexpr, STAGES: gl.constexpr, LAZY: gl.constexpr):
    # The second warpgroup runs as a worker partition: its index is fixed here.
    _consume8(q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, qh_smem, ql_smem, qht, qlt,
              qsc, bufs, sc_bufs, vbf, vbft, scv, ready, empty, widened, seq, kv_head, seg,
              q_start, q_len, seq_len, kv_lo, kv_hi, n_tiles, qk_scale, max_q, stride_q_tok,
              stride_q_head, k_at, v_at, NUM_HEADS, G, WG_Q, TILE_N, NUM_SEGMENTS, STAGES,
              LAZY, 1, 2)


@gluon.jit
def _segments_met(sync_ptr, ARRIVALS: gl.constexpr):
    """Returns once all ARRIVALS programs of this (request, kv head) have called it.
    Each adds one to sync_ptr[0]; the last sets it back to 0 and then moves the
    generation sync_ptr[1] on, which the others wait to see change. So the pair
    needs no reset between launches (graph replays included), whatever the segment
    count of the next. A scalar atomic runs on one thread; the barriers order the
    partition's partial stores before it and its loads after."""
    _partition_barrier()
    gen = gl.atomic_add(sync_ptr + 1, 0, sem="relaxed", scope="gpu")
    # Release: this program's partials (and the generation read above) before the count.
    n = gl.atomic_add(sync_ptr, 1, sem="acq_rel", scope="gpu")
    if n == ARRIVALS - 1:
        gl.atomic_xchg(sync_ptr, 0, sem="relaxed", scope="gpu")
        gl.atomic_add(sync_ptr + 1, 1, sem="release", scope="gpu")
    else:
        seen = gen
        while seen == gen:
            seen = gl.atomic_add(sync_ptr + 1, 0, sem="acquire", scope="gpu")
    _partition_barrier()


@gluon.jit
def _merge_columns(out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, seq, kv_head, seg,
                   q_start, q_len, max_q, stride_o_tok, stride_o_head,
                   NUM_HEADS: gl.constexpr, G: gl.constexpr, TILE_Q: gl.constexpr,
                   NUM_SEGMENTS: gl.constexpr, HEAD: gl.constexpr, L3: gl.constexpr):
    """The reduce pass's merge, for this program's HEAD / NUM_SEGMENTS columns of every
    row of its (request, kv head): the segments' weights from their maxima and sums,
    and the weighted mean of their partial outputs, stored as the output. All the
    segments of a row chunk are loaded at once (L3: [rows, segments, columns]); a
    segment none of a row's keys fell in has sum 0 and weight 0, and its unwritten
    partial (anything, NaN too) is never multiplied in."""
    COLS: gl.constexpr = HEAD // NUM_SEGMENTS
    RC: gl.constexpr = 32
    l2: gl.constexpr = gl.SliceLayout(2, L3)
    lo: gl.constexpr = gl.SliceLayout(1, L3)
    rows = gl.minimum(q_len, TILE_Q) * G
    r_w = gl.arange(0, RC, layout=gl.SliceLayout(1, l2))
    s_w = gl.arange(0, NUM_SEGMENTS, layout=gl.SliceLayout(0, l2))
    r_o = gl.arange(0, RC, layout=gl.SliceLayout(1, lo))
    c_o = gl.arange(0, COLS, layout=gl.SliceLayout(0, lo)) + seg * COLS
    c3 = gl.expand_dims(gl.expand_dims(gl.arange(0, COLS, layout=gl.SliceLayout(0, lo)), 0),
                        1) + seg * COLS
    for r0 in gl.static_range(0, TILE_Q * G, RC):
        r = r0 + r_w
        ok = r < rows
        slot = (((seq * max_q + r // G).to(gl.int64) * NUM_HEADS + kv_head * G + r % G)
                * NUM_SEGMENTS)
        idx = slot[:, None] + s_w[None, :]
        m = gl.load(part_max_ptr + idx, mask=ok[:, None], other=-1.0e30,
                    cache_modifier=".cg")
        lsum = gl.load(part_sum_ptr + idx, mask=ok[:, None], other=0.0, cache_modifier=".cg")
        part = gl.load(part_out_ptr + gl.expand_dims(idx, 2) * HEAD + c3,
                       mask=gl.expand_dims(ok[:, None], 2), other=0.0, cache_modifier=".cg")
        top = gl.max(m, axis=1)
        w = gl.exp2(m - top[:, None]) * lsum
        w3 = gl.expand_dims(w, 2)
        acc = gl.sum(gl.where(w3 > 0.0, w3 * part, 0.0), axis=1)
        den = gl.convert_layout(gl.sum(w, axis=1), gl.SliceLayout(1, lo))
        res = gl.where(den[:, None] > 0.0, acc / den[:, None], 0.0)
        ro = r0 + r_o
        tok = (q_start + ro // G).to(gl.int64)
        head = kv_head * G + ro % G
        gl.store(out_ptr + tok[:, None] * stride_o_tok + (head * stride_o_head)[:, None]
                 + c_o[None, :], res.to(out_ptr.dtype.element_ty),
                 mask=(ro < rows)[:, None])


def merge_layout(num_segments: int, head: int) -> gl.BlockedLayout:
    """_merge_columns' [rows, segments, columns] layout for four warps: 16-byte column
    vectors where a program's columns allow, a warp across segments and columns."""
    cols = head // num_segments
    vec = min(4, cols)
    t_col = min(cols // vec, 32)
    t_seg = min(num_segments, 32 // t_col)
    return gl.BlockedLayout([1, 1, vec], [32 // (t_col * t_seg), t_seg, t_col], [4, 1, 1],
                            [2, 1, 0])


@gluon.jit
def _ws_split_int8_kernel(part_out_ptr, part_max_ptr, part_sum_ptr, q_ptr, desc, kt_desc,
                          sc_desc, block_table_ptr, seq_lens_ptr, cu_seqlens_q_ptr, qk_scale,
                          min_seg_tokens, max_q, stride_q_tok, stride_q_head, stride_bt,
                          rows_per_block, stride_kv_head, out_ptr, sync_ptr, stride_o_tok,
                          stride_o_head, NUM_HEADS: gl.constexpr,
                          G: gl.constexpr, BLOCK_SIZE: gl.constexpr, WG_Q: gl.constexpr,
                          NUM_WG: gl.constexpr, TILE_N: gl.constexpr, BOX_T: gl.constexpr,
                          NUM_SEGMENTS: gl.constexpr, STAGES: gl.constexpr,
                          HEAD: gl.constexpr, LAZY: gl.constexpr, FUSE: gl.constexpr,
                          MERGE_LAYOUT: gl.constexpr):
    """Grid (num_seqs, num_kv_heads, NUM_SEGMENTS): one query tile a request (q <=
    WG_Q x NUM_WG), segments split as the Triton split pass splits them. kt_desc is
    not copied through (K's tail comes with V's first chunk); the query's tail tiles
    take its 32-byte swizzle, and the launch keeps the argument list the H200 runs
    were measured with. FUSE (a cooperative launch, every program resident): the
    programs of a (request, kv head) wait for each other after their partials, then
    each merges its share of the columns into out, and no reduce pass follows.
    Without it out, sync and their strides are not read."""
    seq = gl.program_id(0)
    kv_head = gl.program_id(1)
    seg = gl.program_id(2)
    q_start = gl.load(cu_seqlens_q_ptr + seq)
    q_len = gl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    seq_len = gl.load(seq_lens_ptr + seq)
    per_seg = gl.cdiv(gl.cdiv(seq_len, NUM_SEGMENTS), TILE_N) * TILE_N
    seg_tokens = gl.maximum(per_seg, min_seg_tokens)
    kv_lo = seg * seg_tokens
    tile_rows = gl.minimum(q_len, WG_Q * NUM_WG)
    kv_hi = gl.minimum(kv_lo + seg_tokens, seq_len - q_len + tile_rows)
    n_tiles = gl.cdiv(kv_hi - kv_lo, TILE_N)
    if kv_lo >= seq_len:
        # A segment past the request's end: an empty partial for the reduce pass.
        e_layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        r = gl.arange(0, WG_ROWS * NUM_WG, layout=e_layout)
        qi = r // G
        ok = (r < WG_Q * NUM_WG * G) & (qi < q_len)
        row = (((seq * max_q + qi).to(gl.int64) * NUM_HEADS + kv_head * G + r % G)
               * NUM_SEGMENTS + seg)
        gl.store(part_max_ptr + row,
                 gl.full([WG_ROWS * NUM_WG], -1.0e30, gl.float32, layout=e_layout), mask=ok)
        gl.store(part_sum_ptr + row, gl.zeros([WG_ROWS * NUM_WG], gl.float32, layout=e_layout),
                 mask=ok)
    else:
        layout8: gl.constexpr = desc.layout
        kt_layout: gl.constexpr = kt_desc.layout
        sc_layout: gl.constexpr = sc_desc.layout
        q8_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128,
                                                       element_bitwidth=8, rank=2)
        vbf_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128,
                                                        element_bitwidth=16, rank=2)
        vbft_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32,
                                                         element_bitwidth=16, rank=2)
        bufs = gl.allocate_shared_memory(gl.int8, [STAGES * 4, TILE_N, CH8], layout8)
        # K's own tail stages: unused since K's tail comes with V (5 boxes, not 7),
        # still allocated so that the shared memory map is the measured one.
        gl.allocate_shared_memory(gl.int8, [STAGES, TILE_N, KT], kt_layout)
        sc_bufs = gl.allocate_shared_memory(gl.int8, [STAGES * 2, TILE_N, SCB], sc_layout)
        qh = gl.allocate_shared_memory(gl.int8, [2, WG_ROWS, CH8], q8_layout)
        ql = gl.allocate_shared_memory(gl.int8, [2, WG_ROWS, CH8], q8_layout)
        qht = gl.allocate_shared_memory(gl.int8, [WG_ROWS, KT], kt_layout)
        qlt = gl.allocate_shared_memory(gl.int8, [WG_ROWS, KT], kt_layout)
        if NUM_WG == 2:
            # Each warpgroup's row maxima, as _quantize_chunked writes them.
            qsc = gl.allocate_shared_memory(gl.float32, [2, WG_ROWS],
                                            gl.SwizzledSharedLayout(1, 1, 1, [0]))
        else:
            qsc = qht
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        widened = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            # Every consumer warpgroup releases a stage, and with one the widener too.
            mbarrier.init(empty.index(i), count=NUM_WG + (NUM_WG == 1))
            mbarrier.init(widened.index(i), count=NUM_WG)
        bt_row = block_table_ptr + seq.to(gl.int64) * stride_bt
        # The boxes start at the 16-byte boundaries at or below a head's K and V,
        # k_at and v_at bytes before the codes.
        col_k = kv_head * stride_kv_head
        col_v = col_k + HEAD + 4
        k_at = col_k % 16
        v_at = col_v % 16
        a_k = col_k - k_at
        a_v = col_v - v_at
        if NUM_WG == 2:
            # An fp16 V tile a stage: the two warpgroups' P.V may be a tile apart.
            vbf = gl.allocate_shared_memory(gl.float16, [STAGES * 2, TILE_N, CH8], vbf_layout)
            vbft = gl.allocate_shared_memory(gl.float16, [STAGES, TILE_N, SCB], vbft_layout)
            qh1 = gl.allocate_shared_memory(gl.int8, [2, WG_ROWS, CH8], q8_layout)
            ql1 = gl.allocate_shared_memory(gl.int8, [2, WG_ROWS, CH8], q8_layout)
            qht1 = gl.allocate_shared_memory(gl.int8, [WG_ROWS, KT], kt_layout)
            qlt1 = gl.allocate_shared_memory(gl.int8, [WG_ROWS, KT], kt_layout)
            gl.warp_specialize([
                (_consume8, (q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, qh, ql, qht, qlt,
                             qsc, bufs, sc_bufs, vbf, vbft, vbft, ready, empty, widened, seq,
                             kv_head, seg, q_start, q_len, seq_len, kv_lo, kv_hi, n_tiles,
                             qk_scale, max_q, stride_q_tok, stride_q_head, k_at, v_at,
                             NUM_HEADS, G, WG_Q, TILE_N, NUM_SEGMENTS, STAGES, LAZY, 0, 2)),
                (_consume8_second, (q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, qh1, ql1,
                                    qht1, qlt1, qsc, bufs, sc_bufs, vbf, vbft, vbft, ready,
                                    empty, widened, seq, kv_head, seg, q_start, q_len, seq_len,
                                    kv_lo, kv_hi, n_tiles, qk_scale, max_q, stride_q_tok,
                                    stride_q_head, k_at, v_at, NUM_HEADS, G, WG_Q, TILE_N,
                                    NUM_SEGMENTS, STAGES, LAZY)),
                (_loader8, (desc, sc_desc, bufs, sc_bufs, ready, empty, bt_row, kv_lo, kv_hi,
                            n_tiles, rows_per_block, a_k, a_v, BLOCK_SIZE, TILE_N, BOX_T,
                            HEAD, STAGES)),
            ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
        else:
            # Two fp16 V tiles (the widener runs up to two tiles ahead of P.V) and
            # their barriers: full 0..1 (the widener arrives), free 2..3 (P.V), and
            # the K scales' full 4..5.
            vbf = gl.allocate_shared_memory(gl.float16, [4, TILE_N, CH8], vbf_layout)
            vbft = gl.allocate_shared_memory(gl.float16, [2, TILE_N, SCB], vbft_layout)
            vbars = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())
            for i in gl.static_range(6):
                mbarrier.init(vbars.index(i), count=1)
            # Each fp16 V tile's K scales, as float32 (rows 0 and 2; 1 and 3 keep the
            # measured shared memory map).
            scv = gl.allocate_shared_memory(gl.float32, [4, TILE_N],
                                            gl.SwizzledSharedLayout(1, 1, 1, [0]))
            gl.warp_specialize([
                (_consume8, (q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, qh, ql, qht, qlt,
                             qsc, bufs, sc_bufs, vbf, vbft, scv, ready, empty, vbars, seq,
                             kv_head, seg, q_start, q_len, seq_len, kv_lo, kv_hi, n_tiles,
                             qk_scale, max_q, stride_q_tok, stride_q_head, k_at, v_at,
                             NUM_HEADS, G, WG_Q, TILE_N, NUM_SEGMENTS, STAGES, LAZY, 0, 1)),
                (_loader8, (desc, sc_desc, bufs, sc_bufs, ready, empty, bt_row, kv_lo, kv_hi,
                            n_tiles, rows_per_block, a_k, a_v, BLOCK_SIZE, TILE_N, BOX_T,
                            HEAD, STAGES)),
                (_widener8, (bufs, sc_bufs, vbf, vbft, scv, ready, empty, vbars, n_tiles, k_at,
                             v_at, kv_lo, kv_hi, STAGES)),
            ], [1, 4], [LOADER_REGS, WIDENER_REGS])
    if FUSE:
        _segments_met(sync_ptr + (seq * NUM_HEADS + kv_head) * 2, NUM_SEGMENTS)
        _merge_columns(out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, seq, kv_head, seg,
                       q_start, q_len, max_q, stride_o_tok, stride_o_head, NUM_HEADS, G,
                       WG_Q * NUM_WG, NUM_SEGMENTS, HEAD, MERGE_LAYOUT)


def _descriptors(
    key_cache: torch.Tensor,
) -> tuple[TensorDescriptor, TensorDescriptor, TensorDescriptor, int, int]:
    """TMA descriptors over the whole cache buffer seen as [token rows, bytes of a
    token row] (key_cache's base is the buffer's: K comes first in a head's row): the
    128-byte code chunks (128-byte swizzle), K's 32-byte tail (32-byte swizzle) and
    16-byte boxes (V's tail with its scale); and the rows a block and the bytes a head.
    int8_hopper_unsupported() has checked the layout."""
    num_blocks, block_size, _, _ = key_cache.shape
    s_blk, s_slot, s_head = key_cache.stride()[:3]
    rows_per_block = s_blk // s_slot
    rows = (num_blocks - 1) * rows_per_block + block_size
    codes = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    tail = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=8, rank=2)
    plain = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)
    shape, strides = [rows, s_slot], [s_slot, 1]
    desc = TensorDescriptor(key_cache, shape, strides, [BOX_T, CH8.value], codes)
    kt_desc = TensorDescriptor(key_cache, shape, strides, [BOX_T, KT.value], tail)
    sc_desc = TensorDescriptor(key_cache, shape, strides, [BOX_T, SCB.value], plain)
    return desc, kt_desc, sc_desc, rows_per_block, s_head


def ws_split_int8(
    q: torch.Tensor,
    key_cache: torch.Tensor,
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
    num_segments: int,
    min_segment_tokens: int,
    out: torch.Tensor,
    sync: torch.Tensor,
    fuse: bool,
) -> None:
    """The split pass into the partials (qk_scale includes log2(e)); the reduce pass
    of spec_decode_attention.py turns them into the output, or with fuse the pass
    merges them into out itself (a cooperative launch: the caller has checked that
    every program fits at once, fusable_grid). sync: zeroed int32, two a (request,
    kv head), kept between launches. One query tile a request (max_query_len <=
    num_wg x wg_q); two consumer warpgroups rescale lazily (measured faster there
    from 16k, and the same at one)."""
    num_heads, head_size = q.shape[1], q.shape[2]
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    desc, kt_desc, sc_desc, rows_per_block, s_head = _descriptors(key_cache)
    grid = (seq_lens.shape[0], num_kv_heads, num_segments)
    _ws_split_int8_kernel[grid](
        part_out, part_max, part_sum, q, desc, kt_desc, sc_desc, block_table, seq_lens,
        cu_seqlens_q, qk_scale, min_segment_tokens, max_query_len, q.stride(0), q.stride(1),
        block_table.stride(0), rows_per_block, s_head, out, sync, out.stride(0),
        out.stride(1),
        NUM_HEADS=num_heads, G=num_heads // num_kv_heads, BLOCK_SIZE=block_size, WG_Q=wg_q,
        NUM_WG=num_wg, TILE_N=TILE_N, BOX_T=BOX_T, NUM_SEGMENTS=num_segments,
        STAGES=STAGES, HEAD=head_size, LAZY=num_wg == 2, FUSE=fuse,
        MERGE_LAYOUT=merge_layout(num_segments, head_size) if fuse else None,
        num_warps=4, maxnreg=MAXNREG, launch_cooperative_grid=fuse,
    )
