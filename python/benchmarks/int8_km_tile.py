"""What a q = 16 tile costs with the keys as the MMA's M (issue 21; session 35).

The int8 Hopper pass gives each 64 query rows a consumer warpgroup: Q.K and P.V take the
rows as the wgmma's M. At q = 16 and G = 6 that is 96 live rows padded to 128, two
warpgroups that each read the whole of K and of V, and a tile of 2.3-2.4 us (H100 and
H200) against the 60 % target's 0.86 us on the H200 (spec_decode_attn.md, "What q = 16's
targets would take"). With the keys as M instead nothing is padded:

- a scorer warpgroup runs Q.K as S^T = K . Q^T (K, int8 and K-major as TMA writes it, is
  the A operand; the query rows are N, split 64 + 32 since a Gluon tensor's shape is a
  power of two), the online softmax down the columns, and writes P^T and each column's
  rescale factor to shared memory, two buffers deep;
- two P.V warpgroups each own 128 of V's 256 columns: they widen their half of V into
  fp16 (scale applied), rescale their accumulator O^T = V^T . P^T (M = those columns,
  N = the rows) and run the P.V wgmma with V^T as a transposed fp16 A operand.

This file times that tile alone, with no loads: one CTA an SM, K and V resident in shared
memory, the same 64 keys run n_tiles times, so a CTA's time over n_tiles is the tile's
compute bound (the candidate's `--diagnose compute-only` measures the same for the present
layout, within its real kernel). The result is checked against float32 attention over the
dequantized 64 keys (a key repeated n times has the same softmax weight). The tile is
faithful where the cost is: two int8 Q.K terms over 288 columns (K's 32-byte tail k-step,
as the series reads it) and V's per-token scales applied as it is widened. It leaves out
what the real kernel adds around the tile: the loader, masks, V's 4- or 12-byte offset, the
partials. --softmax picks the scorer's form (MODES): exact reduces every column every tile
(P x 256 in fp16, the eager path's range); lazy moves a column's reference only past
RESCALE_LOG2 and the first P.V warpgroup sums P; pipe is lazy with the next tile's high
Q.K term under this tile's softmax; no-softmax is a diagnosis.

Measured on an H100 (session 35, spec_decode_attn.md, "The keys as the MMA's M"): a tile
takes 3.67 us exact, 2.08-2.09 lazy, 2.10 pipe and 1.91 with no softmax at all, against
2.20 for the present layout's compute-only tile in the same call: the MMAs and their
shared-memory operands, not the softmax, bound this layout near 1.9 us, twice the tensor
cores' own 0.9.

    python benchmarks/int8_km_tile.py --compile-only        # sm_90a, no GPU: regs, spills
    python benchmarks/int8_km_tile.py [--json OUT]          # an H100/H200: per-tile us, error
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# The candidate's exact fp16 widening (the series' too) and its partition barrier (Triton
# 3.9's name or 3.6's), imported from beside this file rather than copied.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from int8_ws_candidate import _partition_barrier, _widen

KEYS = gl.constexpr(64)     # a tile's keys: the M of Q.K
RA = gl.constexpr(64)       # query rows in the first N block
RB = gl.constexpr(32)       # and in the second: 96 = 16 tokens x 6 heads
CH8 = gl.constexpr(128)     # int8 columns a chunk (128-byte swizzle)
KT = gl.constexpr(32)       # K's tail k-step: the series' Q.K runs over 288 columns
DH = gl.constexpr(128)      # V columns a P.V warpgroup owns
P_SCALE = gl.constexpr(256.0)
# LAZY: how far (log2) a score may pass its column's reference maximum before the
# reference moves (P then stays below 2**8 in fp16, unscaled).
RESCALE_LOG2 = gl.constexpr(8.0)
PV_REGS = gl.constexpr(144)
MAXNREG = 168
V_LOAD_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0]))
LD_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0]))


@gluon.jit
def _qk_term(kb, q, qt, acc, ON: gl.constexpr = False):
    """One query term's S^T block, left running: K's two chunks and its tail k-step (the
    first KT columns of V's first chunk, as the series reads K's tail). ON (PIPE): added
    onto acc, the high term's codes x 256 (one int32 accumulator a block: |hi.K| x 256 +
    |lo.K| stays under 2**31 at 288 columns); otherwise acc only gives the layout."""
    acc = warpgroup_mma(kb.index(0), q.index(0).permute((1, 0)), acc, use_acc=ON,
                        is_async=True)
    acc = warpgroup_mma(kb.index(1), q.index(1).permute((1, 0)), acc, is_async=True)
    return warpgroup_mma(kb.index(2).slice(0, KT, 1), qt.permute((1, 0)), acc, is_async=True)


@gluon.jit
def _col_softmax(s, k_sc, q_sc, m_i, l_i):
    """One N block's online softmax down the columns (the keys are the rows here): the
    scores, the new column maxima, the rescale factor and P x P_SCALE."""
    x = s.to(gl.float32) * k_sc[:, None]
    m_new = gl.maximum(m_i, gl.max(x, axis=0) * q_sc)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(x * q_sc[None, :] - m_new[None, :])
    l_i = l_i * alpha + gl.sum(p, axis=0)
    return m_new, l_i, alpha, (p * P_SCALE).to(gl.float16)


@gluon.jit
def _lazy_scores(s, k_sc, q_sc, m_ref):
    """LAZY: one N block's scores (the int32 codes' sum, high term x 256 + low) in log2
    units against the columns' reference maxima (no reduction down the columns)."""
    x = s.to(gl.float32) * k_sc[:, None]
    return x * q_sc[None, :] - m_ref[None, :]


