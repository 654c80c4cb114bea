# SPDX-License-Identifier: Apache-2.0
# qwen3090 patch kvarn-cache: the KVarN KV cache's tile layout, its quantizing
# store kernel and its split-KV decode/verify attention kernel (issue 24).
#
# Method (KVarN, Huawei CSL, written here from the published description):
# per kv head and per 128-token tile, K and V are rotated along the channel
# axis by the orthonormal Hadamard matrix (outliers spread over all channels),
# then an iterative (Sinkhorn-style) variance normalization finds a scale per
# token and a scale per channel that make both axes' variance uniform, and
# the normalized values are rounded to nearest: keys to 4 bits, values to 2.
#
# Layout kvarn_k4v2_g128 (one "head tile" = one kv head x 128 tokens; D =
# head_size, T = 128), in this order, every fp16 field 2-byte aligned:
#   K codes        T x D/2  uint8   two 4-bit codes a byte, channel 2i low
#   V codes        T x D/4  uint8   four 2-bit codes a byte, channel 4i+j at
#                                   bits 2j
#   K token scale  T        fp16    symmetric: K = mu + c * s * (code - 8)
#   V token scale  T        fp16    asymmetric: V = c * (a * code + b)
#   V token zero   T        fp16
#   K channel mean D        fp16    keys' per-channel offset survives the
#                                   rotation, so it is removed first
#   K channel scale D       fp16
#   V channel scale D       fp16
# Bytes per token per kv head: 3D/4 + 6 + 6D/T; at D = 256: 192 + 6 + 12 =
# 210, so 840 bytes per token per layer for the model's 4 kv heads, against
# fp8's 2 x 4 x 256 = 2048 (2.44x the tokens per byte).
#
# A vLLM block holds block_size / 128 tiles (block_size a multiple of 128;
# tiles stay 128 tokens when the hybrid page alignment makes the block
# large). The layer's cache is a uint8 tensor [num_blocks, tiles_per_block,
# num_kv_heads, head_tile_bytes]; the kernels take its strides in bytes and
# read the fp16 fields through an fp16 view of the same storage.
#
# Store: a tile is quantized from full-precision rows of up to 128 tokens
# (its valid count is a runtime value); the rows past it are not written.
# Attention: grid (num_seqs * q_tiles, num_kv_heads, num_segments) like
# spec_decode_attention.py: one program owns one query tile (query tokens x
# the kv head's G query heads) of one request and one segment of its
# context; a reduce pass merges the segments and rotates the output back.
# Context lengths, segment counts and strides are runtime arguments (no
# recompile per context, gotcha 45), and a chunk whose every position is
# masked leaves its rows' max at -inf without producing NaN.

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

CACHE_DTYPE = "kvarn_k4v2_g128"
TILE_TOKENS = 128
KEY_BITS = 4
VALUE_BITS = 2
# Alternating row/column variance passes; three get within a few percent of
# the fixed point on Gaussian and outlier-heavy tiles alike.
NORMALIZE_ITERS = 3
FP16_BYTES = 2


@dataclass(frozen=True)
class HeadTileLayout:
    """Byte offsets of one head tile's fields (see the header comment)."""

    head_size: int
    tile_tokens: int = TILE_TOKENS

    def __post_init__(self) -> None:
        d = self.head_size
        if d < 64 or d & (d - 1):
            raise ValueError(
                f"kvarn: head_size {d} is not a power of two >= 64; the Hadamard "
                "rotation and the 2-bit packing need one (the model's attention "
                "layers set it, not a flag)")

    @property
    def k_codes(self) -> int:
        return 0

    @property
    def v_codes(self) -> int:
        return self.tile_tokens * self.head_size // 2

    @property
    def k_token_scale(self) -> int:
        return self.v_codes + self.tile_tokens * self.head_size // 4

    @property
    def v_token_scale(self) -> int:
        return self.k_token_scale + FP16_BYTES * self.tile_tokens

    @property
    def v_token_zero(self) -> int:
        return self.v_token_scale + FP16_BYTES * self.tile_tokens

    @property
    def k_channel_mean(self) -> int:
        return self.v_token_zero + FP16_BYTES * self.tile_tokens

    @property
    def k_channel_scale(self) -> int:
        return self.k_channel_mean + FP16_BYTES * self.head_size

    @property
    def v_channel_scale(self) -> int:
        return self.k_channel_scale + FP16_BYTES * self.head_size

    @property
    def nbytes(self) -> int:
        return self.v_channel_scale + FP16_BYTES * self.head_size


