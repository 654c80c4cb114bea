"""Candidate for issue 21: the split pass over TRITON_ATTN's int8_per_token_head cache as a
warp-specialised Hopper (sm_90) kernel in Gluon. Its default configuration (two Q.K terms, an
fp16 V tile; eager with the widener at one consumer warpgroup, lazy and the query quantized
in 4 row chunks at two) is in the patch series as
vllm/v1/attention/ops/spec_decode_attention_hopper_int8.py (session 22), which compiles to
this file's SASS (a patch-tier test holds that). This file stays the workbench:
its options and diagnoses try changes without touching the series or its GPU records.

Why this shape (spec_decode_attn.md, "What a tile costs in instructions"): the Triton int8
split pass issues 160 warp instructions a KV token at q = 8 and would need an IPC of 3.0 to
reach 60 % of the int8 floor at 64k; the H200 runs such kernels at about 1.4. Here:

- one loader warp copies each 64-key tile with TMA. A box must start on a 16-byte boundary
  (H200, 2026-12-04: a box 4, 8 or 12 bytes past one faults with "illegal instruction"),
  and a head's K starts 0 or 8 bytes past one, its V 4 or 12. So every box starts at the
  boundary below: V as two 128-byte chunks and a 16-byte tail that also holds V's scale, and
  K as two 128-byte chunks whose 32-byte tail and scale are read from V's first chunk (the
  boundary below V is 256 bytes past K's: 5 boxes a block). No consumer thread computes a
  copy address.
- the shift is paid where it is free: the query is shifted by K's offset (zeros under the
  neighbouring bytes, so they add nothing to Q.K), and the accumulators hold V's column d
  at d + V's offset, which the epilogue shifts back.
- the consumer warpgroup (q <= 8 tokens x G heads in 64 rows) runs Q.K on the int8 wgmma:
  the query is quantized per row once (INT8_QK = 2: two terms, as the Triton pass's
  int8_qk=2), K is used as TMA wrote it (8-bit wgmma operands must be K-major, and K's rows
  are); a score is scaled by the key's scale, and the query row's scale (with qk_scale) is
  one factor a row inside the exponent's FFMA.
- V's rows are not K-major for P.V, so V is widened once per tile into a bf16 tile in shared
  memory (int8 codes are exact in bf16) and its per-token scale is folded into P's columns,
  as the Triton pass does. With one warpgroup of rows a widener warpgroup of its own does
  it, into one of two 16-bit tiles (WIDEN_WG), so the consumer's warps issue only Q.K, the
  softmax and P.V.
- q x G over 64 rows (q = 16 at G = 6) takes two consumer warpgroups over the same tiles,
  the tokens split evenly; each widens half of V for both (an mbarrier a stage says both
  halves are there), so the widening is not paid twice.
- each warpgroup runs whole tiles in a loop with no mask and the tiles that need one in a
  second loop, so the first loop's compiled size is what a steady tile issues.
- one warpgroup stores its partials a row a warp, through a layout conversion (EPI_ROWS):
  from the accumulator's layout they used a quarter of each sector and cost about 8 us a
  call on the H200.
- LAZY (optional) rescales the accumulator only when a row's maximum passes its reference by
  more than RESCALE_LOG2, instead of on every tile.
- V16 = fp16 (optional) widens V by the 1024 bias in 5 instructions for 4 codes and runs P.V
  in fp16; P x V-scale then lives in fp16's range (see _p_scale). On the H200 its error
  was below the bf16 tile's (1.7e-3 against 2.3e-3: fp16 keeps 3 more bits of P).

Checked and timed on an H200 (spec_decode_attn.md, "The candidate on an H200", "Read from
the hardware counters" and "A widener warpgroup"): every KV head within stock's error (the
fp16 V tile below it); at q = 8, two terms, fp16 V, about 1.7 / 2.0 / 2.1x the production
int8 plan and 31 / 52 / 59 % of the int8 floor at 16k / 64k / 128k (targets 40 and 60 %);
at q = 16 (two terms, lazy) 1.5-1.7x from 64k, 1.0x at 16k. What bounds it (sessions
18-20, --diagnose and ncu): the consumer warpgroup, which waits on its own wgmmas for about
a third of its loop's samples; alone it takes nearly the whole time, the loader alone
reaches 68 % of the floor at 64k and 80 % at 128k, and about 14 us of a call do not grow
with the context. A second consumer warpgroup (--pingpong, either --pingpong-roles) adds
no throughput, and no order of one consumer's steps measured so far beat the plain one
(--overlap; session 20's pipelined P.V, early scale reads and a widener that holds its
codes: commit 22a5271). The block table read ahead (--block-table ahead) changes the time
by 2 % or less; 32-key tiles (--tile-n 32) are correct and slower, as the launch's
registers allow one CTA an SM. --v-load wide, --epilogue accumulator, --k-tail box,
--v-widen consumer and --shift-hints off give back earlier sessions' V loads, stores,
boxes, widening and 2- and 4-byte query loads and partial stores.
--epilogue smem (session 21; compiled, not run) frees the conversion's scratch for a third
stage (--stages 3) or, with --tile-n 32 --segments 64 --maxnreg 128 --v-widen consumer,
for a second CTA an SM (spec_decode_attn.md, "Prepared for the next call"). Q.K on the
fp16 wgmma over a widened K was slower from 64k on an H200 (session 21, same doc).
Session 27 (same doc, "Where a tile's time goes"): --diagnose no-widen and no-qk split a
tile's time by parts (at q = 16 even no Q.K at all leaves the call at 41-50 % of the floor
from 64k); V widened beside Q.K at q = 16 (--widen-at), float16 partials (--partials) and
one wait for both Q.K terms (--qk-wait once) measured no gain and stay off.
Session 30 (same doc, "P.V in a warpgroup of its own"): --pv-wg gives P.V and the
accumulators' rescale a warpgroup of their own, and --pv-pipe also issues the next tile's
Q.K before this tile's softmax. Both are correct and slower: the softmax's own chain bounds
the consumer, and --pv-pipe holds both stages at once.

Its online softmax, epilogue and compile signature repeat the series' Hopper modules and the
compile report's on purpose: the candidate compiles without a patched tree.

    python benchmarks/int8_ws_candidate.py --compile-only [--queries 8,16] [--json OUT]
    python benchmarks/int8_ws_candidate.py --tree DIR [--json OUT]   # an H200: errors, times
    python benchmarks/int8_ws_candidate.py --probe-column N          # an H200: one TMA box

Both take --int8-qk 1,2, --lazy 0,1 and --v-tile bf16,fp16 (every combination is compiled,
or checked and timed).
"""

from __future__ import annotations

import argparse
import copy
import functools
import hashlib
import importlib
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
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

HERE = Path(__file__).resolve().parent
PYTHON_DIR = HERE.parent

# Triton 3.9 renamed the TMA load; 3.6 and 3.7 have only the old name.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

WG_ROWS = gl.constexpr(64)
CH8 = gl.constexpr(128)  # int8 columns a chunk: 128 bytes, the widest swizzle
SCB = gl.constexpr(16)  # bytes of a scale box, and of V's tail box (its scale inside)
KT = gl.constexpr(32)  # bytes of K's tail box: one int8 k-step of the Q.K wgmma
# Registers a thread over the launch (12 warps with the widener: 384 x 168 fits the SM's
# 65,536), and the loader warp's share after setmaxnreg.
MAXNREG = 168
LOADER_REGS = gl.constexpr(24)
# The second consumer warpgroup's registers (a worker partition), as the bf16 Gluon pass gives.
CONSUMER_REGS = gl.constexpr(240)
TILE_N = 64  # keys a tile (--tile-n 32: 89 KiB a CTA on 2 stages; still one CTA an SM)
# With the lazy rescale: how far (log2) a row's maximum may pass its reference before the
# accumulator is rescaled.
RESCALE_LOG2 = gl.constexpr(8.0)
# Warp instructions a KV token the consumer's loop may cost: at the IPC the H200 ran the split
# passes at (about 1.4), 60 % of the int8 floor at 64k-128k allows about 74
# (spec_decode_attn.md, "What a tile costs in instructions").
BUDGET_WARP_INSTS_PER_TOKEN = 74
BOX_T = 16  # tokens a TMA box: one cache block of 16 (the benchmark's block size)
# The dtype V is widened into for the P.V MMA: bf16 (Triton's conversion) or fp16 (the 1024
# bias, fewer instructions; P then travels in fp16 too).
V_TILES = {"bf16": gl.bfloat16, "fp16": gl.float16}