@gluon.jit
def _grown(d_a, d_b):
    """The largest score past its reference in both blocks: one scalar across the
    warpgroup (the two blocks' per-key maxima merged before the one reduction across
    warps), where the exact softmax reduces every column."""
    g_a = gl.max(d_a, axis=1)
    g_b = gl.convert_layout(gl.max(d_b, axis=1), g_a.type.layout)
    return gl.max(gl.maximum(g_a, g_b), axis=0)


@gluon.jit
def _rebase(d, m_ref, first):
    """LAZY, a reference outgrown: each column's reference moved up to its maximum, from
    the scores against the old one (no copy of the raw scores stays live), the factor the
    P.V accumulators and the sums take, and the scores against the new reference. On the
    first tile every column takes its own maximum (the references start at 0, not at a
    sentinel whose difference with a score would drop the score's bits) and the factor is
    1 (the accumulators are still zero)."""
    top = gl.max(d, axis=0)
    up = gl.where(first, top, gl.maximum(top, 0.0))
    return m_ref + up, gl.where(first, 1.0, gl.exp2(-up)), d - up[None, :]


@gluon.jit
def _scorer(kb, qha, qhat, qla, qlat, qhb, qhbt, qlb, qlbt, ksc_s, qsc_ptr, pa_s, pb_s,
            al_s, p_full, p_empty, m_ptr, l_ptr, n_tiles, LAZY: gl.constexpr,
            PIPE: gl.constexpr):
    """Q.K and the softmax of every tile; P^T and the rescale factors out to the P.V
    warpgroups through two buffers. LAZY: the reference maxima move only when a score
    passes them by RESCALE_LOG2, and the P.V warpgroup 0 sums P (so the scorer reduces
    nothing down its columns on most tiles). PIPE (with LAZY): one int32 accumulator a
    block (high term x 256, then the low term onto it), so that the next tile's high term
    runs on the tensor cores under this tile's softmax; the last tile issues one high
    term more than it needs (the same keys here)."""
    sa_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, RA, 32])
    sb_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, RB, 32])
    ca: gl.constexpr = gl.SliceLayout(0, sa_layout)
    cb: gl.constexpr = gl.SliceLayout(0, sb_layout)
    za = gl.zeros([KEYS, RA], gl.int32, layout=sa_layout)
    zb = gl.zeros([KEYS, RB], gl.int32, layout=sb_layout)
    k_sc_a = ksc_s.load(gl.SliceLayout(1, sa_layout))
    k_sc_b = ksc_s.load(gl.SliceLayout(1, sb_layout))
    q_sc_a = gl.load(qsc_ptr + gl.arange(0, RA, layout=ca))
    q_sc_b = gl.load(qsc_ptr + RA + gl.arange(0, RB, layout=cb))
    # Exact: a sentinel below every score; LAZY: 0, replaced on the first tile.
    m_a = gl.full([RA], 0.0 if LAZY else -1.0e30, gl.float32, layout=ca)
    m_b = gl.full([RB], 0.0 if LAZY else -1.0e30, gl.float32, layout=cb)
    l_a = gl.zeros([RA], gl.float32, layout=ca)
    l_b = gl.zeros([RB], gl.float32, layout=cb)
    if PIPE == 1:
        na = _qk_term(kb, qha, qhat, za)
        nb = _qk_term(kb, qhb, qhbt, zb)
        na, nb = warpgroup_mma_wait(num_outstanding=0, deps=(na, nb))
        na = _qk_term(kb, qla, qlat, na * 256, True)
        nb = _qk_term(kb, qlb, qlbt, nb * 256, True)
        sa, sb = warpgroup_mma_wait(num_outstanding=0, deps=(na, nb))
    else:
        sa = za
        sb = zb
    for t in range(n_tiles):
        b = t % 2
        if PIPE == 1:
            # The next tile's high term, under this tile's softmax (sa, sb: this tile's).
            na = _qk_term(kb, qha, qhat, za)
            nb = _qk_term(kb, qhb, qhbt, zb)
        else:
            ha = _qk_term(kb, qha, qhat, za)
            hb = _qk_term(kb, qhb, qhbt, zb)
            la = _qk_term(kb, qla, qlat, za)
            lb = _qk_term(kb, qlb, qlbt, zb)
            ha, hb, la, lb = warpgroup_mma_wait(num_outstanding=0, deps=(ha, hb, la, lb))
            sa = ha * 256 + la
            sb = hb * 256 + lb
        if LAZY:
            d_a = _lazy_scores(sa, k_sc_a, q_sc_a, m_a)
            d_b = _lazy_scores(sb, k_sc_b, q_sc_b, m_b)
            al_a = gl.full([RA], 1.0, gl.float32, layout=ca)
            al_b = gl.full([RB], 1.0, gl.float32, layout=cb)
            if PIPE == 2:
                p_a = d_a.to(gl.float16)
                p_b = d_b.to(gl.float16)
            else:
                if (_grown(d_a, d_b) > RESCALE_LOG2) | (t == 0):
                    m_a, al_a, d_a = _rebase(d_a, m_a, t == 0)
                    m_b, al_b, d_b = _rebase(d_b, m_b, t == 0)
                p_a = gl.exp2(d_a).to(gl.float16)
                p_b = gl.exp2(d_b).to(gl.float16)
        else:
            m_a, l_a, al_a, p_a = _col_softmax(sa, k_sc_a, q_sc_a, m_a, l_a)
            m_b, l_b, al_b, p_b = _col_softmax(sb, k_sc_b, q_sc_b, m_b, l_b)
        # Buffer b is free once both P.V warpgroups have read tile t - 2 from it.
        mbarrier.wait(p_empty.index(b), ((t // 2) & 1) ^ 1)
        pa_s.index(b).store(p_a)
        pb_s.index(b).store(p_b)
        al_s.index(b * 2).store(al_a)
        al_s.index(b * 2 + 1).slice(0, RB).store(al_b)
        fence_async_shared()
        _partition_barrier()
        mbarrier.arrive(p_full.index(b), count=1)
        if PIPE == 1:
            na, nb = warpgroup_mma_wait(num_outstanding=0, deps=(na, nb))
            na = _qk_term(kb, qla, qlat, na * 256, True)
            nb = _qk_term(kb, qlb, qlbt, nb * 256, True)
            sa, sb = warpgroup_mma_wait(num_outstanding=0, deps=(na, nb))
    gl.store(m_ptr + gl.program_id(0) * (RA + RB) + gl.arange(0, RA, layout=ca), m_a)
    gl.store(m_ptr + gl.program_id(0) * (RA + RB) + RA + gl.arange(0, RB, layout=cb), m_b)
    if not LAZY:
        gl.store(l_ptr + gl.program_id(0) * (RA + RB) + gl.arange(0, RA, layout=ca), l_a)
        gl.store(l_ptr + gl.program_id(0) * (RA + RB) + RA + gl.arange(0, RB, layout=cb), l_b)


@gluon.jit
def _pv(kb, vsc_s, vbf, pa_s, pb_s, al_s, p_full, p_empty, o_ptr, l_ptr, n_tiles,
        H: gl.constexpr, LAZY: gl.constexpr):
    """P.V warpgroup H: V's columns H x 128 .. + 128 of every tile, widened and scaled into
    its own fp16 tile (two deep), then O^T += V^T . P^T after the rescale. LAZY, H = 0:
    also the columns' sums of P, read back with the keys inside each thread."""
    # P^T's columns with most of their keys in one thread: 32 (16) keys a thread, 2 (4)
    # threads a column.
    sum_a: gl.constexpr = gl.BlockedLayout([32, 1], [2, 16], [1, 4], [0, 1])
    sum_b: gl.constexpr = gl.BlockedLayout([16, 1], [4, 8], [1, 4], [0, 1])
    l_a = gl.zeros([RA], gl.float32, layout=gl.SliceLayout(0, sum_a))
    l_b = gl.zeros([RB], gl.float32, layout=gl.SliceLayout(0, sum_b))
    oa_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, RA, 16])
    ob_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, RB, 16])
    oa = gl.zeros([DH, RA], gl.float32, layout=oa_layout)
    ob = gl.zeros([DH, RB], gl.float32, layout=ob_layout)
    v_sc = vsc_s.load(gl.SliceLayout(1, V_LOAD_LAYOUT)).to(gl.float16)[:, None]
    for t in range(n_tiles):
        b = t % 2
        v8 = kb.index(2 + H).load(V_LOAD_LAYOUT)
        vbf.index(b).store(_widen(v8, gl.float16) * v_sc)
        fence_async_shared()
        _partition_barrier()
        mbarrier.wait(p_full.index(b), (t // 2) & 1)
        al_a = al_s.index(b * 2).load(gl.SliceLayout(0, oa_layout))
        al_b = al_s.index(b * 2 + 1).slice(0, RB).load(gl.SliceLayout(0, ob_layout))
        oa = oa * al_a[None, :]
        ob = ob * al_b[None, :]
        if LAZY and H == 0:
            l_a = (l_a * al_s.index(b * 2).load(gl.SliceLayout(0, sum_a))
                   + gl.sum(pa_s.index(b).load(sum_a).to(gl.float32), axis=0))
            l_b = (l_b * al_s.index(b * 2 + 1).slice(0, RB).load(gl.SliceLayout(0, sum_b))
                   + gl.sum(pb_s.index(b).load(sum_b).to(gl.float32), axis=0))
        vt = vbf.index(b).permute((1, 0))
        oa = warpgroup_mma(vt, pa_s.index(b), oa, is_async=True)
        ob = warpgroup_mma(vt, pb_s.index(b), ob, is_async=True)
        oa, ob = warpgroup_mma_wait(num_outstanding=0, deps=(oa, ob))
        mbarrier.arrive(p_empty.index(b), count=1)
    base = o_ptr + gl.program_id(0) * (RA + RB) * 2 * DH + H * DH
    d_a = gl.arange(0, DH, layout=gl.SliceLayout(1, oa_layout))
    r_a = gl.arange(0, RA, layout=gl.SliceLayout(0, oa_layout))
    gl.store(base + r_a[None, :] * (2 * DH) + d_a[:, None], oa)
    d_b = gl.arange(0, DH, layout=gl.SliceLayout(1, ob_layout))
    r_b = gl.arange(0, RB, layout=gl.SliceLayout(0, ob_layout))
    gl.store(base + (RA + r_b[None, :]) * (2 * DH) + d_b[:, None], ob)
    if LAZY and H == 0:
        lb = l_ptr + gl.program_id(0) * (RA + RB)
        gl.store(lb + gl.arange(0, RA, layout=gl.SliceLayout(0, sum_a)), l_a)
        gl.store(lb + RA + gl.arange(0, RB, layout=gl.SliceLayout(0, sum_b)), l_b)


@gluon.jit
def _pv_first(kb, vsc_s, vbf, pa_s, pb_s, al_s, p_full, p_empty, o_ptr, l_ptr, n_tiles,
              LAZY: gl.constexpr):
    _pv(kb, vsc_s, vbf, pa_s, pb_s, al_s, p_full, p_empty, o_ptr, l_ptr, n_tiles, 0, LAZY)


@gluon.jit
def _pv_second(kb, vsc_s, vbf, pa_s, pb_s, al_s, p_full, p_empty, o_ptr, l_ptr, n_tiles,
               LAZY: gl.constexpr):
    _pv(kb, vsc_s, vbf, pa_s, pb_s, al_s, p_full, p_empty, o_ptr, l_ptr, n_tiles, 1, LAZY)


@gluon.jit
def _to_smem(ptr, rows: gl.constexpr, cols: gl.constexpr, stride, buf):
    r = gl.arange(0, rows, layout=gl.SliceLayout(1, LD_LAYOUT))
    c = gl.arange(0, cols, layout=gl.SliceLayout(0, LD_LAYOUT))
    buf.store(gl.load(ptr + r[:, None] * stride + c[None, :]))


@gluon.jit
def _km_tile_kernel(qh_ptr, ql_ptr, qsc_ptr, kv_ptr, ksc_ptr, vsc_ptr, o_ptr, m_ptr, l_ptr,
                    n_tiles, LAZY: gl.constexpr, PIPE: gl.constexpr):
    """One CTA: 96 query rows (two int8 terms, [96, 288] each) against one tile of 64 keys
    (the stage's four 128-byte chunks K0 K1 V0 V1, [64, 512] int8) n_tiles times."""
    codes: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8,
                                               rank=2)
    tail: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=8,
                                              rank=2)
    f16_128: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                                 rank=2)
    f16_64: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16,
                                                rank=2)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    kb = gl.allocate_shared_memory(gl.int8, [4, KEYS, CH8], codes)
    qha = gl.allocate_shared_memory(gl.int8, [2, RA, CH8], codes)
    qla = gl.allocate_shared_memory(gl.int8, [2, RA, CH8], codes)
    qhb = gl.allocate_shared_memory(gl.int8, [2, RB, CH8], codes)
    qlb = gl.allocate_shared_memory(gl.int8, [2, RB, CH8], codes)
    qhat = gl.allocate_shared_memory(gl.int8, [RA, KT], tail)
    qlat = gl.allocate_shared_memory(gl.int8, [RA, KT], tail)
    qhbt = gl.allocate_shared_memory(gl.int8, [RB, KT], tail)
    qlbt = gl.allocate_shared_memory(gl.int8, [RB, KT], tail)
    ksc_s = gl.allocate_shared_memory(gl.float32, [KEYS], flat)
    vsc_s = gl.allocate_shared_memory(gl.float32, [KEYS], flat)
    vbf0 = gl.allocate_shared_memory(gl.float16, [2, KEYS, DH], f16_128)
    vbf1 = gl.allocate_shared_memory(gl.float16, [2, KEYS, DH], f16_128)
    pa_s = gl.allocate_shared_memory(gl.float16, [2, KEYS, RA], f16_128)
    pb_s = gl.allocate_shared_memory(gl.float16, [2, KEYS, RB], f16_64)
    al_s = gl.allocate_shared_memory(gl.float32, [4, RA], gl.SwizzledSharedLayout(1, 1, 1,
                                                                                  [0]))
    p_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    p_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(p_full.index(i), count=1)
        mbarrier.init(p_empty.index(i), count=2)
    for c in gl.static_range(4):
        _to_smem(kv_ptr + c * CH8, KEYS, CH8, 4 * CH8, kb.index(c))
    for c in gl.static_range(2):
        _to_smem(qh_ptr + c * CH8, RA, CH8, 2 * CH8 + KT, qha.index(c))
        _to_smem(ql_ptr + c * CH8, RA, CH8, 2 * CH8 + KT, qla.index(c))
        _to_smem(qh_ptr + RA * (2 * CH8 + KT) + c * CH8, RB, CH8, 2 * CH8 + KT, qhb.index(c))
        _to_smem(ql_ptr + RA * (2 * CH8 + KT) + c * CH8, RB, CH8, 2 * CH8 + KT, qlb.index(c))
    _to_smem(qh_ptr + 2 * CH8, RA, KT, 2 * CH8 + KT, qhat)
    _to_smem(ql_ptr + 2 * CH8, RA, KT, 2 * CH8 + KT, qlat)
    _to_smem(qh_ptr + RA * (2 * CH8 + KT) + 2 * CH8, RB, KT, 2 * CH8 + KT, qhbt)
    _to_smem(ql_ptr + RA * (2 * CH8 + KT) + 2 * CH8, RB, KT, 2 * CH8 + KT, qlbt)
    k1: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    ksc_s.store(gl.load(ksc_ptr + gl.arange(0, KEYS, layout=k1)))
    vsc_s.store(gl.load(vsc_ptr + gl.arange(0, KEYS, layout=k1)))
    fence_async_shared()
    _partition_barrier()
    # The scorer is the default partition: it keeps the registers the P.V warpgroups
    # leave (512 - 2 x PV_REGS a thread).
    gl.warp_specialize([
        (_scorer, (kb, qha, qhat, qla, qlat, qhb, qhbt, qlb, qlbt, ksc_s, qsc_ptr, pa_s, pb_s,
                   al_s, p_full, p_empty, m_ptr, l_ptr, n_tiles, LAZY, PIPE)),
        (_pv_first, (kb, vsc_s, vbf0, pa_s, pb_s, al_s, p_full, p_empty, o_ptr, l_ptr,
                     n_tiles, LAZY)),
        (_pv_second, (kb, vsc_s, vbf1, pa_s, pb_s, al_s, p_full, p_empty, o_ptr, l_ptr,
                      n_tiles, LAZY)),
    ], [4, 4], [PV_REGS, PV_REGS])