def head_tile_bytes(head_size: int) -> int:
    return HeadTileLayout(head_size).nbytes


def bytes_per_token_per_layer(num_kv_heads: int, head_size: int) -> float:
    """Pool bytes one token costs in one attention layer (840 at 4 x 256)."""
    return num_kv_heads * head_tile_bytes(head_size) / TILE_TOKENS


def page_bytes(block_size: int, num_kv_heads: int, head_size: int) -> int:
    """Bytes of one vLLM block of one layer; the block holds whole tiles."""
    if block_size <= 0 or block_size % TILE_TOKENS:
        raise ValueError(
            f"kvarn: block_size {block_size} is not a positive multiple of "
            f"{TILE_TOKENS}; pass --block-size 128 (or a multiple) with "
            f"--kv-cache-dtype {CACHE_DTYPE}")
    return block_size // TILE_TOKENS * num_kv_heads * head_tile_bytes(head_size)


def token_page_bytes(num_kv_heads: int, head_size: int) -> int:
    """Page bytes per token of whole tiles, exact: ``page_bytes(n * 128) / (n * 128)``.

    vLLM's hybrid alignment sizes the attention block in tokens against the
    recurrent-state page; 6 D / 128 channel-field bytes per token are whole
    for every head size the layout accepts (a power of two >= 64).
    """
    tile = page_bytes(TILE_TOKENS, num_kv_heads, head_size)
    assert tile % TILE_TOKENS == 0, (num_kv_heads, head_size)
    return tile // TILE_TOKENS


def cache_shape(num_blocks: int, block_size: int, num_kv_heads: int,
                head_size: int) -> tuple[int, int, int, int]:
    page_bytes(block_size, num_kv_heads, head_size)  # validates block_size
    return (num_blocks, block_size // TILE_TOKENS, num_kv_heads,
            head_tile_bytes(head_size))


# ----------------------------------------------------------------- helpers