@gluon.jit
def _loader8(desc, kt_desc, sc_desc, bufs, kt_bufs, sc_bufs, ready, empty, bt_row_ptr, kv_lo,
             kv_hi, n_tiles, rows_per_block, a_k, a_v, BLOCK_SIZE: gl.constexpr,
             TILE_N: gl.constexpr, BOX_T: gl.constexpr, HEAD: gl.constexpr,
             STAGES: gl.constexpr):
    """One warp: each tile's codes and scales, STAGES tiles ahead of the consumer, one box of
    BOX_T tokens (one cache block) at a time. Every box starts on a 16-byte boundary (TMA
    faults on any other, H200, 2026-12-04), at a_k and a_v, the boundaries at or below a
    head's K and V: K as two 128-byte chunks and a 32-byte tail, V as two 128-byte chunks and
    a 16-byte tail that also holds V's scale, and a 16-byte box that holds K's scale. With
    KT_FROM_V K's tail and scale are read from V's first chunk instead: 5 boxes, not 7."""
    if BT_AHEAD:
        # A tile's block-table entries loaded two tiles ahead, so no box waits for a global
        # load (read just before each box, the four loads of a tile run in series). On the
        # H200 it changed nothing (2026-12-04): the consumer bounds a tile, not the loader.
        bt_layout: gl.constexpr = gl.BlockedLayout([TILE_N // BOX_T], [32], [1], [0])
        jj = gl.arange(0, TILE_N // BOX_T, layout=bt_layout)
        blk0 = _tile_blocks(bt_row_ptr, kv_lo, kv_hi, 0, jj, TILE_N, BOX_T, BLOCK_SIZE)
        blk1 = _tile_blocks(bt_row_ptr, kv_lo, kv_hi, 1, jj, TILE_N, BOX_T, BLOCK_SIZE)
    else:
        jj = 0
        blk0 = 0
    for i in range(n_tiles):
        s = i % STAGES
        if BT_AHEAD:
            blk2 = _tile_blocks(bt_row_ptr, kv_lo, kv_hi, i + 2, jj, TILE_N, BOX_T,
                                BLOCK_SIZE)
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        start = kv_lo + i * TILE_N
        if DIAG >= 2:
            # Diagnosis (--diagnose compute-only, handshake-only): the first STAGES tiles are
            # loaded, then every stage is handed back as it is (stale tiles).
            if i < STAGES:
                _load_tile8(desc, kt_desc, sc_desc, bufs, kt_bufs, sc_bufs, ready, s, start,
                            kv_hi, blk0, jj, bt_row_ptr, rows_per_block, a_k, a_v,
                            BLOCK_SIZE, TILE_N, BOX_T, HEAD)
            else:
                mbarrier.arrive(ready.index(s), count=1)
        else:
            _load_tile8(desc, kt_desc, sc_desc, bufs, kt_bufs, sc_bufs, ready, s, start, kv_hi,
                        blk0, jj, bt_row_ptr, rows_per_block, a_k, a_v, BLOCK_SIZE, TILE_N,
                        BOX_T, HEAD)
        if BT_AHEAD:
            blk0 = blk1
            blk1 = blk2


@gluon.jit
def _load_tile8(desc, kt_desc, sc_desc, bufs, kt_bufs, sc_bufs, ready, s, start, kv_hi, blk0,
                jj, bt_row_ptr, rows_per_block, a_k, a_v, BLOCK_SIZE: gl.constexpr,
                TILE_N: gl.constexpr, BOX_T: gl.constexpr, HEAD: gl.constexpr):
    """One tile's boxes into stage s, BOX_T tokens (one cache block) at a time; blk0 holds
    the tile's block-table entries when BT_AHEAD, else each is read before its box."""
    if KT_FROM_V:
        mbarrier.expect(ready.index(s), TILE_N * (4 * CH8 + SCB))
    else:
        mbarrier.expect(ready.index(s), TILE_N * (4 * CH8 + KT + 2 * SCB))
    for j in gl.static_range(TILE_N // BOX_T):
        tok = start + j * BOX_T
        if BT_AHEAD:
            blk = gl.sum(gl.where(jj == j, blk0, 0), axis=0)
        else:
            blk = gl.load(bt_row_ptr + tok // BLOCK_SIZE, mask=tok < kv_hi, other=0)
        row = blk * rows_per_block + tok % BLOCK_SIZE
        for c in gl.static_range(2):
            _tma_load(desc, [row, a_k + c * CH8], ready.index(s),
                      bufs.index(s * 4 + c).slice(j * BOX_T, BOX_T))
            _tma_load(desc, [row, a_v + c * CH8], ready.index(s),
                      bufs.index(s * 4 + 2 + c).slice(j * BOX_T, BOX_T))
        if not KT_FROM_V:
            _tma_load(kt_desc, [row, a_k + HEAD], ready.index(s),
                      kt_bufs.index(s).slice(j * BOX_T, BOX_T))
            _tma_load(sc_desc, [row, a_k + HEAD], ready.index(s),
                      sc_bufs.index(s * 2).slice(j * BOX_T, BOX_T))
        _tma_load(sc_desc, [row, a_v + HEAD], ready.index(s),
                  sc_bufs.index(s * 2 + 1).slice(j * BOX_T, BOX_T))


@gluon.jit
def _tile_blocks(bt_row_ptr, kv_lo, kv_hi, i, jj, TILE_N: gl.constexpr, BOX_T: gl.constexpr,
                 BLOCK_SIZE: gl.constexpr):
    """Tile i's block-table entries, one a box (block 0 past the segment's end: always
    allocated, and its keys are masked)."""
    tok = kv_lo + i * TILE_N + jj * BOX_T
    return gl.load(bt_row_ptr + tok // BLOCK_SIZE, mask=tok < kv_hi, other=0)


@gluon.jit
def _low8(y):
    """The int8 code held in the low byte of y = n + 1.5 * 2**23 (n an integer of
    |n| <= 127; 0x4B400000's low byte is zero)."""
    return y.to(gl.int32, bitcast=True).to(gl.int8)


@gluon.jit
def _rows8(x):
    """float32 (|x| <= 128) to int8 codes, half up, clamped to +-127 (the Triton pass's
    _int8_rows)."""
    return gl.minimum(gl.maximum(gl.floor(x + 0.5), -127.0), 127.0).to(gl.int8)


@gluon.jit
def _low_term(x, r):
    """The low int8 term of x (|x| <= 127) whose high term's code is r (as a float), magic
    rounding: 256 x the remainder, rounded as the high term is. The clamp keeps a tie's 128
    a code."""
    return _low8(gl.minimum(gl.maximum((x - r) * 256.0, -127.0), 127.0) + 12582912.0)


@gluon.jit
def _scale_column(x, at, layout: gl.constexpr, sc_layout: gl.constexpr):
    """Column ``at`` of a [TILE_N, 4] float32 tile: the scale, 4 x at bytes into each row's
    16-byte box. With the "direct" read each thread holds whole rows: the columns are split
    out in registers and one select a row picks among the two of at's parity (a K scale
    sits in column 0 or 2, a V scale in 1 or 3)."""
    if SCALE_DIRECT:
        even, odd = gl.split(gl.reshape(x, [x.shape[0], 2, 2]))
        c0, c2 = gl.split(even)
        c1, c3 = gl.split(odd)
        lo = gl.where((at & 1) == 1, c1, c0)
        hi = gl.where((at & 1) == 1, c3, c2)
        return gl.convert_layout(gl.where(at >= 2, hi, lo), layout)
    else:
        col = gl.arange(0, 4, layout=gl.SliceLayout(0, sc_layout))
        return gl.convert_layout(gl.sum(gl.where(col[None, :] == at, x, 0.0), axis=1), layout)


# How a tile's scale box is read. "convert": each row once over the warpgroup, then a layout
# conversion through shared memory to the score columns (two barriers a vector). "direct":
# each thread reads the rows of the score columns it holds in the int8 wgmma's accumulator
# (lane l: columns 2 (l % 4) + 8 j and the next, in every warp), no conversion and no
# barrier, but every thread selects the scale among 4 floats of 16 rows. One a process
# (--scale-load): the kernels read it when they compile.
SCALE_LOADS = {"convert": gl.BlockedLayout([1, 4], [32, 1], [4, 1], [1, 0]),
               "direct": gl.BlockedLayout([2, 4], [4, 8], [1, 4], [0, 1])}
SCALE_LOAD_LAYOUT = gl.constexpr(SCALE_LOADS["convert"])
SCALE_DIRECT = gl.constexpr(False)
DIAGNOSES = {"none": 0, "load-only": 1, "compute-only": 2, "handshake-only": 3,
             "no-store": 4, "no-query-load": 5, "no-widen": 6, "no-qk": 7}
# --pingpong (host side only: the kernel takes it as PP).
PINGPONG = False
# --pingpong-roles loader-default: the loader is the kernel's default partition (4 warps, the
# registers left over) and both consumer warpgroups are workers with CONSUMER_REGS each. With
# warpgroup 0 as the default partition instead, it gets 120 registers and spills (session 17).
PP_LOADER_DEFAULT = gl.constexpr(False)
# How a thread holds V's codes as it widens them (--v-load). "wide": 16 codes of a row, one
# 16-byte load, 8 threads a row. Its 16-bit stores conflict 2-way (ncu, H200, session 19: 8
# wavefronts a store where 4 would do): the 16-bit tile is two 64-column halves, and threads
# 4 apart write the same swizzled 16-byte chunk of each. "narrow" (the default since session
# 19, 5-7 % faster at 64k-128k): 8 codes, an 8-byte load (twice as many), 16 threads a row,
# and the 8 threads of each store phase on 8 different chunks.
V_LOADS = {"wide": gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0]),
           "narrow": gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])}
V_LOAD_LAYOUT = gl.constexpr(V_LOADS["narrow"])
# --epilogue rows: the partials stored a row a warp (through shared memory), not as the
# accumulator's layout has them; one warpgroup without ping-pong or --overlap only.
EPI_ROWS = gl.constexpr(True)
# --epilogue smem (session 21; compiled, not run): the same rows, converted through buffers
# the loop no longer needs rather than the compiler's 32 KiB of scratch, so that a third
# stage fits (with the widener) or a 32-key-tile CTA fits twice in an SM (without it).
EPI_SMEM = gl.constexpr(False)
# --overlap (host side only: the kernel takes it as OV).
OVERLAP = False
# --v-widen warpgroup (the default since session 20): V is widened by a worker partition of
# its own (4 warps) into one of two 16-bit tiles, not by the consumer. ncu put about 28 % of
# the consumer loop's samples on the widening (session 19), with one consumer warp a
# scheduler; a second warp a scheduler that only widens takes that work off the consumer's
# path, and the consumer no longer spills (ptxas: 240 bytes before, none after). H200: 7 / 11
# / 12 % faster at 16k / 64k / 128k. One warpgroup of rows without --pingpong or --overlap;
# elsewhere the consumers widen. Its registers after setmaxnreg:
WIDEN_WG = gl.constexpr(True)
WIDENER_REGS = gl.constexpr(64)
# --shift-hints off: the consumer does not tell the compiler that k_at and v_at are multiples
# of 8 and 4 (its query loads and partial stores then compile to 2- and 4-byte accesses).
VEC_SHIFTS = gl.constexpr(True)


# A shared memory view as float32: Triton 3.9 renamed the view's _reinterpret to reinterpret,
# so the one this Triton has is compiled in.
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
def _scales(sc_bufs, idx, at, TILE_N: gl.constexpr, layout: gl.constexpr):
    """The scales of a [TILE_N, 16]-byte scale box, column ``at`` as float32."""
    sc_layout: gl.constexpr = SCALE_LOAD_LAYOUT
    f32_smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32,
                                                  rank=2)
    x = _f32_view(sc_bufs.index(idx), TILE_N, 4, f32_smem).load(sc_layout)
    return _scale_column(x, at, layout, sc_layout)

# Where K's 32-byte tail and K's scale are read from. A head's K and V are contiguous in the
# row ([K | K scale | V | V scale], 520 bytes), and the 16-byte boundary at or below V's first
# code is 256 bytes past the one below K's: so V's first 128-byte chunk starts with K's tail
# and scale, and the head is 4 chunks and a 16-byte tail (5 boxes). False loads them as boxes
# of their own (7 boxes a block). One a process (--k-tail); the kernels read it as they compile.
# On the H200 (2026-12-04) 5 boxes took the time 7 did while the consumer bounded a tile
# (session 18); with the widener warpgroup 5 are 1-2 % faster, and the default (session 20).
KT_FROM_V = gl.constexpr(True)
# The loader reads each tile's block-table entries as one vector two tiles ahead (True) or
# each just before its box (False). One a process (--block-table).
BT_AHEAD = gl.constexpr(False)
# Diagnosis only (--diagnose): 0 runs the kernel; 1 (load-only) the consumer takes each tile
# and hands it back without arithmetic; 2 (compute-only) the loader loads the first STAGES
# tiles and then hands stages back unloaded; 3 (handshake-only) both: what is left is the
# launch, the query's quantization, the barriers and the partials' stores. All give wrong
# outputs; their times say which side bounds a tile.
DIAG = gl.constexpr(0)
# How the query's codes are rounded (--q-round). "magic" (the default since session 25): by
# adding 1.5 * 2**23, so that the FP32 pipe rounds to the nearest integer (ties to even) and
# leaves the code in the low byte. "floor": floor(x + 0.5) and float<->int conversions, as
# the Triton pass does; those run on the conversion unit, 16 lanes a clock an SM (about 570
# a consumer thread at q = 8). Side by side on an H100 (session 25) magic took 1.4-2.4 µs
# off a call at q = 8 and 2.3-8.7 µs at q = 16, with the same error.
Q_MAGIC = gl.constexpr(True)
# --q-chunks N (session 26): with two consumer warpgroups (q = 16), each quantizes its query
# rows N row chunks at a time in a runtime loop, not all 64 rows in one straight run. ncu on
# an H100 (q = 16, 64k) put a quarter to a third of each consumer warpgroup's samples in code
# that runs once a program, most of them stalled on instruction fetch (the straight run is
# about 2,400 instructions a warpgroup, cold in the instruction cache) or on the load/store
# queue. The loop runs one chunk's code N times; each chunk's row maxima go through shared
# memory. Side by side on the H100, N = 4 took 2.0 / 6.8 / 8.1 / 3.6 us off a call at 2k /
# 16k / 64k / 128k, same error: the default. --q-chunks-one does the same with one
# warpgroup (q <= 8), where it was 1.3-2.6 us slower (the default there is 1, the straight
# run). Magic rounding only; ping-pong keeps the straight run.
Q_CHUNKS = gl.constexpr(4)
Q_CHUNKS_ONE = gl.constexpr(1)
# --q-live (session 31; H100: 1-2 % faster at q = 16, slower than the straight run at q = 8,
# and slower still unrolled): the chunk loop stops after the chunks that hold a warpgroup's live
# rows. A warpgroup holds WG_Q x G of its 64 rows (48 at G = 6, q = 8 and q = 16), so with
# 16-row chunks the fourth is padding: its maxima are stored as zeros (a zero scale, so its
# scores are zeros whatever codes are left in its rows) and its codes are not written.
# --q-unroll: the chunk loop unrolled, so that the compiler may issue a later chunk's loads
# before an earlier chunk's arithmetic (the runtime loop serialises them; at q = 8 that made
# chunks slower than the straight run). Both off: the loop as session 26 measured it.
Q_LIVE = gl.constexpr(False)
Q_UNROLL = gl.constexpr(False)
# --scales (session 31): where a tile's K and V scales reach the score columns' layout. 0
# "after" (the default): after the Q.K wait, each vector a layout conversion through shared
# memory (two warpgroup barriers a vector) on the consumer's chain. 1 "early": the same,
# between issuing the first Q.K term and waiting for it. 2 "widener" (with the widener
# warpgroup, not with --pv-wg): the widener reads them and stores them as two float32 vectors
# beside its 16-bit V tile, before widening it, and arrives on a barrier of their own; the
# consumer waits on it once Q.K is in and loads them in the columns' layout, with no
# conversion and no warpgroup barrier (two consumer warpgroups have no widener and keep
# "after"). H100, compute-only (session 31): "widener" with
# --qk-wait once makes the consumer's tile 5 % shorter; "early" makes it 10 % longer.
SCALES_AT = gl.constexpr(0)
SCALES_ATS = {"after": 0, "early": 1, "widener": 2}
# --v-scaled (session 31; with --scales widener, one warpgroup, eager, fp16 V): the widener
# multiplies V's codes by their token's scale as it widens them (fp16: a rounding of 2**-11
# a value, where the codes alone are exact) and writes 1.0 into the tail tile's last column,
# which no output column reads (V's codes end v_at <= 12 columns into it). P.V then needs P
# without V's scales, and the accumulator's last column sums P: the row sums come out of the
# MMA, so a tile's softmax loses its V-scale products, its row sum and its shuffles. Slots
# past the segment's end get a zero scale, so that their garbage never meets P's zeros.
# H100 (session 31): the consumer's tile 10 % shorter compute-only, the full run 0.2-1 µs
# slower at 64k-128k (copy-bound there); error 1.7e-3. Not yet run on an H200.
V_SCALED = gl.constexpr(False)
# --widener-release early (with --v-scaled): the widener releases the int8 stage once its
# codes and scales are in registers, before the arithmetic and the 16-bit stores (which
# --v-scaled makes longer), so that the loader may refill it sooner.
WIDENER_RELEASE_EARLY = gl.constexpr(False)
# --widen-at (session 27), two consumer warpgroups only: when each widens its half of V.
# 0 "softmax": after its softmax, just before the barrier both wait on for P.V (the default).
# Both warpgroups then leave that barrier together, so their Q.K and their softmax line up
# and the tensor cores idle through the softmax. 1 "qk": between issuing the first Q.K term
# and waiting for it, so the widening runs beside the MMA and the barrier is long passed
# by P.V time. 2 "qk-both": both terms issued first (two accumulators live), then widened.
WIDEN_AT = gl.constexpr(0)
WIDEN_ATS = {"softmax": 0, "qk": 1, "qk-both": 2}
# --qk-wait once (session 27): both Q.K terms issued before one wait (two score accumulators
# live), not the second issued after the first's wait; "each" is the default.
QK_ONCE = gl.constexpr(False)
# --q-regs (session 27): the query's high term as Q.K's A operand from registers, loaded
# once a program, not from shared memory every tile (see spec_decode_attn.md, "Where a
# tile's time goes": a q = 8 tile moves about 190 KB through shared memory, 36 KB of it the
# query's two terms).
Q_REGS = gl.constexpr(False)
# --partials (session 27, host side only): the dtype of the partial outputs the split pass
# stores and the reduce pass reads. At q = 16 they are 12 MiB a call at 16k (96 rows x 256
# float32 x 32 segments x 4 KV heads); float16 halves that. A partial is a weighted mean of
# V rows, inside V's range; fp16 keeps 11 bits of it.
PARTIALS = "fp32"
# --pv-wg (session 30): P.V in a warpgroup of its own. The consumer runs Q.K and the softmax
# and hands each tile's P (fp16) and the rows' rescale factors over through shared memory
# (double-buffered); a fourth partition holds the accumulators (136 registers a thread),
# rescales them, runs P.V and stores the partials. The consumer's chain a tile then holds
# no P.V wait and no accumulator rescale, and it can issue the next tile's Q.K while P.V
# runs. One warpgroup of rows, eager, widener on. 16 warps: 128 registers a thread at launch.
PV_WG = gl.constexpr(False)
PV_REGS = gl.constexpr(192)
# --pv-pipe (with --pv-wg, two terms): the consumer issues the next tile's Q.K before this
# tile's softmax and waits only for this tile's, so the tensor cores run the next Q.K
# beside the softmax. The consumer holds no accumulator under --pv-wg, which leaves it the
# registers for the second pair of score accumulators.
PV_PIPE = gl.constexpr(False)


@gluon.jit
def _k_tail(bufs, kt_bufs, s):
    """Stage s's K tail as the B operand of the tail k-step: its own box, or the first
    KT bytes of V's first chunk (the 128-byte swizzle's first 32-byte step)."""
    if KT_FROM_V:
        return bufs.index(s * 4 + 2).slice(0, KT, 1).permute((1, 0))
    else:
        return kt_bufs.index(s).permute((1, 0))


@gluon.jit
def _qk_term(qa, qb, qt, bufs, kt_bufs, s, s_zero):
    """One query term's Q.K on stage s, issued and left running: K's two 128-byte chunks,
    then its tail k-step. The term's three A operands (qa, qb: its 128-column chunks; qt:
    its tail) are shared memory, or registers with --q-regs."""
    acc = warpgroup_mma(qa, bufs.index(s * 4).permute((1, 0)), s_zero, use_acc=False,
                        is_async=True)
    acc = warpgroup_mma(qb, bufs.index(s * 4 + 1).permute((1, 0)), acc, is_async=True)
    return warpgroup_mma(qt, _k_tail(bufs, kt_bufs, s), acc, is_async=True)


@gluon.jit
def _chunk_scales(bufs, idx, at, TILE_N: gl.constexpr, layout: gl.constexpr):
    """Column ``at`` of the first 16 bytes of a 128-byte-swizzled code chunk, as float32."""
    sc_layout: gl.constexpr = SCALE_LOAD_LAYOUT
    f32_sw: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32,
                                                rank=2)
    x = _f32_view(bufs.index(idx), TILE_N, CH8 // 4, f32_sw).slice(0, 4, 1).load(sc_layout)
    return _scale_column(x, at, layout, sc_layout)


@gluon.jit
def _k_scales(bufs, sc_bufs, s, at, TILE_N: gl.constexpr, layout: gl.constexpr):
    """Stage s's K scales in the score columns' layout: from the first 16 bytes of V's first
    chunk (KT_FROM_V; at is 0 or 2 there) or from K's own scale box."""
    if KT_FROM_V:
        return _chunk_scales(bufs, s * 4 + 2, at, TILE_N, layout)
    else:
        return _scales(sc_bufs, s * 2, at, TILE_N, layout)

# A barrier over the calling partition's threads: Triton 3.9 calls it barrier, 3.6 and 3.7
# thread_barrier.
_partition_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.jit
def _widen(v8, dtype: gl.constexpr):
    """int8 V codes into the P.V tile's dtype, exactly. bf16: Triton's own conversion. fp16:
    the 1024 bias, 1 LOP3 + 2 PRMT + 2 HSUB2 for 4 codes: x ^ 0x80 is x + 128 as a byte; under
    the exponent byte 0x64 it is the fp16 1024 + (x + 128); 1152 (0x6480) off leaves x."""
    if dtype == gl.float16:
        return gl.inline_asm_elementwise(
            "{ .reg .b32 t, m; xor.b32 t, $2, 0x80808080; mov.b32 m, 0x64806480;"
            " prmt.b32 $0, t, 0x64646464, 0x5140; prmt.b32 $1, t, 0x64646464, 0x5342;"
            " sub.f16x2 $0, $0, m; sub.f16x2 $1, $1, m; }",
            "=r,=r,r", [v8], dtype=gl.float16, is_pure=True, pack=4)
    else:
        return v8.to(dtype)


@gluon.jit
def _p_scale(dtype: gl.constexpr, LAZY: gl.constexpr):
    """What P's columns are multiplied by before the P.V MMA (the epilogue divides it out).
    With an fp16 tile and the eager rescale P <= 1: 256 lifts small P x V-scale products out
    of fp16's subnormals and keeps P x 256 <= 256 as the lazy rescale's own bound does."""
    if dtype == gl.float16 and not LAZY:
        return 256.0
    else:
        return 1.0


@gluon.jit
def _widen_scaled(bufs, sc_bufs, vbf, vbft, empty, s, b, i, v_at, kv_lo, kv_hi,
                  vdt: gl.constexpr, ld_layout: gl.constexpr, vt_layout: gl.constexpr):
    """--v-scaled: stage s's V widened into 16-bit tile b with each token's scale applied
    (zero past the segment's end), and 1.0 in the tail tile's last column. With
    --widener-release early it arrives on empty[s] once the stage is read."""
    tn: gl.constexpr = bufs.shape[1]
    rows: gl.constexpr = gl.SliceLayout(1, ld_layout)
    t = kv_lo + i * tn + gl.arange(0, tn, layout=rows)
    v_sc = gl.where(t < kv_hi, _scales(sc_bufs, s * 2 + 1, v_at // 4, tn, rows), 0.0)
    v_sc = v_sc.to(vdt)[:, None]
    v0 = bufs.index(s * 4 + 2).load(ld_layout)
    v1 = bufs.index(s * 4 + 3).load(ld_layout)
    t8 = sc_bufs.index(s * 2 + 1).load(vt_layout)
    if WIDENER_RELEASE_EARLY:
        # Every thread's loads are in before the one thread's arrival.
        _partition_barrier()
        mbarrier.arrive(empty.index(s), count=1)
    vbf.index(b * 2).store(_widen(v0, vdt) * v_sc)
    vbf.index(b * 2 + 1).store(_widen(v1, vdt) * v_sc)
    tail = _widen(t8, vdt) * gl.convert_layout(v_sc, vt_layout)
    col = gl.arange(0, tail.shape[1], layout=gl.SliceLayout(0, vt_layout))
    vbft.index(b).store(gl.where((col == tail.shape[1] - 1)[None, :], 1.0, tail).to(vdt))


@gluon.jit
def _widener8(bufs, sc_bufs, vbf, vbft, scv, ready, empty, vbars, n_tiles, k_at, v_at, kv_lo,
              kv_hi, STAGES: gl.constexpr):
    """WIDEN_WG: a worker warpgroup that widens each tile's V into 16-bit tile i % 2 (the
    consumer's P.V reads it), says so on vbars[i % 2], and waits on vbars[2 + i % 2] until the
    consumer's P.V of tile i - 2 has read that tile. It releases the int8 stage as the
    consumer does: the stage's empty barrier takes both arrivals. With --scales widener it
    first stores the tile's K and V scales as float32 vectors into scv[2 (i % 2)] and the
    next, and says so on vbars[4 + i % 2]."""
    ld_layout: gl.constexpr = V_LOAD_LAYOUT
    vt_layout: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [4, 1], [1, 0])
    vdt: gl.constexpr = vbf.dtype
    for i in range(n_tiles):
        s = i % STAGES
        b = i % 2
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        if DIAG == 1 or DIAG == 3:
            # load-only, handshake-only: the consumer does no arithmetic, nor does this.
            mbarrier.arrive(empty.index(s), count=1)
        else:
            mbarrier.wait(vbars.index(2 + b), ((i // 2) & 1) ^ 1)
            if SCALES_AT == 2:
                rows: gl.constexpr = gl.SliceLayout(1, SCALE_LOAD_LAYOUT)
                tn: gl.constexpr = bufs.shape[1]
                scv.index(b * 2).store(_k_scales(bufs, sc_bufs, s, k_at // 4, tn, rows))
                if not V_SCALED:
                    scv.index(b * 2 + 1).store(_scales(sc_bufs, s * 2 + 1, v_at // 4, tn,
                                                       rows))
                # Their own barrier (4 + b), so that the consumer's softmax waits for them
                # only, not for the whole tile's widening.
                _partition_barrier()
                mbarrier.arrive(vbars.index(4 + b), count=1)
            if V_SCALED:
                _widen_scaled(bufs, sc_bufs, vbf, vbft, empty, s, b, i, v_at, kv_lo, kv_hi,
                              vdt, ld_layout, vt_layout)
            else:
                for c in gl.static_range(2):
                    v8 = bufs.index(s * 4 + 2 + c).load(ld_layout)
                    vbf.index(b * 2 + c).store(_widen(v8, vdt))
                vbft.index(b).store(_widen(sc_bufs.index(s * 2 + 1).load(vt_layout), vdt))
            fence_async_shared()
            # Every thread's stores are in before the one thread's arrivals.
            _partition_barrier()
            mbarrier.arrive(vbars.index(b), count=1)
            if not (V_SCALED and WIDENER_RELEASE_EARLY):
                mbarrier.arrive(empty.index(s), count=1)


@gluon.jit
def _softmax8(sacc, v_sc, m_i, l_i, acc0, acc1, acc2, row_scale, start, kv_hi, ctx, qi0,
              G: gl.constexpr, TILE_N: gl.constexpr, MASKED: gl.constexpr,
              LAZY: gl.constexpr, vdt: gl.constexpr, s_layout: gl.constexpr,
              o_layout: gl.constexpr, o2_layout: gl.constexpr):
    """One tile's online softmax over its scores, sacc x row_scale (K's scale in sacc; the
    query's and qk_scale, log2 units, in row_scale): the new row maxima and sums,
    the accumulators rescaled, and P x V's scales (x _p_scale) in vdt, in the scores'
    layout. MASKED builds the causal and segment-end mask."""
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    row2_layout: gl.constexpr = gl.SliceLayout(1, o2_layout)
    if MASKED:
        t = start + gl.arange(0, TILE_N, layout=col_layout)
        rr = gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, s_layout))
        limit = ctx + qi0 + rr // G + 1
        visible = (t[None, :] < limit[:, None]) & (t[None, :] < kv_hi)
        sacc = gl.where(visible, sacc, float("-inf"))
        # A slot past the segment's end may hold any scale: 0 there, so P's zeros stay zeros.
        v_sc = gl.where(t < kv_hi, v_sc, 0.0)
    m_new = gl.maximum(m_i, gl.max(sacc, axis=1) * row_scale)
    if LAZY:
        # The rows keep their reference maximum until one of them grows past it by more than
        # RESCALE_LOG2 (P stays below 2**RESCALE_LOG2 meanwhile, well inside bf16): the
        # accumulator's rescale, 136 FMULs a thread, then runs on few tiles. Exact either way:
        # m_i, l_i and the accumulator always share one reference.
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
        if not V_SCALED:
            l_i = l_i * alpha + gl.sum(p, axis=1)
        a = gl.convert_layout(alpha, row_layout)[:, None]
        acc0 = acc0 * a
        acc1 = acc1 * a
        acc2 = acc2 * gl.convert_layout(alpha, row2_layout)[:, None]
    if V_SCALED:
        # --v-scaled: V's scales are in the widened tile; the row sums accumulate in acc2.
        return m_new, l_i, (p * _p_scale(vdt, LAZY)).to(vdt), acc0, acc1, acc2
    else:
        return (m_new, l_i, (p * (v_sc * _p_scale(vdt, LAZY))[None, :]).to(vdt), acc0, acc1,
                acc2)


@gluon.jit
def _widen_half(bufs, sc_bufs, vbf, vbft, widened, s, vdt: gl.constexpr, W: gl.constexpr,
                ld_layout: gl.constexpr, vt_layout: gl.constexpr):
    """Two consumer warpgroups: W widens V's chunk W of stage s into the stage's 16-bit
    tile (W = 0 its tail too) and arrives on widened[s] once every thread's stores are in.
    --diagnose no-widen leaves the loads and stores out (P.V reads whatever is there)."""
    if DIAG != 6:
        v8 = bufs.index(s * 4 + 2 + W).load(ld_layout)
        vbf.index(s * 2 + W).store(_widen(v8, vdt))
        if W == 0:
            vbft.index(s).store(_widen(sc_bufs.index(s * 2 + 1).load(vt_layout), vdt))
    fence_async_shared()
    _partition_barrier()
    mbarrier.arrive(widened.index(s), count=1)


@gluon.jit
def _tile8(qh_smem, ql_smem, qht, qlt, bufs, kt_bufs, sc_bufs, vbf, vbft, scv, ready, empty,
           widened,
           i, kv_lo, kv_hi, ctx, qi0, q_sc, k_at, v_at,
           m_i, l_i, acc0, acc1, acc2, qk_scale,
           G: gl.constexpr, TILE_N: gl.constexpr, STAGES: gl.constexpr,
           INT8_QK: gl.constexpr, MASKED: gl.constexpr, LAZY: gl.constexpr, W: gl.constexpr,
           NUM_WG: gl.constexpr, PP: gl.constexpr, s_layout: gl.constexpr,
           o_layout: gl.constexpr,
           o2_layout: gl.constexpr, p_layout: gl.constexpr, p2_layout: gl.constexpr,
           ld_layout: gl.constexpr, vt_layout: gl.constexpr, qa_r, qb_r, qt_r):
    """One tile of the segment for warpgroup W: Q.K, the online softmax and P.V. MASKED
    builds the causal and segment-end mask; the caller passes False only for tiles every row
    of the warpgroup sees whole. K's codes sit k_at bytes into their boxes (the query is
    shifted to match, zeros beside it); V's sit v_at bytes in, so the accumulators hold V's
    column d at d + v_at (the epilogue shifts them back). qa_r, qb_r and qt_r are the high
    term's A operands (see _qk_term)."""
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    s = i % STAGES
    phase = (i // STAGES) & 1
    start = kv_lo + i * TILE_N
    s_zero = gl.zeros([WG_ROWS, TILE_N], gl.int32, layout=s_layout)
    vdt: gl.constexpr = vbf.dtype
    ql0 = ql_smem.index(0)
    ql1 = ql_smem.index(1)
    EARLY: gl.constexpr = NUM_WG == 2 and not PP and WIDEN_AT > 0 and DIAG != 7
    mbarrier.wait(ready.index(s), phase)
    # Diagnosis (--diagnose no-qk): no Q.K is issued; the scores are the tile's index (not
    # a constant, so the softmax is not folded away; the outputs are wrong).
    si = s_zero + i if DIAG == 7 else _qk_term(qa_r, qb_r, qt_r, bufs, kt_bufs, s, s_zero)
    # --scales early: converted here while Q.K runs.
    SC_WG: gl.constexpr = SCALES_AT == 2 and WIDEN_WG and NUM_WG == 1 and not PP
    if SCALES_AT == 1:
        k_sc = _k_scales(bufs, sc_bufs, s, k_at // 4, TILE_N, col_layout)
        v_sc = _scales(sc_bufs, s * 2 + 1, v_at // 4, TILE_N, col_layout)
    # Both terms issued before one wait (--qk-wait once, or --widen-at qk-both).
    BOTH: gl.constexpr = (DIAG != 7 and INT8_QK == 2
                          and (QK_ONCE or (EARLY and WIDEN_AT == 2)))
    if BOTH:
        sl = _qk_term(ql0, ql1, qlt, bufs, kt_bufs, s, s_zero)
    if EARLY:
        _widen_half(bufs, sc_bufs, vbf, vbft, widened, s, vdt, W, ld_layout, vt_layout)
    if BOTH:
        si, sl = warpgroup_mma_wait(num_outstanding=0, deps=(si, sl))
        si = si * 256 + sl
    elif DIAG != 7:
        si = warpgroup_mma_wait(num_outstanding=0, deps=(si,))
        if INT8_QK == 2:
            sl = _qk_term(ql0, ql1, qlt, bufs, kt_bufs, s, s_zero)
            sl = warpgroup_mma_wait(num_outstanding=0, deps=(sl,))
            si = si * 256 + sl
    if SC_WG:
        # --scales widener: its vectors, loaded once Q.K is in (before, they spill).
        mbarrier.wait(widened.index(4 + i % 2), (i // 2) & 1)
        k_sc = scv.index((i % 2) * 2).load(col_layout)
        v_sc = k_sc if V_SCALED else scv.index((i % 2) * 2 + 1).load(col_layout)
    elif SCALES_AT != 1:
        k_sc = _k_scales(bufs, sc_bufs, s, k_at // 4, TILE_N, col_layout)
        v_sc = _scales(sc_bufs, s * 2 + 1, v_at // 4, TILE_N, col_layout)
    m_new, l_i, p, acc0, acc1, acc2 = _softmax8(
        si.to(gl.float32) * k_sc[None, :], v_sc, m_i, l_i, acc0, acc1, acc2, q_sc, start,
        kv_hi, ctx, qi0, G, TILE_N, MASKED, LAZY, vdt, s_layout, o_layout,
        o2_layout)
    p2 = gl.convert_layout(p, p2_layout)
    p = gl.convert_layout(p, p_layout)
    if WIDEN_WG and NUM_WG == 1 and not PP:
        # The widener warpgroup has V in 16-bit tile i % 2 (widened = its barriers: full
        # 0..1, free 2..3); K and the scales are read, so the stage is released here.
        b = i % 2
        mbarrier.arrive(empty.index(s), count=1)
        mbarrier.wait(widened.index(b), (i // 2) & 1)
        acc0 = warpgroup_mma(p, vbf.index(b * 2), acc0, is_async=True)
        acc1 = warpgroup_mma(p, vbf.index(b * 2 + 1), acc1, is_async=True)
        acc2 = warpgroup_mma(p2, vbft.index(b), acc2, is_async=True)
        acc0, acc1, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1, acc2))
        mbarrier.arrive(widened.index(2 + b), count=1)
    elif NUM_WG == 1 or PP:
        # V widened once into the 16-bit tiles the P.V wgmma reads (int8 codes are exact
        # there; with PP each warpgroup has its own, W); the int8 stage is free once read.
        for c in gl.static_range(2):
            v8 = bufs.index(s * 4 + 2 + c).load(ld_layout)
            vbf.index(W * 2 + c).store(_widen(v8, vdt))
        vbft.index(W).store(_widen(sc_bufs.index(s * 2 + 1).load(vt_layout), vdt))
        fence_async_shared()
        mbarrier.arrive(empty.index(s), count=1)
        acc0 = warpgroup_mma(p, vbf.index(W * 2), acc0, is_async=True)
        acc1 = warpgroup_mma(p, vbf.index(W * 2 + 1), acc1, is_async=True)
        acc2 = warpgroup_mma(p2, vbft.index(W), acc2, is_async=True)
        acc0, acc1, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1, acc2))
    else:
        # Two warpgroups share the widening: W widens V's chunk W into this stage's 16-bit
        # tile (W = 0 the tail too), and both wait for both halves. The stage (codes and
        # widened tiles) is released only after this warpgroup's P.V has read it.
        if not EARLY:
            _widen_half(bufs, sc_bufs, vbf, vbft, widened, s, vdt, W, ld_layout, vt_layout)
        mbarrier.wait(widened.index(s), phase)
        acc0 = warpgroup_mma(p, vbf.index(s * 2), acc0, is_async=True)
        acc1 = warpgroup_mma(p, vbf.index(s * 2 + 1), acc1, is_async=True)
        acc2 = warpgroup_mma(p2, vbft.index(s), acc2, is_async=True)
        acc0, acc1, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1, acc2))
        mbarrier.arrive(empty.index(s), count=1)
    return m_new, l_i, acc0, acc1, acc2


@gluon.jit
def _softmax_to_pv(si, bufs, sc_bufs, p_smem, a_smem, empty, pv_bars, i, kv_lo, kv_hi, ctx,
                   qi0, q_sc, k_at, v_at, m_i, l_i, G: gl.constexpr, TILE_N: gl.constexpr,
                   STAGES: gl.constexpr, MASKED: gl.constexpr, s_layout: gl.constexpr):
    """PV_WG: tile i's online softmax (eager) over its integer scores si, then P (x V's
    scales, fp16) into P buffer i % 2 and the rows' rescale factors beside it, once the P.V
    warpgroup has read that buffer's tile i - 2 (pv_bars: full 4..5, free 6..7)."""
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, CH8, 16])
    o2_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, SCB, 16])
    s = i % STAGES
    b = i % 2
    k_sc = _k_scales(bufs, sc_bufs, s, k_at // 4, TILE_N, col_layout)
    v_sc = _scales(sc_bufs, s * 2 + 1, v_at // 4, TILE_N, col_layout)
    # K and the scales are read: the stage goes back (the widener arrives for V).
    mbarrier.arrive(empty.index(s), count=1)
    # _softmax8 over accumulators this warpgroup does not hold: their rescale is dead code.
    # The rows' factor is the one _softmax8 takes inside (the same exp2, merged).
    m_new, l_i, pv, _, _, _ = _softmax8(
        si.to(gl.float32) * k_sc[None, :], v_sc, m_i, l_i,
        gl.zeros([WG_ROWS, CH8], gl.float32, layout=o_layout),
        gl.zeros([WG_ROWS, CH8], gl.float32, layout=o_layout),
        gl.zeros([WG_ROWS, SCB], gl.float32, layout=o2_layout), q_sc, kv_lo + i * TILE_N,
        kv_hi, ctx, qi0, G, TILE_N, MASKED, False, p_smem.dtype, s_layout, o_layout, o2_layout)
    alpha = gl.exp2(m_i - m_new)
    mbarrier.wait(pv_bars.index(6 + b), ((i // 2) & 1) ^ 1)
    p_smem.index(b).store(pv)
    a_smem.index(b).store(alpha)
    fence_async_shared()
    _partition_barrier()
    mbarrier.arrive(pv_bars.index(4 + b), count=1)
    return m_new, l_i


@gluon.jit
def _tile8_sp(sc, qh_smem, ql_smem, qht, qlt, bufs, kt_bufs, sc_bufs, p_smem, a_smem, ready,
              empty, pv_bars, i, n_tiles, kv_lo, kv_hi, ctx, qi0, q_sc, k_at, v_at, m_i, l_i,
              G: gl.constexpr, TILE_N: gl.constexpr, STAGES: gl.constexpr,
              MASKED: gl.constexpr, s_layout: gl.constexpr):
    """PV_PIPE: tile i, its integer scores sc already in registers. The next tile's two Q.K
    terms are issued first and waited for only after this tile's softmax, so the tensor
    cores run them beside it; past the last tile the issue reads the stale stage (never
    used). No wgmma is in flight over the loop's back edge: a loop-carried copy of
    registers a wgmma still writes makes ptxas serialise every wgmma (C7514). Returns the
    next tile's scores."""
    nxt = i + 1
    sn = nxt % STAGES
    s_zero = gl.zeros([WG_ROWS, TILE_N], gl.int32, layout=s_layout)
    if nxt < n_tiles:
        mbarrier.wait(ready.index(sn), (nxt // STAGES) & 1)
    si_n = _qk_term(qh_smem.index(0), qh_smem.index(1), qht, bufs, kt_bufs, sn, s_zero)
    sl_n = _qk_term(ql_smem.index(0), ql_smem.index(1), qlt, bufs, kt_bufs, sn, s_zero)
    m_i, l_i = _softmax_to_pv(sc, bufs, sc_bufs, p_smem, a_smem, empty, pv_bars, i, kv_lo,
                              kv_hi, ctx, qi0, q_sc, k_at, v_at, m_i, l_i, G, TILE_N, STAGES,
                              MASKED, s_layout)
    si_n, sl_n = warpgroup_mma_wait(num_outstanding=0, deps=(si_n, sl_n))
    return m_i, l_i, si_n * 256 + sl_n


@gluon.jit
def _tile8_s(qh_smem, ql_smem, qht, qlt, bufs, kt_bufs, sc_bufs, p_smem, a_smem, ready,
             empty, pv_bars, i, kv_lo, kv_hi, ctx, qi0, q_sc, k_at, v_at, m_i, l_i,
             G: gl.constexpr, TILE_N: gl.constexpr, STAGES: gl.constexpr,
             INT8_QK: gl.constexpr, MASKED: gl.constexpr, s_layout: gl.constexpr):
    """PV_WG: the consumer's tile without P.V. Q.K and the online softmax (eager) as _tile8;
    then P (x V's scales, fp16) into P buffer i % 2 and the rows' rescale factors beside it,
    once the P.V warpgroup has read that buffer's tile i - 2 (pv_bars: full 4..5, free
    6..7). The accumulators are the P.V warpgroup's."""
    s = i % STAGES
    s_zero = gl.zeros([WG_ROWS, TILE_N], gl.int32, layout=s_layout)
    mbarrier.wait(ready.index(s), (i // STAGES) & 1)
    si = _qk_term(qh_smem.index(0), qh_smem.index(1), qht, bufs, kt_bufs, s, s_zero)
    if INT8_QK == 2 and QK_ONCE:
        # Both terms queued on the tensor cores before the P.V warpgroup's next P.V can
        # get between them.
        sl = _qk_term(ql_smem.index(0), ql_smem.index(1), qlt, bufs, kt_bufs, s, s_zero)
        si, sl = warpgroup_mma_wait(num_outstanding=0, deps=(si, sl))
        si = si * 256 + sl
    else:
        si = warpgroup_mma_wait(num_outstanding=0, deps=(si,))
        if INT8_QK == 2:
            sl = _qk_term(ql_smem.index(0), ql_smem.index(1), qlt, bufs, kt_bufs, s, s_zero)
            sl = warpgroup_mma_wait(num_outstanding=0, deps=(sl,))
            si = si * 256 + sl
    return _softmax_to_pv(si, bufs, sc_bufs, p_smem, a_smem, empty, pv_bars, i, kv_lo,
                          kv_hi, ctx, qi0, q_sc, k_at, v_at, m_i, l_i, G, TILE_N, STAGES,
                          MASKED, s_layout)


@gluon.jit
def _pv8(part_out_ptr, p_smem, a_smem, vbf, vbft, pv_bars, seq, kv_head, seg, q_len, qi0,
         n_tiles, max_q, v_at, NUM_HEADS: gl.constexpr, G: gl.constexpr, WG_Q: gl.constexpr,
         NUM_SEGMENTS: gl.constexpr):
    """PV_WG: the P.V warpgroup. For each tile: the consumer's P and rescale factors
    (pv_bars 4..5), the widener's 16-bit V tile (pv_bars 0..1, as the widener's own
    barriers), the accumulators rescaled and P.V; then both buffers are handed back (6..7,
    2..3). After the last tile the consumer's row sums (a_smem row 2, pv_bars 8) normalise
    the partial outputs, stored a row a warp as _consume8's EPI_ROWS."""
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, CH8, 16])
    o2_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, SCB, 16])
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    row2_layout: gl.constexpr = gl.SliceLayout(1, o2_layout)
    if VEC_SHIFTS:
        v_at = (v_at // 4) * 4
    acc0 = gl.zeros([WG_ROWS, CH8], gl.float32, layout=o_layout)
    acc1 = gl.zeros([WG_ROWS, CH8], gl.float32, layout=o_layout)
    acc2 = gl.zeros([WG_ROWS, SCB], gl.float32, layout=o2_layout)
    for i in range(n_tiles):
        b = i % 2
        ph = (i // 2) & 1
        mbarrier.wait(pv_bars.index(4 + b), ph)
        a = a_smem.index(b).load(row_layout)[:, None]
        acc0 = acc0 * a
        acc1 = acc1 * a
        acc2 = acc2 * a_smem.index(b).load(row2_layout)[:, None]
        mbarrier.wait(pv_bars.index(b), ph)
        acc0 = warpgroup_mma(p_smem.index(b), vbf.index(b * 2), acc0, is_async=True)
        acc1 = warpgroup_mma(p_smem.index(b), vbf.index(b * 2 + 1), acc1, is_async=True)
        acc2 = warpgroup_mma(p_smem.index(b), vbft.index(b), acc2, is_async=True)
        acc0, acc1, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1, acc2))
        mbarrier.arrive(pv_bars.index(6 + b), count=1)
        mbarrier.arrive(pv_bars.index(2 + b), count=1)
    mbarrier.wait(pv_bars.index(8), 0)
    l_o = a_smem.index(2).load(row_layout)
    r_o = gl.arange(0, WG_ROWS, layout=row_layout)
    qi_o = qi0 + r_o // G
    ok_o = (r_o < WG_Q * G) & (qi_o < q_len)
    part_row = (((seq * max_q + qi_o).to(gl.int64) * NUM_HEADS + kv_head * G + r_o % G)
                * NUM_SEGMENTS + seg)
    inv_l = gl.where(l_o > 0.0, 1.0 / (l_o * _p_scale(p_smem.dtype, False)), 0.0)[:, None]
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
def _tile8_ov(qh_smem, ql_smem, qht, qlt, bufs, kt_bufs, sc_bufs, vbf, vbft, p_smem, ready,
              empty, i, kv_lo, kv_hi, ctx, qi0, q_sc, k_at, v_at,
              m_i, l_i, acc0, acc1, acc2,
              qk_scale, G: gl.constexpr, TILE_N: gl.constexpr, STAGES: gl.constexpr,
              INT8_QK: gl.constexpr, MASKED: gl.constexpr, LAZY: gl.constexpr,
              s_layout: gl.constexpr, o_layout: gl.constexpr, o2_layout: gl.constexpr,
              ld_layout: gl.constexpr, vt_layout: gl.constexpr):
    """_tile8 for one warpgroup (OV), its steps reordered so the tensor cores run beside the
    ALU work instead of between it: both Q.K terms are issued before any wait; V is widened
    (into this tile's half of a double buffer) while Q.K and the previous tile's P.V run,
    and the scales are read after the wait (before it, the loop spilled 58 local loads a
    tile); P goes to shared memory, so the registers the P.V wgmma reads are not held, and
    P.V is left running into the next tile. acc0..2 arrive and leave as pending wgmma
    accumulators (the caller waits after its last tile). On the H200 it gained 2 % or less."""
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    s = i % STAGES
    phase = (i // STAGES) & 1
    b = i % 2
    start = kv_lo + i * TILE_N
    s_zero = gl.zeros([WG_ROWS, TILE_N], gl.int32, layout=s_layout)
    mbarrier.wait(ready.index(s), phase)
    qa_r = qh_smem.index(0)
    qb_r = qh_smem.index(1)
    qt_r = qht
    ql0 = ql_smem.index(0)
    ql1 = ql_smem.index(1)
    si = _qk_term(qa_r, qb_r, qt_r, bufs, kt_bufs, s, s_zero)
    if INT8_QK == 2:
        sl = _qk_term(ql0, ql1, qlt, bufs, kt_bufs, s, s_zero)
    vdt: gl.constexpr = vbf.dtype
    for c in gl.static_range(2):
        v8 = bufs.index(s * 4 + 2 + c).load(ld_layout)
        vbf.index(b * 2 + c).store(_widen(v8, vdt))
    vbft.index(b).store(_widen(sc_bufs.index(s * 2 + 1).load(vt_layout), vdt))
    if INT8_QK == 2:
        acc0, acc1, acc2, si, sl = warpgroup_mma_wait(num_outstanding=0,
                                                      deps=(acc0, acc1, acc2, si, sl))
        si = si * 256 + sl
    else:
        acc0, acc1, acc2, si = warpgroup_mma_wait(num_outstanding=0,
                                                  deps=(acc0, acc1, acc2, si))
    k_sc = _k_scales(bufs, sc_bufs, s, k_at // 4, TILE_N, col_layout)
    v_sc = _scales(sc_bufs, s * 2 + 1, v_at // 4, TILE_N, col_layout)
    # Q.K has read K, the widening V: the stage goes back to the loader.
    mbarrier.arrive(empty.index(s), count=1)
    m_new, l_i, p, acc0, acc1, acc2 = _softmax8(
        si.to(gl.float32) * k_sc[None, :], v_sc, m_i, l_i, acc0, acc1, acc2, q_sc, start,
        kv_hi, ctx, qi0, G, TILE_N, MASKED, LAZY, vdt, s_layout, o_layout,
        o2_layout)
    # The previous P.V has finished (the wait above), so its P tile may be overwritten.
    p_smem.store(p)
    fence_async_shared()
    acc0 = warpgroup_mma(p_smem, vbf.index(b * 2), acc0, is_async=True)
    acc1 = warpgroup_mma(p_smem, vbf.index(b * 2 + 1), acc1, is_async=True)
    acc2 = warpgroup_mma(p_smem, vbft.index(b), acc2, is_async=True)
    return m_new, l_i, acc0, acc1, acc2


@gluon.jit
def _query_scaled(q_ptr, r0, q_start, q_len, qi0, kv_head, stride_q_tok, stride_q_head, k_at,
                  ROWS: gl.constexpr, G: gl.constexpr, WG_Q: gl.constexpr,
                  ld_layout: gl.constexpr, kt_layout: gl.constexpr):
    """Rows r0 .. r0 + ROWS of a consumer warpgroup's query tile (WG_Q tokens x G heads from
    token qi0), shifted k_at columns right as K's boxes are (zeros where the boxes hold other
    bytes), each scaled by 127 over its maximum for the int8 terms of the Triton pass's
    _quantize_q: its two 128-column chunks and its tail, and the maxima. The straight run
    and --q-chunks both quantize through it."""
    r = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, ld_layout))
    d = gl.arange(0, CH8, layout=gl.SliceLayout(0, ld_layout)) - k_at
    qi = qi0 + r // G
    row_ok = (r < WG_Q * G) & (qi < q_len)
    q_rows = (q_start + qi).to(gl.int64) * stride_q_tok + (kv_head * G + r % G) * stride_q_head
    q_base = q_ptr + q_rows[:, None] + d[None, :]
    if DIAG == 5:
        # Diagnosis (--diagnose no-query-load): ones for the query, no global load.
        qa = gl.where(row_ok[:, None] & (d >= 0)[None, :], 1.0, 0.0) + (d * 0.0)[None, :]
        qb = gl.where(row_ok[:, None], 1.0, 0.0) + (d * 0.0)[None, :]
    else:
        qa = gl.load(q_base, mask=row_ok[:, None] & (d >= 0)[None, :],
                     other=0.0).to(gl.float32)
        qb = gl.load(q_base + CH8, mask=row_ok[:, None], other=0.0).to(gl.float32)
    rt = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, kt_layout))
    dt = gl.arange(0, KT, layout=gl.SliceLayout(0, kt_layout)) + 2 * CH8 - k_at
    qit = qi0 + rt // G
    q_rows_t = ((q_start + qit).to(gl.int64) * stride_q_tok
                + (kv_head * G + rt % G) * stride_q_head)
    qc_ok = ((rt < WG_Q * G) & (qit < q_len))[:, None] & (dt < 2 * CH8)[None, :]
    if DIAG == 5:
        qc = gl.where(qc_ok, 1.0, 0.0)
    else:
        qc = gl.load(q_ptr + q_rows_t[:, None] + dt[None, :], mask=qc_ok,
                     other=0.0).to(gl.float32)
    amax = gl.maximum(gl.maximum(gl.max(gl.abs(qa), axis=1), gl.max(gl.abs(qb), axis=1)),
                      gl.convert_layout(gl.max(gl.abs(qc), axis=1),
                                        gl.SliceLayout(1, ld_layout)))
    inv = (127.0 / gl.maximum(amax, 1.0e-30))[:, None]
    inv_t = gl.convert_layout(127.0 / gl.maximum(amax, 1.0e-30),
                              gl.SliceLayout(1, kt_layout))[:, None]
    return qa * inv, qb * inv, qc * inv_t, amax


@gluon.jit
def _quantize_chunk(q_ptr, ha_v, hb_v, la_v, lb_v, ht_v, lt_v, sc_v, c, q_start, q_len, qi0,
                    kv_head, stride_q_tok, stride_q_head, k_at, QR: gl.constexpr,
                    G: gl.constexpr, WG_Q: gl.constexpr, INT8_QK: gl.constexpr,
                    ld_layout: gl.constexpr, kt_layout: gl.constexpr):
    """Chunk c of --q-chunks: its rows' codes into the chunk views, its maxima into sc_v."""
    xa, xb, xc, amax = _query_scaled(
        q_ptr, c * QR, q_start, q_len, qi0, kv_head, stride_q_tok, stride_q_head, k_at,
        QR, G, WG_Q, ld_layout, kt_layout)
    ya = xa + 12582912.0
    yb = xb + 12582912.0
    yc = xc + 12582912.0
    ha_v.index(c).store(_low8(ya))
    hb_v.index(c).store(_low8(yb))
    ht_v.index(c).store(_low8(yc))
    if INT8_QK == 2:
        la_v.index(c).store(_low_term(xa, ya - 12582912.0))
        lb_v.index(c).store(_low_term(xb, yb - 12582912.0))
        lt_v.index(c).store(_low_term(xc, yc - 12582912.0))
    sc_v.index(c).store(amax)


@gluon.jit
def _quantize_chunked(q_ptr, qh_smem, ql_smem, qht, qlt, qsc, q_start, q_len, qi0, kv_head,
                      stride_q_tok, stride_q_head, k_at, G: gl.constexpr, WG_Q: gl.constexpr,
                      INT8_QK: gl.constexpr, W: gl.constexpr, CHUNKS: gl.constexpr,
                      ld_layout: gl.constexpr, kt_layout: gl.constexpr,
                      out_layout: gl.constexpr):
    """--q-chunks: the consumer's quantization (_query_scaled, magic rounding), CHUNKS row
    chunks at a time in a runtime loop. The codes go to the same shared tiles through views
    of QR-row chunks (QR a multiple of 8, so each chunk keeps the whole tile's swizzle); each
    chunk's row maxima go to qsc, read back as one row vector. Returns the rows' scales."""
    QR: gl.constexpr = WG_ROWS // CHUNKS
    # A view's leading dimension is indexed, so its layout has the rank of one chunk (as
    # the stages' buffers are laid out).
    codes: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8,
                                               rank=2)
    tail: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=8,
                                              rank=2)
    flat1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    ha_v = _view(qh_smem.index(0), gl.int8, [CHUNKS, QR, CH8], codes)
    hb_v = _view(qh_smem.index(1), gl.int8, [CHUNKS, QR, CH8], codes)
    la_v = _view(ql_smem.index(0), gl.int8, [CHUNKS, QR, CH8], codes)
    lb_v = _view(ql_smem.index(1), gl.int8, [CHUNKS, QR, CH8], codes)
    ht_v = _view(qht, gl.int8, [CHUNKS, QR, KT], tail)
    lt_v = _view(qlt, gl.int8, [CHUNKS, QR, KT], tail)
    sc_v = _view(qsc.index(W), gl.float32, [CHUNKS, QR], flat1)
    LIVE: gl.constexpr = (WG_Q * G + QR - 1) // QR if Q_LIVE else CHUNKS
    if Q_UNROLL:
        for c in gl.static_range(LIVE):
            _quantize_chunk(q_ptr, ha_v, hb_v, la_v, lb_v, ht_v, lt_v, sc_v, c, q_start,
                            q_len, qi0, kv_head, stride_q_tok, stride_q_head, k_at, QR, G,
                            WG_Q, INT8_QK, ld_layout, kt_layout)
    else:
        for c in range(0, LIVE):
            _quantize_chunk(q_ptr, ha_v, hb_v, la_v, lb_v, ht_v, lt_v, sc_v, c, q_start,
                            q_len, qi0, kv_head, stride_q_tok, stride_q_head, k_at, QR, G,
                            WG_Q, INT8_QK, ld_layout, kt_layout)
    for c in gl.static_range(LIVE, CHUNKS):
        sc_v.index(c).store(gl.zeros([QR], gl.float32,
                                     layout=gl.SliceLayout(1, ld_layout)))
    fence_async_shared()
    _partition_barrier()
    q_sc = qsc.index(W).load(out_layout) / 127.0
    if INT8_QK == 2:
        q_sc = q_sc / 256.0
    return q_sc


@gluon.jit
def _consume8(q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, qh_smem, ql_smem, qht, qlt,
              qsc, bufs, kt_bufs, sc_bufs, vbf, vbft, p_smem, a_smem,
              ready, empty, widened, seq, kv_head,
              seg, q_start, q_len, seq_len, tile_q0, kv_lo, kv_hi, n_tiles, qk_scale, max_q,
              stride_q_tok, stride_q_head, k_at, v_at, NUM_HEADS: gl.constexpr,
              G: gl.constexpr, WG_Q: gl.constexpr, TILE_N: gl.constexpr,
              NUM_SEGMENTS: gl.constexpr, STAGES: gl.constexpr, INT8_QK: gl.constexpr,
              LAZY: gl.constexpr, W: gl.constexpr, NUM_WG: gl.constexpr,
              PP: gl.constexpr, OV: gl.constexpr):
    """Consumer warpgroup W: every tile of the segment for its 64 query rows (WG_Q tokens x
    G heads from token tile_q0 + W * WG_Q), then the segment's partials as the Triton split
    pass writes them. PP (ping-pong): both warpgroups take the same rows, W the tiles
    i = W mod 2, and W's partials go to segment seg + W (the caller passes 2 x its own);
    warpgroup 0 writes the shared quantized query and says so on widened[0]. OV (one
    warpgroup): the tiles run as _tile8_ov, P through p_smem (unused otherwise). a_smem
    holds the rows' rescale factors with --pv-wg, and the widener's scale vectors (_tile8's
    scv) with --scales widener."""
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

    # K's codes start 0 or 8 bytes past a 16-byte boundary and V's 4 or 12: said so, the
    # query's loads (bf16, shifted by k_at) and the partials' stores (float32, shifted by
    # v_at) are 16-byte vectors. Unsaid, the compiler made them 2- and 4-byte (ncu,
    # session 20).
    if VEC_SHIFTS:
        # (gl.multiple_of on these scalars left the accesses as they were; a product by a
        # constant carries its divisibility into the compiler's alignment analysis.)
        k_at = (k_at // 8) * 8
        v_at = (v_at // 4) * 4
    # Query rows quantized per row to int8 (two terms with INT8_QK = 2), as _quantize_q,
    # shifted k_at columns right as K's boxes are: zeros where the boxes hold other bytes.
    qi0 = tile_q0 if PP else tile_q0 + W * WG_Q
    # Row chunks of the query's quantization (--q-chunks; 1: the straight run). The kernel
    # decides: it allocates qsc, the chunks' float32 row maxima, exactly when they are used.
    QCH: gl.constexpr = ((Q_CHUNKS if NUM_WG == 2 else Q_CHUNKS_ONE)
                         if qsc.dtype == gl.float32 else 1)
    if QCH > 1:
        q_sc = _quantize_chunked(q_ptr, qh_smem, ql_smem, qht, qlt, qsc, q_start, q_len,
                                 qi0, kv_head, stride_q_tok, stride_q_head, k_at, G,
                                 WG_Q, INT8_QK, W, QCH, ld_layout, kt_layout,
                                 gl.SliceLayout(1, s_layout))
    else:
        xa, xb, xc, amax = _query_scaled(
            q_ptr, 0, q_start, q_len, qi0, kv_head, stride_q_tok, stride_q_head, k_at,
            WG_ROWS, G, WG_Q, ld_layout, kt_layout)
        if Q_MAGIC:
            # |x| <= 127: x + 1.5 * 2**23 is rounded to an integer; less the constant, it is
            # the code as a float.
            ya = xa + 12582912.0
            yb = xb + 12582912.0
            yc = xc + 12582912.0
            ha = _low8(ya)
            hb = _low8(yb)
            hc = _low8(yc)
            ra = ya - 12582912.0
            rb = yb - 12582912.0
            rc = yc - 12582912.0
        else:
            ha = _rows8(xa)
            hb = _rows8(xb)
            hc = _rows8(xc)
        q_sc = amax / 127.0
        if INT8_QK == 2:
            q_sc = q_sc / 256.0
        if W == 0 or not PP:
            qh_smem.index(0).store(ha)
            qh_smem.index(1).store(hb)
            qht.store(hc)
            if INT8_QK == 2 and Q_MAGIC:
                ql_smem.index(0).store(_low_term(xa, ra))
                ql_smem.index(1).store(_low_term(xb, rb))
                qlt.store(_low_term(xc, rc))
            elif INT8_QK == 2:
                ql_smem.index(0).store(_rows8((xa - ha.to(gl.float32)) * 256.0))
                ql_smem.index(1).store(_rows8((xb - hb.to(gl.float32)) * 256.0))
                qlt.store(_rows8((xc - hc.to(gl.float32)) * 256.0))
            fence_async_shared()
            if PP:
                _partition_barrier()
                mbarrier.arrive(widened.index(0), count=1)
        else:
            mbarrier.wait(widened.index(0), 0)
    # The query's scale and qk_scale in one factor a row: a score costs one FMUL (by K's
    # scale) before the exponent's FFMA. Positive, so a masked -inf stays -inf.
    q_sc = gl.convert_layout(gl.maximum(q_sc, 1.0e-30) * qk_scale, gl.SliceLayout(1, s_layout))

    ctx = seq_len - q_len
    m_i = gl.full([WG_ROWS], -1.0e30, gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([WG_ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc0 = gl.zeros([WG_ROWS, CH8], gl.float32, layout=o_layout)
    acc1 = gl.zeros([WG_ROWS, CH8], gl.float32, layout=o_layout)
    acc2 = gl.zeros([WG_ROWS, SCB], gl.float32, layout=o2_layout)
    if OV:
        acc0 = warpgroup_mma_init(acc0)
        acc1 = warpgroup_mma_init(acc1)
        acc2 = warpgroup_mma_init(acc2)
    # The tiles every row sees whole (before the first row's causal limit and inside the
    # segment) run without a mask; only the tail tiles build one. The steady loop then holds
    # no masking block, and its compiled size is what each of its tiles issues.
    n_full = gl.minimum(gl.maximum(gl.minimum(ctx + qi0 + 1, kv_hi) - kv_lo, 0) // TILE_N,
                        n_tiles)
    if Q_REGS and not OV:
        # --q-regs: the high term's codes held in registers over the loop (36 a thread),
        # so Q.K's first term reads only K from shared memory. Every thread's stores are in
        # before any thread loads.
        _partition_barrier()
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout,
                                                     k_width=4)
        qa_r = qh_smem.index(0).load(a_layout)
        qb_r = qh_smem.index(1).load(a_layout)
        qt_r = qht.load(a_layout)
    else:
        qa_r = qh_smem.index(0)
        qb_r = qh_smem.index(1)
        qt_r = qht
    STEP: gl.constexpr = 2 if PP else 1
    first = W if PP else 0
    tail = n_full + (n_full + W) % 2 if PP else n_full
    if DIAG == 1 or DIAG == 3:
        # Diagnosis (--diagnose load-only, handshake-only): every tile is waited for and
        # handed back, no arithmetic; the partials hold the empty tile's values.
        for i in range(0, n_tiles):
            mbarrier.wait(ready.index(i % STAGES), (i // STAGES) & 1)
            mbarrier.arrive(empty.index(i % STAGES), count=1)
    elif OV:
        for i in range(0, n_full):
            m_i, l_i, acc0, acc1, acc2 = _tile8_ov(
                qh_smem, ql_smem, qht, qlt, bufs, kt_bufs, sc_bufs, vbf, vbft, p_smem, ready,
                empty, i, kv_lo, kv_hi, ctx, qi0, q_sc, k_at, v_at,
                m_i, l_i, acc0, acc1, acc2,
                qk_scale, G, TILE_N, STAGES, INT8_QK, False, LAZY, s_layout, o_layout,
                o2_layout, ld_layout, vt_layout)
        for i in range(n_full, n_tiles):
            m_i, l_i, acc0, acc1, acc2 = _tile8_ov(
                qh_smem, ql_smem, qht, qlt, bufs, kt_bufs, sc_bufs, vbf, vbft, p_smem, ready,
                empty, i, kv_lo, kv_hi, ctx, qi0, q_sc, k_at, v_at,
                m_i, l_i, acc0, acc1, acc2,
                qk_scale, G, TILE_N, STAGES, INT8_QK, True, LAZY, s_layout, o_layout,
                o2_layout, ld_layout, vt_layout)
        acc0, acc1, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1, acc2))
    elif PV_PIPE:
        s_zero = gl.zeros([WG_ROWS, TILE_N], gl.int32, layout=s_layout)
        mbarrier.wait(ready.index(0), 0)
        si = _qk_term(qh_smem.index(0), qh_smem.index(1), qht, bufs, kt_bufs, 0, s_zero)
        sl = _qk_term(ql_smem.index(0), ql_smem.index(1), qlt, bufs, kt_bufs, 0, s_zero)
        si, sl = warpgroup_mma_wait(num_outstanding=0, deps=(si, sl))
        sc = si * 256 + sl
        for i in range(0, n_full):
            m_i, l_i, sc = _tile8_sp(sc, qh_smem, ql_smem, qht, qlt, bufs, kt_bufs, sc_bufs,
                                     p_smem, a_smem, ready, empty, widened, i, n_tiles, kv_lo,
                                     kv_hi, ctx, qi0, q_sc, k_at, v_at, m_i, l_i, G, TILE_N,
                                     STAGES, False, s_layout)
        for i in range(n_full, n_tiles):
            m_i, l_i, sc = _tile8_sp(sc, qh_smem, ql_smem, qht, qlt, bufs, kt_bufs, sc_bufs,
                                     p_smem, a_smem, ready, empty, widened, i, n_tiles, kv_lo,
                                     kv_hi, ctx, qi0, q_sc, k_at, v_at, m_i, l_i, G, TILE_N,
                                     STAGES, True, s_layout)
    elif PV_WG:
        for i in range(0, n_full):
            m_i, l_i = _tile8_s(qh_smem, ql_smem, qht, qlt, bufs, kt_bufs, sc_bufs, p_smem,
                                a_smem, ready, empty, widened, i, kv_lo, kv_hi, ctx, qi0,
                                q_sc, k_at, v_at, m_i, l_i, G, TILE_N, STAGES, INT8_QK,
                                False, s_layout)
        for i in range(n_full, n_tiles):
            m_i, l_i = _tile8_s(qh_smem, ql_smem, qht, qlt, bufs, kt_bufs, sc_bufs, p_smem,
                                a_smem, ready, empty, widened, i, kv_lo, kv_hi, ctx, qi0,
                                q_sc, k_at, v_at, m_i, l_i, G, TILE_N, STAGES, INT8_QK,
                                True, s_layout)
    else:
        for i in range(first, n_full, STEP):
            m_i, l_i, acc0, acc1, acc2 = _tile8(
                qh_smem, ql_smem, qht, qlt, bufs, kt_bufs, sc_bufs, vbf, vbft, a_smem, ready,
                empty, widened, i, kv_lo, kv_hi, ctx, qi0, q_sc, k_at, v_at,
                m_i, l_i, acc0, acc1, acc2,
                qk_scale, G, TILE_N, STAGES, INT8_QK, False, LAZY, W, NUM_WG, PP, s_layout,
                o_layout,
                o2_layout, p_layout, p2_layout, ld_layout, vt_layout, qa_r, qb_r, qt_r)
        for i in range(tail, n_tiles, STEP):
            m_i, l_i, acc0, acc1, acc2 = _tile8(
                qh_smem, ql_smem, qht, qlt, bufs, kt_bufs, sc_bufs, vbf, vbft, a_smem, ready,
                empty, widened, i, kv_lo, kv_hi, ctx, qi0, q_sc, k_at, v_at,
                m_i, l_i, acc0, acc1, acc2,
                qk_scale, G, TILE_N, STAGES, INT8_QK, True, LAZY, W, NUM_WG, PP, s_layout,
                o_layout,
                o2_layout, p_layout, p2_layout, ld_layout, vt_layout, qa_r, qb_r, qt_r)

    r_o = gl.arange(0, WG_ROWS, layout=row_layout)
    d_o = gl.arange(0, CH8, layout=gl.SliceLayout(0, o_layout)) - v_at
    qi_o = qi0 + r_o // G
    ok_o = (r_o < WG_Q * G) & (qi_o < q_len)
    seg_o = seg + W if PP else seg
    part_row = (((seq * max_q + qi_o).to(gl.int64) * NUM_HEADS + kv_head * G + r_o % G)
                * NUM_SEGMENTS + seg_o)
    if V_SCALED:
        # --v-scaled: the row sums are the last column of acc2 (P x 1.0), in P's scale.
        c2 = gl.arange(0, SCB, layout=gl.SliceLayout(0, o2_layout))
        l2 = gl.sum(gl.where((c2 == SCB - 1)[None, :], acc2, 0.0), axis=1)
        l_i = gl.convert_layout(l2 / _p_scale(vbf.dtype, LAZY), l_i.type.layout)
    l_o = gl.convert_layout(l_i, row_layout)
    gl.store(part_max_ptr + part_row, gl.convert_layout(m_i, row_layout), mask=ok_o)
    gl.store(part_sum_ptr + part_row, l_o, mask=ok_o)
    if PV_WG:
        # The row sums to the P.V warpgroup, which normalises and stores the outputs.
        a_smem.index(2).store(l_i)
        _partition_barrier()
        mbarrier.arrive(widened.index(8), count=1)
    else:
        inv_l = gl.where(l_o > 0.0, 1.0 / (l_o * _p_scale(vbf.dtype, LAZY)), 0.0)[:, None]
        if DIAG == 4:
            # Diagnosis (--diagnose no-store): the partials' stores issued but predicated off (l
            # is never negative; the compiler cannot know, so nothing upstream is dropped).
            ok_o = ok_o & (l_o < -1.0)
        # Accumulator column c holds V's column c - v_at.
        if EPI_ROWS and (NUM_WG == 1 or EPI_SMEM) and not PP and not OV:
            # --epilogue rows (the default where it fits): each warp stores whole rows (32
            # threads x 4 columns), not the accumulator's 8-byte pairs of 8 rows (a quarter of
            # each sector used, ncu). The conversion takes 32 KiB of shared memory: one
            # warpgroup's 2 stages leave room (178 KiB in all), two warpgroups' do not (283).
            # H200, session 19: 6.4 / 5.7 / 5.7 us less at 16k / 64k / 128k (q = 8).
            st_layout: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])
            d_s = gl.arange(0, CH8, layout=gl.SliceLayout(0, st_layout)) - v_at
            row_s = gl.convert_layout(part_row, gl.SliceLayout(1, st_layout))
            ok_s = gl.convert_layout(ok_o, gl.SliceLayout(1, st_layout))
            s_base = part_out_ptr + row_s[:, None] * (2 * CH8) + d_s[None, :]
            if EPI_SMEM:
                # --epilogue smem: the conversion through shared memory the loop is done with,
                # not the compiler's 32 KiB of scratch, one accumulator after the other: the
                # widener's 16-bit V tiles (free once the last P.V has read them; that room is
                # a third stage's), or without the widener the int8 stages (every tile read by
                # now; with 32-key tiles a CTA then fits twice in an SM).
                st_smem: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
                if NUM_WG == 2:
                    # Two warpgroups (session 23): each releases a stage only after its P.V
                    # has read it, so once the last tile's stage is released by both, every
                    # int8 stage is free: half of them for each warpgroup's rows.
                    last = n_tiles - 1
                    mbarrier.wait(empty.index(last % STAGES), (last // STAGES) & 1)
                    ep = _f32_view(bufs, STAGES * TILE_N, CH8, st_smem).slice(W * WG_ROWS,
                                                                              WG_ROWS, 0)
                elif WIDEN_WG:
                    ep = _f32_view(vbf, 2 * WG_ROWS, CH8, st_smem).slice(0, WG_ROWS, 0)
                else:
                    ep = _f32_view(bufs, STAGES * TILE_N, CH8, st_smem).slice(0, WG_ROWS, 0)
                ep.store(acc0 * inv_l)
                _partition_barrier()
                gl.store(s_base, ep.load(st_layout), mask=ok_s[:, None] & (d_s >= 0)[None, :])
                _partition_barrier()
                ep.store(acc1 * inv_l)
                _partition_barrier()
                gl.store(s_base + CH8, ep.load(st_layout), mask=ok_s[:, None])
            else:
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
                     qlt, qsc, bufs, kt_bufs, sc_bufs, vbf, vbft, ready, empty, widened, seq,
                     kv_head, seg, q_start, q_len, seq_len, tile_q0, kv_lo, kv_hi, n_tiles,
                     qk_scale, max_q, stride_q_tok, stride_q_head, k_at, v_at,
                     NUM_HEADS: gl.constexpr, G: gl.constexpr, WG_Q: gl.constexpr,
                     TILE_N: gl.constexpr, NUM_SEGMENTS: gl.constexpr, STAGES: gl.constexpr,
                     INT8_QK: gl.constexpr, LAZY: gl.constexpr, PP: gl.constexpr):
    # The second warpgroup runs as a worker partition: its index is fixed here.
    _consume8(q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, qh_smem, ql_smem, qht, qlt,
              qsc, bufs, kt_bufs, sc_bufs, vbf, vbft, vbft, vbft,
             ready, empty, widened, seq, kv_head,
              seg, q_start, q_len, seq_len, tile_q0, kv_lo, kv_hi, n_tiles, qk_scale, max_q,
              stride_q_tok, stride_q_head, k_at, v_at, NUM_HEADS, G, WG_Q, TILE_N,
              NUM_SEGMENTS, STAGES, INT8_QK, LAZY, 1, 2, PP, False)


@gluon.jit
def _consume8_pp(q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, qh_smem, ql_smem, qht, qlt,
                 qsc, bufs, kt_bufs, sc_bufs, vbf, vbft, ready, empty, widened, seq, kv_head, seg,
                 q_start, q_len, seq_len, tile_q0, kv_lo, kv_hi, n_tiles, qk_scale, max_q,
                 stride_q_tok, stride_q_head, k_at, v_at, NUM_HEADS: gl.constexpr,
                 G: gl.constexpr, WG_Q: gl.constexpr, TILE_N: gl.constexpr,
                 NUM_SEGMENTS: gl.constexpr, STAGES: gl.constexpr, INT8_QK: gl.constexpr,
                 LAZY: gl.constexpr, W: gl.constexpr):
    # Ping-pong warpgroup W as a worker partition (PP_LOADER_DEFAULT).
    _consume8(q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, qh_smem, ql_smem, qht, qlt,
              qsc, bufs, kt_bufs, sc_bufs, vbf, vbft, vbft, vbft,
             ready, empty, widened, seq, kv_head,
              seg, q_start, q_len, seq_len, tile_q0, kv_lo, kv_hi, n_tiles, qk_scale, max_q,
              stride_q_tok, stride_q_head, k_at, v_at, NUM_HEADS, G, WG_Q, TILE_N,
              NUM_SEGMENTS, STAGES, INT8_QK, LAZY, W, 2, True, False)


@gluon.jit
def _ws_split_int8_kernel(part_out_ptr, part_max_ptr, part_sum_ptr, q_ptr, desc, kt_desc,
                          sc_desc,
                          block_table_ptr, seq_lens_ptr, cu_seqlens_q_ptr, qk_scale,
                          min_seg_tokens, max_q, stride_q_tok, stride_q_head, stride_bt,
                          rows_per_block, stride_kv_head,
                          out_ptr, sync_ptr, stride_o_tok, stride_o_head,
                          NUM_HEADS: gl.constexpr, G: gl.constexpr, BLOCK_SIZE: gl.constexpr,
                          WG_Q: gl.constexpr, NUM_WG: gl.constexpr, TILE_N: gl.constexpr,
                          BOX_T: gl.constexpr, NUM_SEGMENTS: gl.constexpr,
                          STAGES: gl.constexpr, HEAD: gl.constexpr, INT8_QK: gl.constexpr,
                          LAZY: gl.constexpr, V16: gl.constexpr, PP: gl.constexpr,
                          OV: gl.constexpr):
    """Grid (num_seqs, num_kv_heads, NUM_SEGMENTS): one query tile a request (q <= WG_Q x
    NUM_WG), segments split as the Triton split pass splits them. PP (ping-pong, two
    warpgroups on the same rows, alternate tiles): NUM_SEGMENTS / 2 programs a head, each
    over two segments' tokens, each warpgroup's partials a segment of their own. OV (one
    warpgroup only): the reordered tile of _tile8_ov."""
    pid = gl.program_id(0)
    kv_head = gl.program_id(1)
    seg = gl.program_id(2)
    seq = pid
    tile_q0 = 0
    q_start = gl.load(cu_seqlens_q_ptr + seq)
    q_len = gl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    seq_len = gl.load(seq_lens_ptr + seq)
    CTA_SEGMENTS: gl.constexpr = NUM_SEGMENTS // 2 if PP else NUM_SEGMENTS
    per_seg = gl.cdiv(gl.cdiv(seq_len, CTA_SEGMENTS), TILE_N) * TILE_N
    seg_tokens = gl.maximum(per_seg, min_seg_tokens)
    kv_lo = seg * seg_tokens
    tile_rows = gl.minimum(q_len, WG_Q * NUM_WG)
    kv_hi = gl.minimum(kv_lo + seg_tokens, seq_len - q_len + tile_rows)
    n_tiles = gl.cdiv(kv_hi - kv_lo, TILE_N)
    if kv_lo >= seq_len:
        e_layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        r = gl.arange(0, WG_ROWS * NUM_WG, layout=e_layout)
        qi = r // G
        ok = (r < WG_Q * NUM_WG * G) & (qi < q_len)
        for w in gl.static_range(2 if PP else 1):
            row = (((seq * max_q + qi).to(gl.int64) * NUM_HEADS + kv_head * G + r % G)
                   * NUM_SEGMENTS + seg * (2 if PP else 1) + w)
            gl.store(part_max_ptr + row,
                     gl.full([WG_ROWS * NUM_WG], -1.0e30, gl.float32, layout=e_layout),
                     mask=ok)
            gl.store(part_sum_ptr + row,
                     gl.zeros([WG_ROWS * NUM_WG], gl.float32, layout=e_layout), mask=ok)
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
        kt_bufs = gl.allocate_shared_memory(gl.int8, [STAGES, TILE_N, KT], kt_layout)
        sc_bufs = gl.allocate_shared_memory(gl.int8, [STAGES * 2, TILE_N, SCB], sc_layout)
        qh = gl.allocate_shared_memory(gl.int8, [2, WG_ROWS, CH8], q8_layout)
        ql = gl.allocate_shared_memory(gl.int8, [2, WG_ROWS, CH8], q8_layout)
        qht = gl.allocate_shared_memory(gl.int8, [WG_ROWS, KT], kt_layout)
        qlt = gl.allocate_shared_memory(gl.int8, [WG_ROWS, KT], kt_layout)
        if not PP and Q_MAGIC and (Q_CHUNKS if NUM_WG == 2 else Q_CHUNKS_ONE) > 1:
            # Each warpgroup's row maxima, as --q-chunks writes them a chunk at a time (the
            # consumers chunk exactly when this is allocated: the one place of that rule).
            qsc = gl.allocate_shared_memory(gl.float32, [2, WG_ROWS],
                                            gl.SwizzledSharedLayout(1, 1, 1, [0]))
        else:
            qsc = qht
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        widened = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        # With the widener warpgroup a stage is released by it and the consumer.
        WIDENS: gl.constexpr = WIDEN_WG and NUM_WG == 1 and not PP and not OV
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            # Every consumer warpgroup releases a stage, and (two of them) widens half of V.
            # With PP one warpgroup reads a stage, and widened[0] says the query is there.
            mbarrier.init(empty.index(i), count=1 if PP else NUM_WG + WIDENS)
            mbarrier.init(widened.index(i), count=1 if PP else NUM_WG)
        bt_row = block_table_ptr + seq.to(gl.int64) * stride_bt
        # A head's K and V rarely start on the 16-byte boundary a TMA box must (a row of a
        # head is 2 x (HEAD + 4) bytes): the boxes start at the boundary below, k_at and v_at
        # bytes before the codes.
        col_k = kv_head * stride_kv_head
        col_v = col_k + HEAD + 4
        k_at = col_k % 16
        v_at = col_v % 16
        a_k = col_k - k_at
        a_v = col_v - v_at
        if PP and not PP_LOADER_DEFAULT:
            # Two warpgroups on alternate tiles of the same rows: one query copy, a 16-bit V
            # tile each; their partials are segments 2 seg and 2 seg + 1.
            vbf = gl.allocate_shared_memory(V16, [4, TILE_N, CH8], vbf_layout)
            vbft = gl.allocate_shared_memory(V16, [2, TILE_N, SCB], vbft_layout)
            gl.warp_specialize([
                (_consume8, (q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, qh, ql, qht, qlt,
                             qsc, bufs, kt_bufs, sc_bufs, vbf, vbft, vbft, vbft,
             ready, empty, widened,
                             seq, kv_head, seg * 2, q_start, q_len, seq_len, tile_q0, kv_lo,
                             kv_hi, n_tiles, qk_scale, max_q, stride_q_tok, stride_q_head,
                             k_at, v_at, NUM_HEADS, G, WG_Q, TILE_N, NUM_SEGMENTS, STAGES,
                             INT8_QK, LAZY, 0, 2, True, False)),
                (_consume8_second, (q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, qh, ql,
                                    qht, qlt, qsc, bufs, kt_bufs, sc_bufs, vbf, vbft, ready,
                                    empty, widened, seq, kv_head, seg * 2, q_start, q_len,
                                    seq_len, tile_q0, kv_lo, kv_hi, n_tiles, qk_scale, max_q,
                                    stride_q_tok, stride_q_head, k_at, v_at, NUM_HEADS, G,
                                    WG_Q, TILE_N, NUM_SEGMENTS, STAGES, INT8_QK, LAZY, True)),
                (_loader8, (desc, kt_desc, sc_desc, bufs, kt_bufs, sc_bufs, ready, empty,
                            bt_row, kv_lo, kv_hi, n_tiles, rows_per_block, a_k, a_v,
                            BLOCK_SIZE, TILE_N, BOX_T, HEAD, STAGES)),
            ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
        elif PP:
            # The same two warpgroups, both workers, so each gets CONSUMER_REGS; the loader
            # runs in the default partition on what is left (its TMA issue, waits and
            # arrivals are one thread's, as in a worker warp).
            vbf = gl.allocate_shared_memory(V16, [4, TILE_N, CH8], vbf_layout)
            vbft = gl.allocate_shared_memory(V16, [2, TILE_N, SCB], vbft_layout)
            gl.warp_specialize([
                (_loader8, (desc, kt_desc, sc_desc, bufs, kt_bufs, sc_bufs, ready, empty,
                            bt_row, kv_lo, kv_hi, n_tiles, rows_per_block, a_k, a_v,
                            BLOCK_SIZE, TILE_N, BOX_T, HEAD, STAGES)),
                (_consume8_pp, (q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, qh, ql, qht,
                                qlt, qsc, bufs, kt_bufs, sc_bufs, vbf, vbft, ready, empty,
                                widened, seq, kv_head, seg * 2, q_start, q_len, seq_len,
                                tile_q0, kv_lo, kv_hi, n_tiles, qk_scale, max_q,
                                stride_q_tok, stride_q_head, k_at, v_at, NUM_HEADS, G, WG_Q,
                                TILE_N, NUM_SEGMENTS, STAGES, INT8_QK, LAZY, 0)),
                (_consume8_pp, (q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, qh, ql, qht,
                                qlt, qsc, bufs, kt_bufs, sc_bufs, vbf, vbft, ready, empty,
                                widened, seq, kv_head, seg * 2, q_start, q_len, seq_len,
                                tile_q0, kv_lo, kv_hi, n_tiles, qk_scale, max_q,
                                stride_q_tok, stride_q_head, k_at, v_at, NUM_HEADS, G, WG_Q,
                                TILE_N, NUM_SEGMENTS, STAGES, INT8_QK, LAZY, 1)),
            ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])
        elif NUM_WG == 2:
            # A 16-bit V tile a stage: the two warpgroups' P.V may be a tile apart.
            vbf = gl.allocate_shared_memory(V16, [STAGES * 2, TILE_N, CH8], vbf_layout)
            vbft = gl.allocate_shared_memory(V16, [STAGES, TILE_N, SCB], vbft_layout)
            qh1 = gl.allocate_shared_memory(gl.int8, [2, WG_ROWS, CH8], q8_layout)
            ql1 = gl.allocate_shared_memory(gl.int8, [2, WG_ROWS, CH8], q8_layout)
            qht1 = gl.allocate_shared_memory(gl.int8, [WG_ROWS, KT], kt_layout)
            qlt1 = gl.allocate_shared_memory(gl.int8, [WG_ROWS, KT], kt_layout)
            gl.warp_specialize([
                (_consume8, (q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, qh, ql, qht, qlt,
                             qsc, bufs, kt_bufs, sc_bufs, vbf, vbft, vbft, vbft,
             ready, empty, widened,
                             seq, kv_head, seg, q_start, q_len, seq_len, tile_q0, kv_lo, kv_hi,
                             n_tiles, qk_scale, max_q, stride_q_tok, stride_q_head, k_at, v_at,
                             NUM_HEADS, G, WG_Q, TILE_N, NUM_SEGMENTS, STAGES, INT8_QK, LAZY,
                             0, 2, False, False)),
                (_consume8_second, (q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, qh1, ql1,
                                    qht1, qlt1, qsc, bufs, kt_bufs, sc_bufs, vbf, vbft, ready,
                                    empty, widened, seq, kv_head, seg, q_start, q_len, seq_len,
                                    tile_q0, kv_lo, kv_hi, n_tiles, qk_scale, max_q,
                                    stride_q_tok, stride_q_head, k_at, v_at, NUM_HEADS, G,
                                    WG_Q, TILE_N, NUM_SEGMENTS, STAGES, INT8_QK, LAZY,
                                    False)),
                (_loader8, (desc, kt_desc, sc_desc, bufs, kt_bufs, sc_bufs, ready, empty,
                            bt_row, kv_lo, kv_hi, n_tiles, rows_per_block, a_k, a_v,
                            BLOCK_SIZE, TILE_N, BOX_T, HEAD, STAGES)),
            ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
        elif WIDENS and PV_WG:
            # The widener's two 16-bit V tiles and barriers (0..3, as below), two P buffers
            # and their barriers (full 4..5, free 6..7), and the row sums' (8).
            vbf = gl.allocate_shared_memory(V16, [4, TILE_N, CH8], vbf_layout)
            vbft = gl.allocate_shared_memory(V16, [2, TILE_N, SCB], vbft_layout)
            p_smem = gl.allocate_shared_memory(V16, [2, WG_ROWS, TILE_N], vbf_layout)
            a_smem = gl.allocate_shared_memory(gl.float32, [4, WG_ROWS],
                                               gl.SwizzledSharedLayout(1, 1, 1, [0]))
            vbars = gl.allocate_shared_memory(gl.int64, [9, 1], mbarrier.MBarrierLayout())
            for i in gl.static_range(9):
                mbarrier.init(vbars.index(i), count=1)
            gl.warp_specialize([
                (_consume8, (q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, qh, ql, qht, qlt,
                             qsc, bufs, kt_bufs, sc_bufs, vbf, vbft, p_smem, a_smem, ready,
                             empty, vbars, seq, kv_head, seg, q_start, q_len, seq_len, tile_q0,
                             kv_lo, kv_hi, n_tiles, qk_scale, max_q, stride_q_tok,
                             stride_q_head, k_at, v_at, NUM_HEADS, G, WG_Q, TILE_N,
                             NUM_SEGMENTS, STAGES, INT8_QK, LAZY, 0, 1, False, False)),
                (_loader8, (desc, kt_desc, sc_desc, bufs, kt_bufs, sc_bufs, ready, empty,
                            bt_row, kv_lo, kv_hi, n_tiles, rows_per_block, a_k, a_v,
                            BLOCK_SIZE, TILE_N, BOX_T, HEAD, STAGES)),
                (_widener8, (bufs, sc_bufs, vbf, vbft, vbft, ready, empty, vbars, n_tiles, k_at,
                             v_at, kv_lo, kv_hi, STAGES)),
                (_pv8, (part_out_ptr, p_smem, a_smem, vbf, vbft, vbars, seq, kv_head, seg,
                        q_len, tile_q0, n_tiles, max_q, v_at, NUM_HEADS, G, WG_Q,
                        NUM_SEGMENTS)),
            ], [1, 4, 4], [LOADER_REGS, WIDENER_REGS, PV_REGS])
        elif WIDENS:
            # Two 16-bit V tiles (the widener runs up to two tiles ahead of P.V) and their
            # barriers: full 0..1 (the widener arrives), free 2..3 (the consumer's P.V).
            vbf = gl.allocate_shared_memory(V16, [4, TILE_N, CH8], vbf_layout)
            vbft = gl.allocate_shared_memory(V16, [2, TILE_N, SCB], vbft_layout)
            # (--scales widener: and the scale vectors' full barriers, 4..5.)
            NVB: gl.constexpr = 6 if SCALES_AT == 2 else 4
            vbars = gl.allocate_shared_memory(gl.int64, [NVB, 1], mbarrier.MBarrierLayout())
            for i in gl.static_range(NVB):
                mbarrier.init(vbars.index(i), count=1)
            if SCALES_AT == 2:
                # --scales widener: K's and V's scales of each 16-bit V tile, as float32.
                scv = gl.allocate_shared_memory(gl.float32, [4, TILE_N],
                                                gl.SwizzledSharedLayout(1, 1, 1, [0]))
            else:
                scv = vbft
            gl.warp_specialize([
                (_consume8, (q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, qh, ql, qht, qlt,
                             qsc, bufs, kt_bufs, sc_bufs, vbf, vbft, vbft, scv,
             ready, empty, vbars,
                             seq, kv_head, seg, q_start, q_len, seq_len, tile_q0, kv_lo, kv_hi,
                             n_tiles, qk_scale, max_q, stride_q_tok, stride_q_head, k_at, v_at,
                             NUM_HEADS, G, WG_Q, TILE_N, NUM_SEGMENTS, STAGES, INT8_QK, LAZY,
                             0, 1, False, False)),
                (_loader8, (desc, kt_desc, sc_desc, bufs, kt_bufs, sc_bufs, ready, empty,
                            bt_row, kv_lo, kv_hi, n_tiles, rows_per_block, a_k, a_v,
                            BLOCK_SIZE, TILE_N, BOX_T, HEAD, STAGES)),
                (_widener8, (bufs, sc_bufs, vbf, vbft, scv, ready, empty, vbars, n_tiles, k_at,
                             v_at, kv_lo, kv_hi, STAGES)),
            ], [1, 4], [LOADER_REGS, WIDENER_REGS])
        else:
            # OV widens a tile's V while the previous tile's P.V still reads its own: two
            # 16-bit V tiles, and P in shared memory.
            vbf = gl.allocate_shared_memory(V16, [4 if OV else 2, TILE_N, CH8], vbf_layout)
            vbft = gl.allocate_shared_memory(V16, [2 if OV else 1, TILE_N, SCB], vbft_layout)
            p_smem = gl.allocate_shared_memory(V16, [WG_ROWS if OV else 8,
                                                     TILE_N if OV else 64], vbf_layout)
            gl.warp_specialize([
                (_consume8, (q_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, qh, ql, qht, qlt,
                             qsc, bufs, kt_bufs, sc_bufs, vbf, vbft, p_smem, p_smem,
             ready, empty, widened,
                             seq, kv_head, seg, q_start, q_len, seq_len, tile_q0, kv_lo, kv_hi,
                             n_tiles, qk_scale, max_q, stride_q_tok, stride_q_head, k_at, v_at,
                             NUM_HEADS, G, WG_Q, TILE_N, NUM_SEGMENTS, STAGES, INT8_QK, LAZY,
                             0, 1, False, OV)),
                (_loader8, (desc, kt_desc, sc_desc, bufs, kt_bufs, sc_bufs, ready, empty,
                            bt_row, kv_lo, kv_hi, n_tiles, rows_per_block, a_k, a_v,
                            BLOCK_SIZE, TILE_N, BOX_T, HEAD, STAGES)),
            ], [1], [LOADER_REGS])


# ---- host side -------------------------------------------------------------------------


def descriptors(key_cache: Any, box_t: int) -> tuple[Any, Any, Any, int, int]:
    """TMA descriptors over the whole int8_per_token_head buffer seen as [token rows, bytes of
    a token row] (key_cache's base is the buffer's: K comes first in each head's row): one for
    the 128-byte code chunks (128-byte swizzle), one for K's 32-byte tail (32-byte swizzle,
    a Q.K k-step) and one for the 16-byte boxes (V's tail, the scales); and the rows a block
    and the bytes a head, which the kernel's coordinates need."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    num_blocks, block_size, num_kv_heads, padded = key_cache.shape
    s_blk, s_slot, s_head = key_cache.stride()[:3]
    if key_cache.stride(3) != 1 or s_head != 2 * padded or s_slot != num_kv_heads * s_head:
        raise ValueError("not an int8_per_token_head cache: each (token, head) must hold "
                         f"[K | K scale | V | V scale] contiguously, strides {key_cache.stride()}")
    rows_per_block = s_blk // s_slot
    rows = (num_blocks - 1) * rows_per_block + block_size
    codes = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    tail = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=8, rank=2)
    plain = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)
    desc = TensorDescriptor(key_cache, [rows, s_slot], [s_slot, 1], [box_t, CH8.value], codes)
    kt_desc = TensorDescriptor(key_cache, [rows, s_slot], [s_slot, 1], [box_t, KT.value], tail)
    sc_desc = TensorDescriptor(key_cache, [rows, s_slot], [s_slot, 1], [box_t, SCB.value],
                               plain)
    return desc, kt_desc, sc_desc, rows_per_block, s_head


@gluon.jit
def _probe_kernel(desc, out_ptr, col):
    """One TMA box of 16 rows x 128 bytes from column ``col`` of desc's tensor, copied out."""
    buf = gl.allocate_shared_memory(gl.int8, [16, CH8], desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bar.index(0), count=1)
    mbarrier.expect(bar.index(0), 16 * CH8)
    _tma_load(desc, [0, col], bar.index(0), buf)
    mbarrier.wait(bar.index(0), 0)
    ld: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    r = gl.arange(0, 16, layout=gl.SliceLayout(1, ld))
    c = gl.arange(0, CH8, layout=gl.SliceLayout(0, ld))
    gl.store(out_ptr + r[:, None] * CH8 + c[None, :], buf.load(ld))


def probe_tma_column(col: int, row_bytes: int = 2080) -> str:
    """Whether a 128-byte TMA box (128-byte swizzle) may start ``col`` bytes into a row of
    an int8 tensor whose base and row pitch are 16-byte aligned: 'ok', 'wrong data' or the
    error. A fault poisons the CUDA context, so call it once a process."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    gen = torch.Generator(device="cuda").manual_seed(col)
    x = torch.randint(-128, 128, (64, row_bytes), dtype=torch.int8, device="cuda",
                      generator=gen)
    codes = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    desc = TensorDescriptor(x, [64, row_bytes], [row_bytes, 1], [16, CH8.value], codes)
    out = torch.empty(16, CH8.value, dtype=torch.int8, device="cuda")
    try:
        _probe_kernel[(1,)](desc, out, col, num_warps=4)
        torch.cuda.synchronize()
    except Exception as exc:  # the answer sought: how the hardware takes the box
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    want = torch.zeros_like(out)
    span = min(CH8.value, row_bytes - col)
    want[:, :span] = x[:16, col:col + span]
    return "ok" if torch.equal(out, want) else "wrong data"


def warpgroups(q: int, group: int) -> tuple[int, int]:
    """Consumer warpgroups and query tokens each for q tokens of G = group heads: one
    warpgroup while q x G fits its 64 rows, else two with the tokens split evenly."""
    num_wg = -(-q * group // WG_ROWS.value)
    wg_q = -(-q // num_wg)
    if num_wg > 2 or wg_q * group > WG_ROWS.value:
        raise ValueError(f"the candidate handles q x G <= 128 rows in two warpgroups: q={q}, "
                         f"G={group}")
    return num_wg, wg_q


def launch(batch: Any, workspace: Any, plan: Any, qk_scale: float, int8_qk: int,
           stages: int, lazy: bool = False, v_tile: str = "bf16",
           pingpong: bool = False, overlap: bool = False) -> None:
    """The split pass into ``workspace``'s partials (qk_scale includes log2(e)); the tree's
    reduce pass (launch_reduce with the same plan) turns them into the output. pingpong: two
    warpgroups on alternate tiles of one warpgroup's rows, half the plan's segments as
    programs. overlap: the reordered tile (_tile8_ov), one warpgroup of rows only."""
    q, key_cache = batch.query, batch.key_cache
    num_heads, head_size = q.shape[1], q.shape[2]
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    if head_size != 2 * CH8.value:
        raise ValueError("the candidate handles head size 256 only")
    num_wg, wg_q = warpgroups(batch.max_query_len, group)
    if pingpong:
        if num_wg != 1 or plan.num_segments % 2:
            raise ValueError(f"ping-pong takes one warpgroup of rows and an even number of "
                             f"segments, not q={batch.max_query_len} x G={group} over "
                             f"{plan.num_segments}")
        num_wg = 2
    if overlap and num_wg != 1:
        raise ValueError(f"the overlapped tile takes one warpgroup of rows, not "
                         f"q={batch.max_query_len} x G={group}")
    if block_size % BOX_T:
        raise ValueError(f"cache blocks of {block_size} tokens: the candidate boxes {BOX_T}")
    desc, kt_desc, sc_desc, rows_per_block, s_head = descriptors(key_cache, BOX_T)
    grid = (batch.seq_lens.shape[0], num_kv_heads, plan.num_segments // (2 if pingpong else 1))
    _ws_split_int8_kernel[grid](
        workspace.part_out, workspace.part_max, workspace.part_sum, q, desc, kt_desc, sc_desc,
        batch.block_table, batch.seq_lens, batch.cu_seqlens_q, qk_scale,
        plan.min_segment_tokens, batch.max_query_len, q.stride(0), q.stride(1),
        batch.block_table.stride(0), rows_per_block, s_head,
        # The series' output, counters and output strides (its merge of the partials,
        # FUSE): unread here, passed so that the two compile to the same machine code.
        workspace.part_out, workspace.part_max, 0, 0,
        NUM_HEADS=num_heads, G=num_heads // num_kv_heads, BLOCK_SIZE=block_size,
        WG_Q=wg_q, NUM_WG=num_wg, TILE_N=TILE_N, BOX_T=BOX_T,
        NUM_SEGMENTS=plan.num_segments, STAGES=stages, HEAD=head_size, INT8_QK=int8_qk,
        LAZY=lazy, V16=V_TILES[v_tile], PP=pingpong, OV=overlap, num_warps=4,
        maxnreg=MAXNREG,
    )


def compile_sm90(int8_qk: int, stages: int = 2, q: int = 8, segments: int = 32,
                 lazy: bool = False, v_tile: str = "bf16", pingpong: bool = False,
                 overlap: bool = False) -> Any:
    """The kernel compiled ahead of time for sm_90a (no GPU): 24/4 heads, head size 256,
    16-token blocks."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = _ws_split_int8_kernel
    codes = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    tail = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=8, rank=2)
    plain = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)
    signature: dict[str, str] = {}
    for name in fn.arg_names:
        if name == "part_out_ptr":
            signature[name] = "*" + PARTIALS
        elif name.startswith("part_"):
            signature[name] = "*fp32"
        elif name in ("q_ptr", "out_ptr"):
            signature[name] = "*bf16"
        elif name == "desc":
            signature[name] = f"tensordesc<i8[{BOX_T}, {CH8.value}],{codes!r}>"
        elif name == "kt_desc":
            signature[name] = f"tensordesc<i8[{BOX_T}, {KT.value}],{tail!r}>"
        elif name == "sc_desc":
            signature[name] = f"tensordesc<i8[{BOX_T}, {SCB.value}],{plain!r}>"
        elif name.endswith("_ptr"):
            signature[name] = "*i32"
        elif name == "qk_scale":
            signature[name] = "fp32"
        elif name.startswith("stride_q") or name == "stride_bt":
            signature[name] = "i64"
        elif name in ("min_seg_tokens", "max_q", "rows_per_block", "stride_kv_head",
                      "stride_o_tok", "stride_o_head"):
            signature[name] = "i32"
        else:
            signature[name] = "constexpr"
    num_wg, wg_q = warpgroups(q, 6)
    if pingpong:
        num_wg = 2
    constexprs = {"NUM_HEADS": 24, "G": 6, "BLOCK_SIZE": 16, "WG_Q": wg_q, "NUM_WG": num_wg,
                  "TILE_N": TILE_N,
                  "BOX_T": BOX_T, "NUM_SEGMENTS": segments, "STAGES": stages, "HEAD": 256,
                  "INT8_QK": int8_qk, "LAZY": lazy, "V16": V_TILES[v_tile], "PP": pingpong,
                  "OV": overlap}
    # As the launch specialises them: the pointers, and the query's strides (multiples of 16
    # at these shapes; the JIT marks an integer argument divisible by 16 when it is). The
    # cache's head stride (520 bytes) is not, and the block table's varies with the batch.
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name.endswith("_ptr") or name.startswith(("stride_q", "stride_o"))}
    source = GluonASTSource(
        fn, signature,
        constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()}, attrs=attrs,
    )
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "maxnreg": MAXNREG})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", help="directory that contains patched vllm/ (device runs)")
    parser.add_argument("--cubin-dir", type=Path, default=None,
                        help="with --compile-only: also write each kernel's cubin there, as "
                        "VARIANT-qQ.cubin (the patch tier compares the series' SASS with it)")
    parser.add_argument("--compile-only", action="store_true",
                        help="compile for sm_90a and print the loop's instruction budget")
    parser.add_argument("--contexts", default="16384,65536,131072")
    parser.add_argument("--int8-qk", default="1,2", help="comma-separated Q.K modes (1, 2)")
    parser.add_argument("--lazy", default="0,1",
                        help="comma-separated: 0 rescales every tile, 1 only past RESCALE_LOG2")
    parser.add_argument("--v-tile", default="bf16,fp16",
                        help="comma-separated dtypes V is widened into: bf16, fp16")
    parser.add_argument("--queries", default="8,16", help="comma-separated verify lengths")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--scale-load", choices=sorted(SCALE_LOADS), default="convert",
                        help="how a tile's scales are read (see SCALE_LOADS)")
    parser.add_argument("--segments", type=int, default=None,
                        help="KV segments a request (a power of two; default: the Hopper "
                        "planner's)")
    parser.add_argument("--maxnreg", type=int, default=None,
                        help="registers a thread at launch (the partitions' setmaxnreg share "
                        "them out; default 168); 9 warps (two consumer warpgroups) allow up "
                        "to 224")
    parser.add_argument("--pingpong", action="store_true",
                        help="two warpgroups on alternate tiles of one warpgroup's rows "
                        "(q x G <= 64); give --segments twice the programs wanted")
    parser.add_argument("--pingpong-roles", choices=("consumer-default", "loader-default"),
                        default="consumer-default",
                        help="with --pingpong: warpgroup 0 is the default partition and the "
                        "loader a 1-warp worker (session 17), or the loader is the default "
                        "partition and both warpgroups are workers with --consumer-regs each")
    parser.add_argument("--consumer-regs", type=int, default=None,
                        help="registers of a worker consumer warpgroup after setmaxnreg "
                        "(default 240)")
    parser.add_argument("--overlap", action="store_true",
                        help="one warpgroup's tile reordered so the MMAs run beside the "
                        "scale reads, the V widening and the next tile (_tile8_ov; q x G <= "
                        "64)")
    parser.add_argument("--v-load", choices=sorted(V_LOADS), default="narrow",
                        help="how a thread holds V's codes as it widens them (see V_LOADS)")
    parser.add_argument("--epilogue", choices=("accumulator", "rows", "smem"), default="rows",
                        help="store the partials from the accumulator's layout, or a row a "
                        "warp after a layout conversion (coalesced; one warpgroup without "
                        "--pingpong or --overlap only, the accumulator's layout elsewhere); "
                        "smem: rows, converted through the V tiles or the int8 stages")
    parser.add_argument("--v-widen", choices=("consumer", "warpgroup"), default="warpgroup",
                        help="who widens V into the 16-bit tile: a worker warpgroup of its own "
                        "into two tiles (one warpgroup of rows without --pingpong or "
                        "--overlap; the consumers elsewhere), or the consumer warpgroup")
    parser.add_argument("--shift-hints", choices=("on", "off"), default="on",
                        help="tell the compiler that K's and V's byte offsets are multiples of "
                        "8 and 4 (the query's loads and the partials' stores become 16-byte "
                        "vectors), or not")
    parser.add_argument("--widener-regs", type=int, default=None,
                        help="with --v-widen warpgroup: the widener's registers after "
                        "setmaxnreg (default 64)")
    parser.add_argument("--k-tail", choices=("box", "v-chunk"), default="v-chunk",
                        help="K's tail and scale as boxes of their own (7 a block) or read "
                        "from V's first chunk (5 a block)")
    parser.add_argument("--block-table", choices=("per-box", "ahead"), default="per-box",
                        help="the loader reads a box's block-table entry just before the box, "
                        "or each tile's entries as one vector two tiles ahead")
    parser.add_argument("--diagnose", choices=sorted(DIAGNOSES), default="none",
                        help="time the loader alone (load-only), the consumer alone "
                        "(compute-only), neither (handshake-only), the kernel without the "
                        "partials' stores (no-store) or without the query's loads "
                        "(no-query-load), with two consumer warpgroups without the V "
                        "widening (no-widen), or without Q.K (no-qk); the outputs are wrong")
    parser.add_argument("--tile-n", type=int, choices=(32, 64), default=64,
                        help="keys a tile; at 32 a CTA's shared memory would let two share an "
                        "SM, but the launch's registers (8 warps x 168) allow one")
    parser.add_argument("--q-chunks", type=int, choices=(1, 2, 4, 8), default=4,
                        help="with two consumer warpgroups (q = 16): quantize the query this "
                        "many row chunks at a time in a loop (default 4; 1: one straight "
                        "run); magic rounding only, not with --pingpong (which keeps the "
                        "straight run)")
    parser.add_argument("--q-chunks-one", type=int, choices=(1, 2, 4, 8), default=1,
                        help="the same with one consumer warpgroup (q <= 8; default 1)")
    parser.add_argument("--q-live", action="store_true",
                        help="with --q-chunks / --q-chunks-one: skip the chunks past a "
                        "warpgroup's live rows (see Q_LIVE)")
    parser.add_argument("--q-unroll", action="store_true",
                        help="with --q-chunks / --q-chunks-one: the chunk loop unrolled")
    parser.add_argument("--scales", choices=sorted(SCALES_ATS), default="after",
                        help="where a tile's K and V scales are put in the score columns' "
                        "layout (see SCALES_AT)")
    parser.add_argument("--v-scaled", action="store_true",
                        help="with --scales widener (q <= 10, eager, fp16 V): V's scales "
                        "applied as it is widened, the row sums from P.V (see V_SCALED)")
    parser.add_argument("--widener-release", choices=("late", "early"), default="late",
                        help="with --v-scaled: when the widener releases the int8 stage (see "
                        "WIDENER_RELEASE_EARLY)")
    parser.add_argument("--q-round", choices=("floor", "magic"), default="magic",
                        help="how the query's codes are rounded: by adding 1.5 * 2**23, or "
                        "floor(x + 0.5) and conversions (before session 23)")
    parser.add_argument("--widen-at", choices=sorted(WIDEN_ATS), default="softmax",
                        help="two consumer warpgroups: each widens its half of V after its "
                        "softmax (the default), while its first Q.K term runs (qk), or "
                        "after issuing both terms (qk-both); see WIDEN_AT")
    parser.add_argument("--q-regs", action="store_true",
                        help="the query's high term as Q.K's A operand from registers (see "
                        "Q_REGS; not with --overlap)")
    parser.add_argument("--qk-wait", choices=("each", "once"), default="each",
                        help="wait for each Q.K term before issuing the next (the default), or "
                        "issue both and wait once (see QK_ONCE)")
    parser.add_argument("--partials", choices=("fp32", "fp16"), default="fp32",
                        help="dtype of the partial outputs (see PARTIALS)")
    parser.add_argument("--pv-wg", action="store_true",
                        help="P.V in a warpgroup of its own, P handed over through shared "
                        "memory (q = 8, eager, widener on; 128 registers at launch)")
    parser.add_argument("--pv-pipe", action="store_true",
                        help="with --pv-wg: the next tile's Q.K issued before this tile's "
                        "softmax (two terms)")
    parser.add_argument("--pv-regs", type=int, default=None,
                        help="the P.V warpgroup's registers after setmaxnreg (default 192)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--probe-column", type=int, default=None,
                        help="on a GPU: load one TMA box from this byte column and say how "
                        "it went (one column a process)")
    args = parser.parse_args()
    global SCALE_LOAD_LAYOUT, SCALE_DIRECT, PINGPONG, OVERLAP, MAXNREG
    global KT_FROM_V, BT_AHEAD, DIAG, TILE_N, PP_LOADER_DEFAULT, CONSUMER_REGS
    global V_LOAD_LAYOUT, EPI_ROWS, EPI_SMEM, WIDEN_WG, WIDENER_REGS, VEC_SHIFTS, Q_MAGIC
    global Q_CHUNKS, Q_CHUNKS_ONE, WIDEN_AT, PARTIALS, QK_ONCE, Q_REGS, PV_WG, PV_REGS
    global PV_PIPE, Q_LIVE, Q_UNROLL, SCALES_AT, V_SCALED, WIDENER_RELEASE_EARLY
    QK_ONCE = gl.constexpr(args.qk_wait == "once")
    Q_REGS = gl.constexpr(args.q_regs)
    PARTIALS = args.partials
    WIDEN_AT = gl.constexpr(WIDEN_ATS[args.widen_at])
    Q_MAGIC = gl.constexpr(args.q_round == "magic")
    Q_CHUNKS = gl.constexpr(args.q_chunks)
    Q_CHUNKS_ONE = gl.constexpr(args.q_chunks_one)
    Q_LIVE = gl.constexpr(args.q_live)
    SCALES_AT = gl.constexpr(SCALES_ATS[args.scales])
    V_SCALED = gl.constexpr(args.v_scaled)
    WIDENER_RELEASE_EARLY = gl.constexpr(args.widener_release == "early")
    if args.widener_release == "early" and not args.v_scaled:
        parser.error("--widener-release early takes --v-scaled")
    if args.v_scaled and (args.scales != "widener" or args.lazy != "0"
                          or args.v_tile != "fp16"
                          or any(int(q) * 6 > 64 for q in args.queries.split(",") if q)):
        parser.error("--v-scaled takes --scales widener, --lazy 0, --v-tile fp16 and one "
                     "warpgroup of rows (q <= 10)")
    Q_UNROLL = gl.constexpr(args.q_unroll)
    V_LOAD_LAYOUT = gl.constexpr(V_LOADS[args.v_load])
    EPI_ROWS = gl.constexpr(args.epilogue in ("rows", "smem"))
    EPI_SMEM = gl.constexpr(args.epilogue == "smem")
    TILE_N = args.tile_n
    if OVERLAP and TILE_N != 64:
        parser.error("--overlap takes 64-key tiles")
    DIAG = gl.constexpr(DIAGNOSES[args.diagnose])
    KT_FROM_V = gl.constexpr(args.k_tail == "v-chunk")
    BT_AHEAD = gl.constexpr(args.block_table == "ahead")
    PINGPONG = args.pingpong
    PP_LOADER_DEFAULT = gl.constexpr(PINGPONG and args.pingpong_roles == "loader-default")
    if args.pingpong_roles == "loader-default" and not PINGPONG:
        parser.error("--pingpong-roles takes --pingpong")
    if PP_LOADER_DEFAULT and BT_AHEAD:
        parser.error("--block-table ahead lays its vector over one warp: not with the loader "
                     "as the 4-warp default partition")
    if args.consumer_regs is not None:
        CONSUMER_REGS = gl.constexpr(args.consumer_regs)
    OVERLAP = args.overlap
    WIDEN_WG = gl.constexpr(args.v_widen == "warpgroup")
    VEC_SHIFTS = gl.constexpr(args.shift_hints == "on")
    if args.widener_regs is not None:
        WIDENER_REGS = gl.constexpr(args.widener_regs)
    if EPI_SMEM and not WIDEN_WG and args.stages & (args.stages - 1):
        # The stages' float32 view must have a power-of-two shape (Triton 3.6 and 3.9).
        parser.error("--epilogue smem with --v-widen consumer takes 2 or 4 stages")
    if OVERLAP and args.q_regs:
        parser.error("--q-regs does not apply to --overlap's tile")
    if OVERLAP and (PINGPONG or args.queries != "8"):
        parser.error("--overlap takes one warpgroup of rows: --queries 8, no --pingpong")
    PV_WG = gl.constexpr(args.pv_wg or args.pv_pipe)
    PV_PIPE = gl.constexpr(args.pv_pipe)
    if SCALES_AT.value == 2 and (PV_WG.value or not WIDEN_WG.value):
        parser.error("--scales widener takes the widener warpgroup, without --pv-wg")
    if args.pv_pipe and args.int8_qk != "2":
        parser.error("--pv-pipe takes --int8-qk 2")
    if args.pv_regs is not None:
        PV_REGS = gl.constexpr(args.pv_regs)
    if PV_WG.value:
        if (args.queries != "8" or args.lazy != "0" or PINGPONG or OVERLAP
                or not WIDEN_WG or args.diagnose not in ("none", "compute-only")
                or args.tile_n != 64
                or args.epilogue != "rows" or args.q_regs):
            parser.error("--pv-wg takes --queries 8 --lazy 0 and the default tile, widener "
                         "and epilogue (of the diagnoses, compute-only)")
        # 16 warps (4 + loader 1 + widener 4 + P.V 4, rounded up): 128 registers a thread.
        MAXNREG = 128
    MAXNREG = args.maxnreg or MAXNREG
    SCALE_LOAD_LAYOUT = gl.constexpr(SCALE_LOADS[args.scale_load])
    SCALE_DIRECT = gl.constexpr(args.scale_load == "direct")
    if args.probe_column is not None:
        print(f"TMA box at byte column {args.probe_column}: "
              f"{probe_tma_column(args.probe_column)}", flush=True)
        return 0
    variants = [(int(m), bool(int(lz)), vt) for m in args.int8_qk.split(",") if m
                for lz in args.lazy.split(",") if lz for vt in args.v_tile.split(",") if vt]
    if unknown := {vt for _, _, vt in variants} - set(V_TILES):
        parser.error(f"--v-tile: unknown {sorted(unknown)}; known: {sorted(V_TILES)}")
    queries = [int(q) for q in args.queries.split(",") if q]
    if args.compile_only:
        return _print_budget(variants, queries, args.stages, args.json, args.segments or 32,
                             args.cubin_dir)
    if not args.tree:
        parser.error("--tree is needed for a device run")
    return _device_run(args.tree, [int(c) for c in args.contexts.split(",") if c], variants,
                       queries, args.stages, args.json, args.segments)


def variant_name(int8_qk: int, lazy: bool, v_tile: str = "bf16") -> str:
    return (f"qk{int8_qk}" + ("-lazy" if lazy else "") + ("-f16" if v_tile == "fp16" else "")
            + ("-pp" if PINGPONG else "") + ("L" if PP_LOADER_DEFAULT else "")
            + ("-ov" if OVERLAP else "") + ("-pv" if PV_WG else "")
            + ("p" if PV_PIPE else "") + ("" if WIDEN_WG else "-cw")
            + ("" if KT_FROM_V else "-k7") + ("" if VEC_SHIFTS else "-nh")
            + ("-bt" if BT_AHEAD else "")
            + ("-vw" if V_LOAD_LAYOUT.value == V_LOADS["wide"] else "")
            + ("" if EPI_ROWS else "-ea") + ("-es" if EPI_SMEM else "")
            + {0: "", 1: "-loadonly", 2: "-computeonly", 3: "-handshake", 4: "-nostore",
               5: "-noqload", 6: "-nowiden", 7: "-noqk"}[DIAG.value]
            + ("" if TILE_N == 64 else f"-t{TILE_N}") + ("" if Q_MAGIC else "-qf")
            + {0: "", 1: "-wq", 2: "-wqq"}[WIDEN_AT.value]
            + ("" if PARTIALS == "fp32" else "-p16") + ("-qk1w" if QK_ONCE else "")
            + ("-qr" if Q_REGS else "") + {0: "", 1: "-se", 2: "-sw"}[SCALES_AT.value]
            + ("-ql" if Q_LIVE else "") + ("-qu" if Q_UNROLL else "")
            + ("-vs" if V_SCALED else "") + ("e" if WIDENER_RELEASE_EARLY else ""))


# sm_90's per-SM limits: shared memory (228 KiB, 1 KiB of it reserved a CTA) and registers.
SM90_SHARED = 228 << 10
SM90_REGS = 65536


def ctas_per_sm(shared: int, warps: int) -> int:
    """CTAs of this kernel an SM holds at once: the launch gives every thread MAXNREG
    registers (the partitions' setmaxnreg only shares them out)."""
    return min(SM90_SHARED // (shared + 1024), SM90_REGS // (MAXNREG * 32 * warps))


def _print_budget(variants: list[tuple[int, bool, str]], queries: list[int], stages: int,
                  out: Path | None, segments: int = 32, cubin_dir: Path | None = None) -> int:
    """The whole-tile loops of each variant and verify length, counted as split_pass_issue.py
    counts the others: every consumer warpgroup has two MMA loops, whole tiles then the
    masked tail, and a KV token costs the whole-tile loops of all of them. With the lazy
    rescale the rescale is a guarded block: warp_insts_per_token counts it (a tile that
    rescales), steady_warp_insts_per_token leaves it out (one that does not). Where the
    widener warpgroup widens V (one warpgroup of rows), its loop (4 warps, no MMA) issues on
    the same SM: widener_warp_insts_per_token, and all_*_per_token the sum the budget holds."""
    import tempfile

    sys.path.insert(0, str(PYTHON_DIR))
    sys.path.insert(0, str(HERE))
    from split_pass_issue import H200_CLOCK_GHZ, H200_SMS, ISSUE_PER_SM, sass_of

    from tests.support.sass_loops import loops as all_loops
    from tests.support.sass_loops import mma_loops, parse_sass

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for q in queries:
            num_wg, _ = warpgroups(q, 6)
            # With ping-pong each tile runs through one of the two warpgroups' loops.
            share = 2 if PINGPONG else 1
            num_wg *= share
            for mode, lazy, v_tile in variants:
                name = variant_name(mode, lazy, v_tile)
                compiled = compile_sm90(mode, stages, q=q, segments=segments, lazy=lazy,
                                        v_tile=v_tile, pingpong=PINGPONG, overlap=OVERLAP)
                if cubin_dir is not None:
                    cubin_dir.mkdir(parents=True, exist_ok=True)
                    (cubin_dir / f"{name}-q{q}.cubin").write_bytes(compiled.asm["cubin"])
                sass = sass_of(compiled.asm["cubin"], Path(tmp))
                loops = mma_loops(sass)
                pv_loop = None
                if PV_WG.value and len(loops) == 3:
                    # --pv-wg: the consumer's two loops, then the P.V warpgroup's one.
                    loops, pv_loop = loops[:2], loops[2]
                if len(loops) != 2 * num_wg:
                    raise RuntimeError(f"{name} q={q}: {len(loops)} MMA loops, expected two a "
                                       f"consumer warpgroup ({num_wg})")
                # Each warpgroup's whole-tile loop comes first and is the smaller: no mask.
                steady, tail = loops[0::2], loops[1::2]
                for a, b in zip(steady, tail, strict=True):
                    if a.instructions >= b.instructions:
                        raise RuntimeError(f"{name} q={q}: a whole-tile loop ({a.instructions})"
                                           f" is not smaller than its tail ({b.instructions})")
                insts = sum(loop.instructions for loop in steady)
                # wgmma waits in the steady loops: one a wait the kernel asks for, or one a
                # wgmma when ptxas serialises them (its C7514 note).
                code = parse_sass(sass)
                mma_waits = sum(1 for ins in code for loop in steady
                                if loop.start <= ins.addr <= loop.end
                                and ins.text.startswith("WARPGROUP.DEPBAR"))
                guarded = sum(loop.guarded for loop in steady)
                per_token = insts * 4 / TILE_N / share
                # The loops' issue floor at 64k (batch 1, 4 KV heads) on the H200.
                issue_us = per_token * 65536 * 4 / (H200_SMS * ISSUE_PER_SM * H200_CLOCK_GHZ
                                                    * 1e3)
                classes: dict[str, int] = {}
                for loop in steady:
                    for k, n in loop.classes().items():
                        classes[k] = classes.get(k, 0) + n
                widener = None
                if WIDEN_WG and num_wg == 1 and not OVERLAP:
                    # The innermost loop with no MMA that stores widened codes to shared memory.
                    found = [lp for lp in all_loops(parse_sass(sass))
                             if not lp.mma and lp.opcodes["STS"] >= 4]
                    inner = [a for a in found if not any(a.contains(b) for b in found if b != a)]
                    if len(inner) != 1:
                        raise RuntimeError(f"{name} q={q}: {len(inner)} widener loops, expected 1")
                    widener = inner[0]
                w_token = widener.instructions * 4 / TILE_N if widener else 0.0
                rows.append({"variant": name, "q": q, "warpgroups": num_wg, "int8_qk": mode,
                             "lazy": lazy, "v_tile": v_tile, "stages": stages,
                             "tile_n": TILE_N, "segments": segments,
                             "shared": compiled.metadata.shared,
                             "ctas_per_sm": ctas_per_sm(compiled.metadata.shared,
                                                        compiled.metadata.num_warps),
                             "loops_found": [loop.instructions for loop in loops],
                             "loop_mma_waits": mma_waits,
                             **({"pv_loop_insts_per_warp": pv_loop.instructions}
                                if pv_loop else {}),
                             "loop_insts_per_warp": insts,
                             "tail_loop_insts_per_warp": sum(b.instructions for b in tail),
                             "loop_insts_guarded": guarded,
                             "warp_insts_per_token": per_token,
                             "steady_warp_insts_per_token": (insts - guarded) * 4 / TILE_N
                             / share,
                             "mma_per_warp": sum(loop.mma for loop in steady),
                             # Spill stores in the whole-tile loops (0: the stack holds no
                             # loop value; reloads of prologue values may remain).
                             "loop_stack_stores": sum(loop.opcodes["STL"] for loop in steady),
                             # Spill traffic in the masked tail loops, which short contexts
                             # run on every tile.
                             "tail_loop_stack_ops": sum(loop.opcodes["STL"] + loop.opcodes["LDL"]
                                                        for loop in tail),
                             # Warpgroup barriers in the whole-tile loops (layout
                             # conversions through shared memory bring them).
                             "loop_barriers": sum(loop.opcodes["BAR"] for loop in steady),
                             "classes": classes,
                             "widener_loop_insts_per_warp": (widener.instructions if widener
                                                             else 0),
                             "widener_warp_insts_per_token": w_token,
                             "widener_classes": widener.classes() if widener else {},
                             "all_warp_insts_per_token": per_token + w_token,
                             "all_steady_warp_insts_per_token": (insts - guarded) * 4 / TILE_N
                             / share + w_token,
                             "issue_floor_us_64k": issue_us * (per_token + w_token) / per_token})
                print(json.dumps(rows[-1]), flush=True)
    if out:
        out.write_text(json.dumps(rows, indent=1))
    return 0


def _device_run(tree: str, contexts: list[int], variants: list[tuple[int, bool, str]],
                queries: list[int], stages: int, out: Path | None,
                segments: int | None = None) -> int:
    """On an H200: every KV head's output against the float32 reference, then the candidate
    (split + the tree's reduce) and the production int8 plan timed side by side, for each
    verify length."""
    sys.path.insert(0, tree)
    sys.path.insert(1, str(PYTHON_DIR))
    sys.path.insert(2, str(HERE))
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
    # The candidate's own view of the workspace: the production plan keeps float32 partials.
    cand_ws = copy.copy(ws)
    if PARTIALS != "fp32":
        cand_ws.part_out = torch.empty(ws.part_out.shape, dtype=torch.float16, device="cuda")
    copy_bw = bench.measure_copy_bandwidth(torch)
    scale = bench.HEAD_SIZE**-0.5
    rows = []
    for q in queries:
        tiles = sda.TILE_PLANS["int8"]
        prod_plan = sda.plan_launch(1, q, heads, bench.NUM_KV_HEADS, bench.HEAD_SIZE, ws,
                                    kernel="triton", **tiles.plan_overrides())
        # Segments as the Hopper planner splits 64-key tiles (its reduce pass reads them).
        cand_plan = sda.plan_launch(1, q, heads, bench.NUM_KV_HEADS, bench.HEAD_SIZE, ws,
                                    kernel="hopper", num_segments=segments) if ws.hopper else None
        # The plan gives the segments (the reduce reads them); the kernel splits them into
        # its own tiles, which must divide the plan's.
        if cand_plan is None or cand_plan.tile_n % TILE_N:
            print(f"the planner gave no Hopper plan of {TILE_N}-key tiles ({cand_plan})",
                  file=sys.stderr)
            return 2
        for ctx in contexts:
            cell = bench.Cell(env, 1, ctx)
            batches = cell.batches(q)
            want = ref.reference(batches[0], scale)
            prod_outs = [torch.empty_like(b.query) for b in batches]
            prod_calls = [bench.split_reduce_calls(env, b, o, ws, prod_plan, tiles)[0]
                          for b, o in zip(batches, prod_outs, strict=True)]
            t_prod = bench._time_graph(torch, prod_calls)
            prod_err = ref.compare(prod_outs[0], want, batches[0])
            # The reduce pass alone on the candidate's plan (its partials as the last
            # production call left them: the reduce reads every segment either way).
            t_reduce = bench._time_graph(torch, [
                functools.partial(sda.launch_reduce, o, b.cu_seqlens_q, b.max_query_len, ws,
                                  cand_plan) for b, o in zip(batches, prod_outs, strict=True)])
            row: dict[str, Any] = {"context": ctx, "q": q, "stages": stages,
                                   "maxnreg": MAXNREG, "pingpong": PINGPONG,
                                   "pp_loader_default": PP_LOADER_DEFAULT.value,
                                   "consumer_regs": CONSUMER_REGS.value,
                                   "tile_n": TILE_N,
                                   "overlap": OVERLAP, "k_tail_from_v": KT_FROM_V.value,
                                   "widener_wg": (WIDEN_WG.value and not PINGPONG
                                                  and not OVERLAP
                                                  and warpgroups(q, 6)[0] == 1),
                                   "widener_regs": WIDENER_REGS.value,
                                   **({"pv_wg": True, "pv_regs": PV_REGS.value,
                                       "pv_pipe": PV_PIPE.value}
                                      if PV_WG.value else {}),
                                   "shift_hints": VEC_SHIFTS.value,
                                   "epilogue_smem": EPI_SMEM.value,
                                   "q_magic": Q_MAGIC.value,
                                   "partials": PARTIALS, "qk_once": QK_ONCE.value,
                                   "q_regs": Q_REGS.value,
                                   "widen_at": next(k for k, v in WIDEN_ATS.items()
                                                    if v == WIDEN_AT.value),
                                   "block_table_ahead": BT_AHEAD.value,
                                   "epilogue_rows": (EPI_ROWS.value and not PINGPONG
                                                     and not OVERLAP
                                                     and (warpgroups(q, 6)[0] == 1
                                                          or EPI_SMEM.value)),
                                   "v_load": next(k for k, v in V_LOADS.items()
                                                  if v == V_LOAD_LAYOUT.value),
                                   "scale_load": next(k for k, v in SCALE_LOADS.items()
                                                      if v == SCALE_LOAD_LAYOUT.value),
                                   "segments": cand_plan.num_segments,
                                   "production_us": t_prod * 1e6,
                                   "production_rel_err": prod_err["rel_err"],
                                   "reduce_us": t_reduce * 1e6,
                                   "floor_us": cell.kv_bytes / copy_bw * 1e6}
            for mode, lazy, v_tile in variants:
                outs = [torch.full(b.query.shape, float("nan"), dtype=torch.bfloat16,
                                   device="cuda") for b in batches]

                def call(b: Any, o: Any, mode: int = mode, lazy: bool = lazy,
                         v_tile: str = v_tile, plan: Any = cand_plan) -> None:
                    launch(b, cand_ws, plan, scale * 1.4426950408889634, mode, stages, lazy,
                           v_tile, PINGPONG, OVERLAP)
                    sda.launch_reduce(o, b.cu_seqlens_q, b.max_query_len, cand_ws, plan)

                try:
                    call(batches[0], outs[0])
                    torch.cuda.synchronize()
                    err = ref.compare(outs[0], want, batches[0])
                    # Per KV head: a misread box shows on the heads whose rows are misaligned.
                    per_head = [float((outs[0][:, h * bench.GROUP:(h + 1) * bench.GROUP].float()
                                       - want[:, h * bench.GROUP:(h + 1) * bench.GROUP]).norm()
                                      / want[:, h * bench.GROUP:(h + 1) * bench.GROUP].norm())
                                for h in range(bench.NUM_KV_HEADS)]
                    t = bench._time_graph(torch, [functools.partial(call, b, o)
                                                  for b, o in zip(batches, outs, strict=True)])
                    row[variant_name(mode, lazy, v_tile)] = {
                        "us": t * 1e6, "rel_err": err["rel_err"],
                        "unwritten": err["unwritten_rows"], "rel_err_per_kv_head": per_head,
                        "pct_floor": 100 * row["floor_us"] / (t * 1e6),
                        "vs_production": t_prod / t}
                except Exception as exc:  # the first GPU run: record, go on
                    row[variant_name(mode, lazy, v_tile)] = {"error": bench.error_text(exc)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if out:
        # What made the record: tests/gpu/test_int8_candidate_record.py holds a record only to
        # the candidate it was made with.
        out.write_text(json.dumps({
            "candidate_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": importlib.import_module("triton").__version__,
            "scale_load": next(k for k, v in SCALE_LOADS.items()
                               if v == SCALE_LOAD_LAYOUT.value),
            "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    sys.exit(main())