# --softmax: the kernel's (LAZY, PIPE). "no-softmax" (a diagnosis; its output is wrong by
# design): lazy, with the maximum's check and the exponent left out, P the scores in fp16.
MODES = {"exact": (False, False), "lazy": (True, False), "pipe": (True, True),
         "no-softmax": (True, 2)}


def compile_sm90(mode: str) -> Any:
    """The kernel compiled ahead of time for sm_90a (no GPU)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = _km_tile_kernel
    signature = {name: ("i32" if name == "n_tiles" else
                        "constexpr" if name in ("LAZY", "PIPE") else
                        "*i8" if name in ("qh_ptr", "ql_ptr", "kv_ptr") else "*fp32")
                 for name in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name.endswith("_ptr")}
    lazy, pipe = MODES[mode]
    constexprs = {(fn.arg_names.index("LAZY"),): lazy, (fn.arg_names.index("PIPE"),): pipe}
    source = GluonASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "maxnreg": MAXNREG})


def compile_report(mode: str) -> dict[str, Any]:
    """Shared memory, spills and each MMA loop's instructions a warp, from the SASS (the
    cuobjdump Triton ships)."""
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from split_pass_issue import sass_of

    from tests.support.sass_loops import mma_loops, parse_sass

    k = compile_sm90(mode)
    with tempfile.TemporaryDirectory() as tmp:
        sass = sass_of(k.asm["cubin"], Path(tmp))
    code = parse_sass(sass)
    return {"softmax": mode, "shared": k.metadata.shared,
            "stack_stores": sum(1 for ins in code if ins.text.startswith("STL")),
            "stack_loads": sum(1 for ins in code if ins.text.startswith("LDL")),
            "mma_loops": [{"instructions": lp.instructions, "mma": lp.mma,
                           "barriers": lp.opcodes["BAR"], "stack": lp.opcodes["STL"]
                           + lp.opcodes["LDL"]} for lp in mma_loops(sass)]}


def _operands(torch: Any, gen: Any, device: str) -> dict[str, Any]:
    """Random operands in the cache's and the series' forms: the query in two int8 terms a
    row over 288 columns (the last 32 zero, as K's tail bytes meet zeros in the series),
    K's and V's codes with a float scale a token, and the dequantized float32 tensors."""
    rows = int(RA) + int(RB)
    q = torch.randn(rows, 256, generator=gen, device=device)
    amax = q.abs().amax(dim=1, keepdim=True)
    x = q * 127.0 / amax
    hi = torch.round(x)
    lo = torch.round((x - hi) * 256.0).clamp(-127, 127)
    qh = torch.zeros(rows, 288, dtype=torch.int8, device=device)
    ql = torch.zeros(rows, 288, dtype=torch.int8, device=device)
    qh[:, :256] = hi.to(torch.int8)
    ql[:, :256] = lo.to(torch.int8)
    q_deq = (hi + lo / 256.0) * amax / 127.0
    kv = torch.randint(-127, 128, (64, 512), generator=gen, device=device, dtype=torch.int32)
    kv = kv.to(torch.int8)
    # K's tail k-step reads the first 32 bytes of V's first chunk: zeros in the query there.
    k_sc = torch.rand(64, generator=gen, device=device) * 0.02 + 0.01
    v_sc = torch.rand(64, generator=gen, device=device) * 0.02 + 0.01
    k = kv[:, :256].float() * k_sc[:, None]
    v = kv[:, 256:].float() * v_sc[:, None]
    sm = 256 ** -0.5
    q_sc = (amax[:, 0] / 127.0 / 256.0) * sm * 1.4426950408889634
    ref = torch.softmax((q_deq @ k.T) * sm, dim=1) @ v
    return {"qh": qh, "ql": ql, "q_sc": q_sc.contiguous(), "kv": kv.contiguous(),
            "k_sc": k_sc, "v_sc": v_sc, "ref": ref}


def device_run(tiles: list[int], modes: list[str], out: Path | None) -> int:
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("needs an sm_90 GPU (H100/H200)", file=sys.stderr)
        return 2
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(35)
    ops = _operands(torch, gen, dev)
    ctas = torch.cuda.get_device_properties(0).multi_processor_count
    o = torch.zeros(ctas, 96, 256, device=dev)
    m = torch.zeros(ctas, 96, device=dev)
    l_ = torch.zeros(ctas, 96, device=dev)
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "ctas": ctas, "modes": {}}
    for mode in modes:
        lazy, pipe = MODES[mode]

        def launch(n: int, lazy: bool = lazy, pipe: int = pipe) -> None:
            _km_tile_kernel[(ctas,)](ops["qh"], ops["ql"], ops["q_sc"], ops["kv"],
                                     ops["k_sc"], ops["v_sc"], o, m, l_, n, LAZY=lazy,
                                     PIPE=pipe, num_warps=4, maxnreg=MAXNREG)

        runs: dict[str, Any] = {}
        for n in tiles:
            o.zero_()
            l_.zero_()
            launch(n)
            torch.cuda.synchronize()
            # O^T holds P x P_SCALE (x 1 when lazy); l is P's plain sum.
            got = o / (l_[:, :, None] * (1.0 if lazy else float(P_SCALE.value)))
            err = float((got - ops["ref"][None]).norm() / (ops["ref"].norm() * ctas ** 0.5))
            cuda: Any = torch.cuda  # its Event is untyped
            start = cuda.Event(enable_timing=True)
            end = cuda.Event(enable_timing=True)
            times = []
            for _ in range(7):
                start.record()
                launch(n)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) * 1e3)
            times.sort()
            runs[str(n)] = {"us": times[3], "rel_err": err}
            print(f"{mode} n_tiles {n}: {times[3]:.2f} us a launch, rel err {err:.3e}",
                  flush=True)
        row: dict[str, Any] = {"runs": runs}
        if len(tiles) >= 2:
            lo_n, hi_n = min(tiles), max(tiles)
            row["us_a_tile"] = (runs[str(hi_n)]["us"] - runs[str(lo_n)]["us"]) / (hi_n - lo_n)
            print(f"{mode}: a tile (slope {lo_n} to {hi_n} tiles) {row['us_a_tile']:.3f} us",
                  flush=True)
        result["modes"][mode] = row
    if out:
        out.write_text(json.dumps(result, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compile-only", action="store_true",
                        help="compile for sm_90a and print spills, shared memory, MMA loops")
    parser.add_argument("--tiles", default="32,64,128",
                        help="comma-separated tile counts a CTA runs (the slope is a tile)")
    parser.add_argument("--softmax", default="exact,lazy,pipe",
                        help="comma-separated: exact (every column reduced every tile), lazy "
                        "(a reference maximum moved only past RESCALE_LOG2), pipe (lazy, the "
                        "next tile's high Q.K term under this tile's softmax), no-softmax (a "
                        "diagnosis: lazy without the maximum's check and the exponent; wrong "
                        "output)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    modes = [m for m in args.softmax.split(",") if m]
    if any(m not in MODES for m in modes):
        parser.error(f"--softmax takes {', '.join(MODES)}, got {args.softmax!r}")
    if args.compile_only:
        reports = [compile_report(m) for m in modes]
        for report in reports:
            print(json.dumps(report))
        if args.json:
            args.json.write_text(json.dumps(reports, indent=1))
        return 0
    return device_run([int(t) for t in args.tiles.split(",") if t], modes, args.json)


if __name__ == "__main__":
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    sys.exit(main())