@triton.jit
def _hadamard(x, ROWS: tl.constexpr, D: tl.constexpr, LOG2_D: tl.constexpr):
    """x @ H_D (Sylvester order, unnormalized) along the last axis of [ROWS, D].

    Each pass applies H_2 to the lowest index bit and moves that bit to the
    top, so after log2(D) passes every bit was transformed once and the
    index order is back where it started."""
    for _ in tl.static_range(LOG2_D):
        pairs = tl.reshape(x, (ROWS, D // 2, 2))
        a, b = tl.split(pairs)
        y = tl.permute(tl.join(a + b, a - b), (0, 2, 1))
        x = tl.reshape(y, (ROWS, D))
    return x


@triton.jit
def _normalize(y, valid, n_valid, ITERS: tl.constexpr):
    """Alternating row/column RMS normalization of y [T, D] over its valid
    rows; returns (row scale [T], column scale [D]) with mean(col^2) = 1."""
    col = tl.full((y.shape[1],), 1.0, tl.float32)
    row = tl.full((y.shape[0],), 1.0, tl.float32)
    for _ in tl.static_range(ITERS):
        r2 = tl.sum((y / col[None, :]) * (y / col[None, :]), axis=1) / y.shape[1]
        row = tl.where(valid & (r2 > 0), tl.sqrt(r2), 1.0)
        c2 = tl.sum(tl.where(valid[:, None], (y / row[:, None]) * (y / row[:, None]), 0.0),
                    axis=0) / n_valid
        col = tl.sqrt(c2)
        rms = tl.sqrt(tl.sum(col * col) / y.shape[1])
        # An all-zero tile keeps unit scales; a dead channel keeps a small
        # positive one (its codes come out 0 whatever the scale).
        col = tl.where(rms > 0, col / tl.where(rms > 0, rms, 1.0), 1.0)
        col = tl.maximum(col, 1e-3)
    return row, col


@triton.jit
def _round_half_up(x):
    return tl.floor(x + 0.5)


# ------------------------------------------------------------------- store


@triton.jit(do_not_specialize=["stride_kt", "stride_kh", "stride_vt", "stride_vh"])
def _kvarn_restore_kernel(
    key_ptr, value_ptr, cache_u8_ptr, cache_f16_ptr,
    tile_src_ptr, tile_slot_ptr,   # as the store kernel's
    tile_keep_ptr,                 # int32 [tiles]: rows to restore (0: none)
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_slot, stride_head,      # bytes
    D: tl.constexpr, LOG2_D: tl.constexpr, T: tl.constexpr,
    OFF_VC: tl.constexpr, OFF_KS: tl.constexpr, OFF_VS: tl.constexpr,
    OFF_VZ: tl.constexpr, OFF_KM: tl.constexpr, OFF_KC: tl.constexpr,
    OFF_VCS: tl.constexpr,
):
    """Rows 0 .. keep - 1 of a tile, dequantized and rotated back, written over source rows
    src .. src + keep - 1: the store launched next re-quantizes the tile from what the cache
    held for those rows (their exact values are gone) plus the new ones. A kernel of its
    own, not a branch of the store: the store runs every step and is register-bound, a
    restore almost never runs, and a tile with keep 0 costs this kernel one load."""
    tile = tl.program_id(0)
    head = tl.program_id(1)
    keep = tl.load(tile_keep_ptr + tile)
    if keep == 0:
        return
    src = tl.load(tile_src_ptr + tile).to(tl.int64)
    slot = tl.load(tile_slot_ptr + tile).to(tl.int64)
    base = slot * stride_slot + head * stride_head  # bytes; even
    base16 = base // 2
    rows = tl.arange(0, T)
    cols = tl.arange(0, D)
    half = tl.arange(0, D // 2)
    quarter = tl.arange(0, D // 4)
    kept = rows < keep
    inv_sqrt_d = 1.0 / tl.sqrt(D * 1.0)
    # Keys: mu + c * s * (code - 8) in the rotated basis, two codes a byte.
    kb = tl.load(cache_u8_ptr + base + rows[:, None] * (D // 2) + half[None, :],
                 mask=kept[:, None], other=0).to(tl.int32)
    code = tl.reshape(tl.join((kb & 15) - 8, (kb >> 4) - 8), (T, D)).to(tl.float32)
    s = tl.load(cache_f16_ptr + base16 + OFF_KS // 2 + rows, mask=kept, other=0.0)
    mu = tl.load(cache_f16_ptr + base16 + OFF_KM // 2 + cols).to(tl.float32)
    c = tl.load(cache_f16_ptr + base16 + OFF_KC // 2 + cols).to(tl.float32)
    k = mu[None, :] + c[None, :] * s.to(tl.float32)[:, None] * code
    k = _hadamard(k, T, D, LOG2_D) * inv_sqrt_d
    tl.store(key_ptr + (src + rows)[:, None] * stride_kt + head * stride_kh + cols[None, :],
             k.to(key_ptr.dtype.element_ty), mask=kept[:, None])
    # Values: c * (a * code + b), four codes a byte (channel 4i + j at bits 2j).
    vb = tl.load(cache_u8_ptr + base + OFF_VC + rows[:, None] * (D // 4) + quarter[None, :],
                 mask=kept[:, None], other=0).to(tl.int32)
    code = tl.reshape(
        tl.join(tl.join(vb & 3, (vb >> 4) & 3), tl.join((vb >> 2) & 3, vb >> 6)),
        (T, D)).to(tl.float32)
    a = tl.load(cache_f16_ptr + base16 + OFF_VS // 2 + rows, mask=kept, other=0.0)
    b = tl.load(cache_f16_ptr + base16 + OFF_VZ // 2 + rows, mask=kept, other=0.0)
    c = tl.load(cache_f16_ptr + base16 + OFF_VCS // 2 + cols).to(tl.float32)
    v = c[None, :] * (a.to(tl.float32)[:, None] * code + b.to(tl.float32)[:, None])
    v = _hadamard(v, T, D, LOG2_D) * inv_sqrt_d
    tl.store(value_ptr + (src + rows)[:, None] * stride_vt + head * stride_vh
             + cols[None, :], v.to(value_ptr.dtype.element_ty), mask=kept[:, None])


@triton.jit(do_not_specialize=["stride_kt", "stride_kh", "stride_vt", "stride_vh"])
def _kvarn_store_kernel(
    key_ptr, value_ptr,            # [tokens, kv_heads, D], any float dtype
    cache_u8_ptr, cache_f16_ptr,   # the same storage as uint8 and as fp16
    tile_src_ptr,                  # int32 [tiles]: first source row
    tile_len_ptr,                  # int32 [tiles]: valid rows, 1..128; 0: skip
    tile_slot_ptr,                 # int64 [tiles]: block * tiles_per_block + tile
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_slot, stride_head,      # bytes
    D: tl.constexpr, LOG2_D: tl.constexpr, T: tl.constexpr, ITERS: tl.constexpr,
    OFF_VC: tl.constexpr, OFF_KS: tl.constexpr, OFF_VS: tl.constexpr,
    OFF_VZ: tl.constexpr, OFF_KM: tl.constexpr, OFF_KC: tl.constexpr,
    OFF_VCS: tl.constexpr,
):
    tile = tl.program_id(0)
    head = tl.program_id(1)
    src = tl.load(tile_src_ptr + tile).to(tl.int64)
    n = tl.load(tile_len_ptr + tile)
    if n == 0:  # a placeholder (a request whose step opens no second tile)
        return
    slot = tl.load(tile_slot_ptr + tile).to(tl.int64)
    base = slot * stride_slot + head * stride_head  # bytes; even
    base16 = base // 2

    rows = tl.arange(0, T)
    cols = tl.arange(0, D)
    valid = rows < n
    inv_sqrt_d = 1.0 / tl.sqrt(D * 1.0)

    # ---- keys: rotate, centre per channel, normalize, 4-bit symmetric.
    k = tl.load(key_ptr + (src + rows)[:, None] * stride_kt + head * stride_kh
                + cols[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
    k = _hadamard(k, T, D, LOG2_D) * inv_sqrt_d
    mu = (tl.sum(k, axis=0) / n).to(tl.float16).to(tl.float32)
    k = tl.where(valid[:, None], k - mu[None, :], 0.0)
    _, col = _normalize(k, valid, n, ITERS)
    col = col.to(tl.float16).to(tl.float32)
    z = k / col[None, :]
    amax = tl.max(tl.abs(z), axis=1)
    s = tl.where(amax > 0, amax / 7.0, 1.0).to(tl.float16).to(tl.float32)
    code = tl.minimum(tl.maximum(_round_half_up(z / s[:, None]), -8.0), 7.0) + 8.0
    code = code.to(tl.int32)
    lo, hi = tl.split(tl.reshape(code, (T, D // 2, 2)))
    packed = (lo | (hi << 4)).to(tl.uint8)
    half = tl.arange(0, D // 2)
    tl.store(cache_u8_ptr + base + rows[:, None] * (D // 2) + half[None, :], packed,
             mask=valid[:, None])
    tl.store(cache_f16_ptr + base16 + OFF_KS // 2 + rows, s.to(tl.float16), mask=valid)
    tl.store(cache_f16_ptr + base16 + OFF_KM // 2 + cols, mu.to(tl.float16))
    tl.store(cache_f16_ptr + base16 + OFF_KC // 2 + cols, col.to(tl.float16))
    # The row scales only steered the channel scales: the token scale s is
    # taken after the channel division, so it carries the row's magnitude.

    # ---- values: rotate, normalize, 2-bit asymmetric per token.
    v = tl.load(value_ptr + (src + rows)[:, None] * stride_vt + head * stride_vh
                + cols[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
    v = _hadamard(v, T, D, LOG2_D) * inv_sqrt_d
    _, col = _normalize(v, valid, n, ITERS)
    col = col.to(tl.float16).to(tl.float32)
    z = v / col[None, :]
    zmin = tl.min(z, axis=1)
    zmax = tl.max(z, axis=1)
    a = tl.where(zmax > zmin, (zmax - zmin) / 3.0, 1.0).to(tl.float16).to(tl.float32)
    b = zmin.to(tl.float16).to(tl.float32)
    code = tl.minimum(tl.maximum(_round_half_up((z - b[:, None]) / a[:, None]), 0.0), 3.0)
    code = code.to(tl.int32)
    pair0, pair1 = tl.split(tl.reshape(code, (T, D // 4, 2, 2)))
    c0, c2 = tl.split(pair0)
    c1, c3 = tl.split(pair1)
    packed = (c0 | (c1 << 2) | (c2 << 4) | (c3 << 6)).to(tl.uint8)
    quarter = tl.arange(0, D // 4)
    tl.store(cache_u8_ptr + base + OFF_VC + rows[:, None] * (D // 4) + quarter[None, :],
             packed, mask=valid[:, None])
    tl.store(cache_f16_ptr + base16 + OFF_VS // 2 + rows, a.to(tl.float16), mask=valid)
    tl.store(cache_f16_ptr + base16 + OFF_VZ // 2 + rows, b.to(tl.float16), mask=valid)
    tl.store(cache_f16_ptr + base16 + OFF_VCS // 2 + cols, col.to(tl.float16))


def _layout_constexprs(head_size: int) -> dict[str, int]:
    lay = HeadTileLayout(head_size)
    return {
        "D": head_size, "LOG2_D": int(math.log2(head_size)), "T": TILE_TOKENS,
        "OFF_VC": lay.v_codes, "OFF_KS": lay.k_token_scale, "OFF_VS": lay.v_token_scale,
        "OFF_VZ": lay.v_token_zero, "OFF_KM": lay.k_channel_mean,
        "OFF_KC": lay.k_channel_scale, "OFF_VCS": lay.v_channel_scale,
    }


def _check_cache(cache: torch.Tensor, num_kv_heads: int, head_size: int) -> None:
    want = head_tile_bytes(head_size)
    if (cache.dtype != torch.uint8 or cache.dim() != 4 or cache.shape[2] != num_kv_heads
            or cache.shape[3] != want or cache.stride(3) != 1):
        raise ValueError(
            f"kvarn: cache {tuple(cache.shape)} {cache.dtype} is not a "
            f"[blocks, tiles, {num_kv_heads}, {want}] uint8 tensor with contiguous "
            "head tiles; allocate it with kvarn.cache_shape()")


def store_tiles(key: torch.Tensor, value: torch.Tensor, cache: torch.Tensor,
                tile_src: torch.Tensor, tile_len: torch.Tensor,
                tile_slot: torch.Tensor, tile_keep: torch.Tensor | None = None) -> None:
    """Quantize whole or partial tiles into ``cache``.

    key, value: [tokens, num_kv_heads, head_size]; tile i is rows
    tile_src[i] .. tile_src[i] + tile_len[i] - 1 (1 <= tile_len <= 128; 0:
    none, the tile is skipped), and lands in tile slot tile_slot[i] =
    block * tiles_per_block + tile index.
    A partial tile's statistics come from its valid rows only; rewriting a
    tile as it fills (from its full-precision rows) is the caller's job.

    tile_keep (int32 [tiles], optional): the tile's first tile_keep[i] rows
    are first restored into key/value, dequantized from what the slot holds
    (a caller that lost their exact rows; 0: none), then quantized with the
    rest. Restored rows carry the tile's earlier quantization error."""
    num_tiles = tile_src.shape[0]
    if num_tiles == 0:
        return
    _, kv_heads, head_size = key.shape
    _check_cache(cache, kv_heads, head_size)
    if key.stride(2) != 1 or value.stride(2) != 1:
        raise ValueError("kvarn: key/value rows must be contiguous in head_size")
    grid = (num_tiles, kv_heads)
    strides = (key.stride(0), key.stride(1), value.stride(0), value.stride(1),
               cache.stride(1), cache.stride(2))
    if tile_keep is not None:
        _kvarn_restore_kernel[grid](
            key, value, cache, cache.view(torch.float16), tile_src, tile_slot, tile_keep,
            *strides, num_warps=8, **_layout_constexprs(head_size))
    _kvarn_store_kernel[grid](
        key, value, cache, cache.view(torch.float16),
        tile_src, tile_len, tile_slot, *strides,
        ITERS=NORMALIZE_ITERS, num_warps=8, **_layout_constexprs(head_size),
    )


# --------------------------------------------------------------- attention


# Query rows a split program holds at most when the query tile has more than
# one token (verify); decode (one query token) keeps one token a program.
VERIFY_ROWS = 64
MIN_DOT_ROWS = 16       # tl.dot's smallest M
CHUNK_TOKENS = 64       # keys per inner step; divides TILE_TOKENS
MAX_SEGMENTS = 64


@triton.jit(do_not_specialize=[
    "scale_log2", "q_tiles", "num_segments", "tiles_per_block", "stride_qt",
    "stride_qh", "stride_bt", "stride_block", "stride_tile", "stride_head"])
def _kvarn_split_kernel(
    q_ptr,                         # [q_tokens, num_heads, D]
    cache_u8_ptr, cache_f16_ptr,
    block_table_ptr,               # int32 [seqs, max_blocks]
    seq_lens_ptr,                  # int32 [seqs]: context incl. these queries
    query_start_ptr,               # int32 [seqs + 1]
    part_acc_ptr,                  # fp32 [q_tokens, num_heads, segs, D]
    part_ml_ptr,                   # fp32 [q_tokens, num_heads, segs, 2]
    scale_log2,                    # softmax scale x log2(e)
    q_tiles, num_segments, tiles_per_block,
    stride_qt, stride_qh, stride_bt,
    stride_block, stride_tile, stride_head,   # bytes
    NUM_HEADS: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    D: tl.constexpr, LOG2_D: tl.constexpr, T: tl.constexpr, SUB_N: tl.constexpr,
    OFF_VC: tl.constexpr, OFF_KS: tl.constexpr, OFF_VS: tl.constexpr,
    OFF_VZ: tl.constexpr, OFF_KM: tl.constexpr, OFF_KC: tl.constexpr,
    OFF_VCS: tl.constexpr,
):
    tl.static_assert(BLOCK_M >= BLOCK_Q * GROUP)
    tl.static_assert(T % SUB_N == 0)
    prog = tl.program_id(0)
    kv_head = tl.program_id(1)
    seg = tl.program_id(2)
    seq = prog // q_tiles
    q_tile = prog % q_tiles
    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)

    rows = tl.arange(0, BLOCK_M)
    q_in_req = q_tile * BLOCK_Q + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = (rows < BLOCK_Q * GROUP) & (q_in_req < q_len)
    q_tok = (q_start + q_in_req).to(tl.int64)
    # Query i of the request sits at position seq_len - q_len + i.
    last_pos = seq_len - q_len + q_in_req
    cols = tl.arange(0, D)
    q = tl.load(q_ptr + q_tok[:, None] * stride_qt + head[:, None] * stride_qh
                + cols[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
    # Scores live in the rotated basis: q.k = (qH).(kH) for orthonormal H.
    q = _hadamard(q, BLOCK_M, D, LOG2_D) * (scale_log2 / tl.sqrt(D * 1.0))
    q_even, q_odd = tl.split(tl.reshape(q, (BLOCK_M, D // 2, 2)))

    # This program's share of the context, in SUB_N-token chunks; a query
    # tile past the request's queries (ragged batch) gets none.
    n_chunks = tl.where(q_tile * BLOCK_Q < q_len, tl.cdiv(seq_len, SUB_N), 0)
    per_seg = tl.cdiv(n_chunks, num_segments)
    c_begin = seg * per_seg
    c_end = tl.minimum(c_begin + per_seg, n_chunks)

    half = tl.arange(0, D // 2)
    quarter = tl.arange(0, D // 4)
    sub = tl.arange(0, SUB_N)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    for chunk in range(c_begin, c_end):
        pos0 = chunk * SUB_N
        seq_tile = pos0 // T
        block = tl.load(block_table_ptr + seq * stride_bt
                        + seq_tile // tiles_per_block).to(tl.int64)
        base = (block * stride_block + (seq_tile % tiles_per_block) * stride_tile
                + kv_head * stride_head)
        base16 = base // 2
        trow = pos0 % T + sub
        pos = pos0 + sub
        kv_ok = pos < seq_len

        # Keys: s = q.mu + s_t * ((q * c) . (code - 8)), per tile c and mu.
        k_mu_e = tl.load(cache_f16_ptr + base16 + OFF_KM // 2 + 2 * half).to(tl.float32)
        k_mu_o = tl.load(cache_f16_ptr + base16 + OFF_KM // 2 + 2 * half + 1).to(tl.float32)
        k_c_e = tl.load(cache_f16_ptr + base16 + OFF_KC // 2 + 2 * half).to(tl.float32)
        k_c_o = tl.load(cache_f16_ptr + base16 + OFF_KC // 2 + 2 * half + 1).to(tl.float32)
        # Masked loads read 0 for slots past the context: whatever those slots
        # hold (NaN scales of a never-written slot) stays out of the sums.
        kb = tl.load(cache_u8_ptr + base + trow[:, None] * (D // 2) + half[None, :],
                     mask=kv_ok[:, None], other=0).to(tl.int32)
        k_lo = ((kb & 15) - 8).to(tl.float16)
        k_hi = ((kb >> 4) - 8).to(tl.float16)
        k_s = tl.load(cache_f16_ptr + base16 + OFF_KS // 2 + trow, mask=kv_ok,
                      other=0.0).to(tl.float32)
        bias = tl.sum(q_even * k_mu_e[None, :], axis=1) + tl.sum(q_odd * k_mu_o[None, :], axis=1)
        dots = tl.dot((q_even * k_c_e[None, :]).to(tl.float16), tl.trans(k_lo))
        dots = tl.dot((q_odd * k_c_o[None, :]).to(tl.float16), tl.trans(k_hi), dots)
        s = bias[:, None] + k_s[None, :] * dots
        visible = row_ok[:, None] & kv_ok[None, :] & (pos[None, :] <= last_pos[:, None])
        s = tl.where(visible, s, float("-inf"))

        # NaN-safe online softmax: a row that has seen only masked keys keeps
        # m = -inf, and its exponent base is 0 instead of -inf - -inf.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_base = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_base)
        p = tl.exp2(s - m_base[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new

        # Values: sum_t p_t c (a_t code + b_t) = c * ((p a) @ code + p . b).
        v_a = tl.load(cache_f16_ptr + base16 + OFF_VS // 2 + trow, mask=kv_ok,
                      other=0.0).to(tl.float32)
        v_b = tl.load(cache_f16_ptr + base16 + OFF_VZ // 2 + trow, mask=kv_ok,
                      other=0.0).to(tl.float32)
        vb = tl.load(cache_u8_ptr + base + OFF_VC + trow[:, None] * (D // 4)
                     + quarter[None, :], mask=kv_ok[:, None], other=0).to(tl.int32)
        pa = (p * v_a[None, :]).to(tl.float16)
        pb = tl.sum(p * v_b[None, :], axis=1)[:, None]
        # A byte holds channels 4i..4i+3; unpacked into one [SUB_N, D] tile in
        # channel order for a single MMA with N = D. (Four MMAs of N = D / 4, one
        # per 2-bit field, read past their shared-memory buffer on sm_90 at
        # D = 64 with Triton 3.6: compute-sanitizer, qwen3090's docs/kvarn.md.)
        v_code = tl.reshape(
            tl.join(tl.join(vb & 3, (vb >> 4) & 3), tl.join((vb >> 2) & 3, vb >> 6)),
            (SUB_N, D)).to(tl.float16)
        v_cs = tl.load(cache_f16_ptr + base16 + OFF_VCS // 2 + cols).to(tl.float32)
        acc = acc * alpha[:, None] + v_cs[None, :] * (tl.dot(pa, v_code) + pb)

    part = (q_tok * NUM_HEADS + head) * num_segments + seg
    tl.store(part_acc_ptr + part[:, None] * D + cols[None, :], acc, mask=row_ok[:, None])
    tl.store(part_ml_ptr + part * 2, m_i, mask=row_ok)
    tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=row_ok)


@triton.jit(do_not_specialize=["num_segments", "stride_ot", "stride_oh"])
def _kvarn_reduce_kernel(
    part_acc_ptr, part_ml_ptr, out_ptr,
    num_segments, stride_ot, stride_oh,
    NUM_HEADS: tl.constexpr, D: tl.constexpr, LOG2_D: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    first = (tok * NUM_HEADS + head) * num_segments
    cols = tl.arange(0, D)
    m_max = float("-inf")
    for s in range(num_segments):
        m_max = tl.maximum(m_max, tl.load(part_ml_ptr + (first + s) * 2))
    m_base = tl.where(m_max == float("-inf"), 0.0, m_max)
    acc = tl.zeros((1, D), tl.float32)
    total = 0.0
    for s in range(num_segments):
        w = tl.exp2(tl.load(part_ml_ptr + (first + s) * 2) - m_base)
        total += w * tl.load(part_ml_ptr + (first + s) * 2 + 1)
        acc += w * tl.load(part_acc_ptr + (first + s) * D + cols)[None, :]
    acc = tl.where(total > 0, acc / tl.where(total > 0, total, 1.0), 0.0)
    # Back from the rotated basis: H is symmetric and orthonormal.
    acc = _hadamard(acc, 1, D, LOG2_D) * (1.0 / tl.sqrt(D * 1.0))
    dst = out_ptr + tok * stride_ot + head * stride_oh + cols[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty))


@dataclass(frozen=True)
class SplitPlan:
    block_q: int
    block_m: int
    q_tiles: int
    num_segments: int


def plan_split(max_query_len: int, group: int, max_seq_len: int,
               num_segments: int | None = None) -> SplitPlan:
    """Query tiling and segment count. Only block_q/block_m are compile-time;
    they take two values per (head_size, group): decode and verify."""
    if max_query_len < 1:
        raise ValueError(f"kvarn: max_query_len {max_query_len} < 1")
    block_q = 1 if max_query_len == 1 else max(1, VERIFY_ROWS // group)
    block_m = max(MIN_DOT_ROWS, triton.next_power_of_2(block_q * group))
    if num_segments is None:
        num_segments = max(1, min(MAX_SEGMENTS, triton.cdiv(max_seq_len, 8 * TILE_TOKENS)))
    return SplitPlan(block_q, block_m, triton.cdiv(max_query_len, block_q), num_segments)


def attention(query: torch.Tensor, cache: torch.Tensor, block_table: torch.Tensor,
              seq_lens: torch.Tensor, query_start_loc: torch.Tensor, max_query_len: int,
              max_seq_len: int, num_kv_heads: int, scale: float,
              out: torch.Tensor | None = None, num_segments: int | None = None,
              chunk_tokens: int = CHUNK_TOKENS) -> torch.Tensor:
    """Decode/verify attention over a kvarn cache (causal within each
    request's queries, which the cache already holds).

    query: [q_tokens, num_heads, head_size]; seq_lens: int32 [seqs], each
    request's context including its queries; query_start_loc: int32 [seqs + 1];
    block_table: int32 [seqs, max_blocks] of vLLM block ids."""
    q_tokens, num_heads, head_size = query.shape
    _check_cache(cache, num_kv_heads, head_size)
    if num_heads % num_kv_heads:
        raise ValueError(f"kvarn: {num_heads} query heads over {num_kv_heads} kv heads")
    group = num_heads // num_kv_heads
    if query.stride(2) != 1:
        raise ValueError("kvarn: query rows must be contiguous in head_size")
    plan = plan_split(max_query_len, group, max_seq_len, num_segments)
    if out is None:
        out = torch.empty_like(query)
    part_acc = torch.empty((q_tokens, num_heads, plan.num_segments, head_size),
                           dtype=torch.float32, device=query.device)
    part_ml = torch.empty((q_tokens, num_heads, plan.num_segments, 2),
                          dtype=torch.float32, device=query.device)
    lay = _layout_constexprs(head_size)
    num_seqs = seq_lens.shape[0]
    grid = (num_seqs * plan.q_tiles, num_kv_heads, plan.num_segments)
    _kvarn_split_kernel[grid](
        query, cache, cache.view(torch.float16), block_table, seq_lens, query_start_loc,
        part_acc, part_ml, scale * math.log2(math.e),
        plan.q_tiles, plan.num_segments, cache.shape[1],
        query.stride(0), query.stride(1), block_table.stride(0),
        cache.stride(0), cache.stride(1), cache.stride(2),
        NUM_HEADS=num_heads, GROUP=group, BLOCK_Q=plan.block_q, BLOCK_M=plan.block_m,
        SUB_N=chunk_tokens, num_warps=4, **lay,
    )
    _kvarn_reduce_kernel[(q_tokens, num_heads)](
        part_acc, part_ml, out, plan.num_segments, out.stride(0), out.stride(1),
        NUM_HEADS=num_heads, D=head_size, LOG2_D=lay["LOG2_D"],
    )
    return out
