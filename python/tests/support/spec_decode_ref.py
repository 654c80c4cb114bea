"""Paged verify batches and a float32 reference for the spec-decode-attn kernel.

Shared by the kernel tests beside this file (the CPU interpreter runs) and the H200
benchmark (python/benchmarks/spec_decode_attn.py). The KV cache is built the way vLLM
0.28.0's TRITON_ATTN and FLASH_ATTN backends hold it: one tensor of logical shape (blocks,
kv_heads, block_size, 2*head_size) stored NHD, viewed as (blocks, block_size, kv_heads,
2*head_size) and split into K and V, so the kernel sees the real, non-contiguous strides.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch


@dataclass
class PagedBatch:
    """One verify batch: queries, the paged cache and vLLM's per-request metadata."""

    query: torch.Tensor  # [tokens, heads, head_size]
    key_cache: torch.Tensor  # [blocks, block_size, kv_heads, head_size] view
    value_cache: torch.Tensor
    kv_cache: torch.Tensor  # the packed logical (blocks, kv_heads, block_size, 2*hs)
    cu_seqlens_q: torch.Tensor  # [seqs + 1] int32
    seq_lens: torch.Tensor  # [seqs] int32, KV length including the verify block
    block_table: torch.Tensor  # [seqs, max_blocks] int32
    query_lens: list[int]
    kv_lens: list[int]
    # int8_per_token_head caches only: float32 [blocks, block_size, kv_heads] views of the
    # scales stored inline after each head's int8 data (key_cache is then that padded int8
    # view, its last dimension head_size + 4).
    k_scale_cache: torch.Tensor | None = None
    v_scale_cache: torch.Tensor | None = None
    # Per-tensor fp8 caches only: float32 [seqs, kv_heads] descales (TRITON_ATTN expands the
    # layer's scalar _k_scale/_v_scale to that shape), and an fp8 query's scalar descale.
    k_descale: torch.Tensor | None = None
    v_descale: torch.Tensor | None = None
    q_descale: torch.Tensor | None = None

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    @property
    def num_kv_heads(self) -> int:
        return int(self.key_cache.shape[2])

    def kv_bytes(self) -> int:
        """Bytes of K and V the batch must read once (the HBM floor's numerator); a
        per-token-head cache's rows include their 4-byte scales."""
        per_token = 2 * self.num_kv_heads * self.key_cache.shape[3] * self.key_cache.element_size()
        return int(sum(self.kv_lens) * per_token)


def make_batch(
    query_lens: list[int],
    kv_lens: list[int],
    num_kv_heads: int,
    group: int,
    head_size: int,
    block_size: int,
    dtype: torch.dtype,
    device: str | torch.device,
    seed: int,
    spare_blocks: int = 3,
) -> PagedBatch:
    """Random (never zero) queries and cache; blocks handed out in a shuffled order and
    spare blocks filled with large values, so a wrong block index shows up as error."""
    gen = torch.Generator(device=device).manual_seed(seed)
    blocks_per_seq = [max(1, -(-kv // block_size)) for kv in kv_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    kv_cache = torch.randn(
        (num_blocks, block_size, num_kv_heads, 2 * head_size), generator=gen, device=device
    ).to(dtype)
    order = torch.randperm(num_blocks, generator=gen, device=device).to(torch.int32)
    block_table = torch.zeros(
        (len(kv_lens), max(blocks_per_seq)), dtype=torch.int32, device=device
    )
    used = 0
    for i, n in enumerate(blocks_per_seq):
        block_table[i, :n] = order[used : used + n]
        used += n
    kv_cache[order[used:].long()] = 64.0
    logical, key_cache, value_cache = paged_views(kv_cache, head_size)
    return with_queries(
        PagedBatch(
            query=torch.empty(0),
            key_cache=key_cache,
            value_cache=value_cache,
            kv_cache=logical,
            cu_seqlens_q=torch.empty(0),
            seq_lens=torch.tensor(kv_lens, dtype=torch.int32, device=device),
            block_table=block_table,
            query_lens=[],
            kv_lens=list(kv_lens),
        ),
        query_lens,
        num_kv_heads * group,
        seed + 7919,
    )


def paged_views(
    raw: torch.Tensor, head_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From a contiguous (blocks, block_size, kv_heads, 2*head_size) tensor: the logical
    (blocks, kv_heads, block_size, 2*hs) view with NHD strides, as vLLM allocates it, and
    the K and V views the kernels are given."""
    logical = raw.permute(0, 2, 1, 3)
    key_cache, value_cache = torch.split(logical.transpose(1, 2), head_size, dim=-1)
    return logical, key_cache, value_cache


def with_queries(
    batch: PagedBatch, query_lens: list[int], num_heads: int, seed: int
) -> PagedBatch:
    """The same cache and KV lengths with fresh random queries of other lengths."""
    if len(query_lens) != len(batch.kv_lens):
        raise ValueError("one query length per request")
    for q, kv in zip(query_lens, batch.kv_lens, strict=True):
        if q > kv:
            raise ValueError(f"query length {q} exceeds KV length {kv}")
    device = batch.key_cache.device
    gen = torch.Generator(device=device).manual_seed(seed)
    tokens = sum(query_lens)
    head_size = batch.key_cache.shape[3]
    dtype = batch.key_cache.dtype
    if batch.k_scale_cache is not None:
        # A per-token-head cache: rows padded by the 4-byte scale, 16-bit queries.
        head_size -= 4
        dtype = batch.query.dtype
    elif batch.k_descale is not None:
        dtype = batch.query.dtype  # a per-tensor fp8 cache: the batch's query dtype
    query = torch.randn((tokens, num_heads, head_size), generator=gen, device=device)
    if dtype == FP8 and batch.q_descale is not None:
        query = to_fp8(query / batch.q_descale)
    else:
        query = query.to(dtype)
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    return replace(
        batch,
        query=query,
        cu_seqlens_q=torch.tensor(starts, dtype=torch.int32, device=device),
        query_lens=list(query_lens),
    )


def make_int8_batch(
    query_lens: list[int],
    kv_lens: list[int],
    num_kv_heads: int,
    group: int,
    head_size: int,
    block_size: int,
    query_dtype: torch.dtype,
    device: str | torch.device,
    seed: int,
) -> PagedBatch:
    """make_batch's data quantized the way vLLM 0.28.0's TRITON_ATTN stores an
    ``int8_per_token_head`` cache: logical (blocks, kv_heads, block_size, 2*(hs + 4)) int8
    stored NHD, each (token, head) holding [K int8 x hs | K scale fp32 | V int8 x hs |
    V scale fp32], scale = max(absmax / 127, 1e-6), values rounded half away from zero
    (triton_reshape_and_cache_flash_per_token_head_quant). The spare blocks' large values
    quantize too, so a wrong block index still shows up as error."""
    src = make_batch(query_lens, kv_lens, num_kv_heads, group, head_size, block_size,
                     torch.float32, device, seed)
    values = src.kv_cache.permute(0, 2, 1, 3)  # contiguous (blocks, bs, kv_heads, 2*hs)
    padded = head_size + 4
    raw = torch.zeros((*values.shape[:3], 2 * padded), dtype=torch.int8, device=device)
    for side in (0, 1):
        x = values[..., side * head_size : (side + 1) * head_size]
        scale = (x.abs().amax(dim=-1) / 127.0).clamp(min=1e-6)
        q = x / scale[..., None]
        q = torch.where(q >= 0, q + 0.5, q - 0.5).trunc().clamp(-128, 127)
        raw[..., side * padded : side * padded + head_size] = q.to(torch.int8)
        scale_bytes = raw[..., side * padded + head_size : (side + 1) * padded]
        scale_bytes.view(torch.float32)[..., 0] = scale
    logical = raw.permute(0, 2, 1, 3)
    key_cache, value_cache = torch.split(logical.transpose(1, 2), padded, dim=-1)
    return replace(
        src,
        query=src.query.to(query_dtype),
        key_cache=key_cache,
        value_cache=value_cache,
        kv_cache=logical,
        k_scale_cache=raw[..., head_size:padded].view(torch.float32)[..., 0],
        v_scale_cache=raw[..., padded + head_size :].view(torch.float32)[..., 0],
    )


FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def to_fp8(x: torch.Tensor) -> torch.Tensor:
    """Round to fp8 e4m3 (nearest), saturating at its largest value as vLLM's cache writes
    do (torch's cast turns out-of-range values into NaN)."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(FP8)


def make_fp8_batch(
    query_lens: list[int],
    kv_lens: list[int],
    num_kv_heads: int,
    group: int,
    head_size: int,
    block_size: int,
    query_dtype: torch.dtype,
    device: str | torch.device,
    seed: int,
    head_scales: bool = False,
) -> PagedBatch:
    """make_batch's data as vLLM 0.28.0's TRITON_ATTN stores an ``fp8``/``fp8_e4m3``
    cache: e4m3 values of x / scale (the layer's per-tensor _k_scale and _v_scale, here
    max |x| / 448 so that the values span e4m3's range), K and V halves of one (blocks,
    kv_heads, block_size, 2*hs) tensor stored NHD, and the [seqs, kv_heads] descales
    expanded from the scalar. head_scales: one scale per kv head instead (a per-head
    checkpoint's scales, which stock's Triton kernel reads only the first of). An fp8
    query_dtype quantizes the queries too, with their own per-tensor scale, as the
    Attention layer does on CUDA before TRITON_ATTN."""
    src = make_batch(query_lens, kv_lens, num_kv_heads, group, head_size, block_size,
                     torch.float32, device, seed)
    values = src.kv_cache.permute(0, 2, 1, 3)  # contiguous (blocks, bs, kv_heads, 2*hs)
    if head_scales:
        # Heads of different magnitudes (x 2^h, exact), so each gets its own scale.
        values = values * (2.0 ** torch.arange(num_kv_heads, device=device))[:, None]
    raw = torch.empty(values.shape, dtype=FP8, device=device)
    descales = []
    for side in (0, 1):
        x = values[..., side * head_size : (side + 1) * head_size]
        per_head = x.abs().amax(dim=(0, 1, 3))
        amax = per_head if head_scales else per_head.max().expand(num_kv_heads)
        scale = (amax / FP8_MAX).clamp(min=1e-6).contiguous()
        raw[..., side * head_size : (side + 1) * head_size] = to_fp8(
            x / scale[None, None, :, None]
        )
        # TRITON_ATTN's descale_shape = (num_seqs, num_kv_heads), a stride-0 expansion.
        shape = (len(kv_lens), num_kv_heads)
        descales.append(scale.expand(shape) if head_scales else scale[:1].expand(shape))
    logical, key_cache, value_cache = paged_views(raw, head_size)
    batch = replace(src, key_cache=key_cache, value_cache=value_cache, kv_cache=logical,
                    k_descale=descales[0], v_descale=descales[1])
    if query_dtype == FP8:
        q_scale = (src.query.abs().amax() / FP8_MAX).reshape(())
        return replace(batch, query=to_fp8(src.query / q_scale), q_descale=q_scale)
    return replace(batch, query=src.query.to(query_dtype))


def make_fp8_pth_batch(
    query_lens: list[int],
    kv_lens: list[int],
    num_kv_heads: int,
    group: int,
    head_size: int,
    block_size: int,
    query_dtype: torch.dtype,
    device: str | torch.device,
    seed: int,
) -> PagedBatch:
    """make_int8_batch's layout with e4m3 values (``fp8_per_token_head``): per (token,
    head) [K e4m3 x hs | K scale fp32 | V e4m3 x hs | V scale fp32], scale = max(absmax /
    448, 1e-6); the K and V views are fp8, as TRITON_ATTN's _pth_key_value_caches gives
    them to its kernels."""
    src = make_batch(query_lens, kv_lens, num_kv_heads, group, head_size, block_size,
                     torch.float32, device, seed)
    values = src.kv_cache.permute(0, 2, 1, 3)
    padded = head_size + 4
    raw = torch.zeros((*values.shape[:3], 2 * padded), dtype=torch.uint8, device=device)
    for side in (0, 1):
        x = values[..., side * head_size : (side + 1) * head_size]
        scale = (x.abs().amax(dim=-1) / FP8_MAX).clamp(min=1e-6)
        raw[..., side * padded : side * padded + head_size] = to_fp8(
            x / scale[..., None]).view(torch.uint8)
        scale_bytes = raw[..., side * padded + head_size : (side + 1) * padded]
        scale_bytes.view(torch.float32)[..., 0] = scale
    logical = raw.permute(0, 2, 1, 3)
    key_cache, value_cache = torch.split(logical.transpose(1, 2).view(FP8), padded, dim=-1)
    return replace(
        src,
        query=src.query.to(query_dtype),
        key_cache=key_cache,
        value_cache=value_cache,
        kv_cache=logical,
        k_scale_cache=raw[..., head_size:padded].view(torch.float32)[..., 0],
        v_scale_cache=raw[..., padded + head_size :].view(torch.float32)[..., 0],
    )


def dequantized(batch: PagedBatch) -> PagedBatch:
    """The batch with a quantized cache replaced by its float32 dequantization (value x
    its (token, head) scale, or x the per-tensor or per-head scale) and an fp8 query by
    its own: what the reference attends over."""
    if batch.q_descale is not None:
        batch = replace(batch, query=batch.query.float() * batch.q_descale, q_descale=None)
    if batch.k_descale is not None and batch.v_descale is not None:
        # The reference's cache is shared by the requests: one scale per kv head.
        k_sc, v_sc = batch.k_descale[0], batch.v_descale[0]
        return replace(
            batch,
            key_cache=batch.key_cache.float() * k_sc[None, None, :, None],
            value_cache=batch.value_cache.float() * v_sc[None, None, :, None],
            k_descale=None, v_descale=None,
        )
    if batch.k_scale_cache is None or batch.v_scale_cache is None:
        return batch
    hs = batch.query.shape[2]
    key = batch.key_cache[..., :hs].float() * batch.k_scale_cache[..., None]
    value = batch.value_cache[..., :hs].float() * batch.v_scale_cache[..., None]
    return replace(batch, key_cache=key, value_cache=value, k_scale_cache=None,
                   v_scale_cache=None)


def poison_tail(batch: PagedBatch) -> None:
    """NaN in K and V of the slots past each request's length in its last block: a kernel
    may load them but must never let them into a result (p = 0 does not cancel NaN). An
    int8 cache cannot hold NaN: its scales there are NaN and its values the largest; an
    fp8 per-token-head one gets NaN values and NaN scales."""
    block_size = batch.key_cache.shape[1]
    for s, kv_len in enumerate(batch.kv_lens):
        if kv_len % block_size:
            block = int(batch.block_table[s, (kv_len - 1) // block_size])
            tail = slice(kv_len % block_size, None)
            if batch.k_scale_cache is not None and batch.v_scale_cache is not None:
                fill = float("nan") if batch.key_cache.dtype == FP8 else 127
                batch.key_cache[block, tail] = fill
                batch.value_cache[block, tail] = fill
                batch.k_scale_cache[block, tail] = float("nan")
                batch.v_scale_cache[block, tail] = float("nan")
            else:
                batch.key_cache[block, tail] = float("nan")
                batch.value_cache[block, tail] = float("nan")


def reference(batch: PagedBatch, scale: float) -> torch.Tensor:
    """Causal paged attention in float32: row i of a request with KV length c and query
    length q sees keys [0, c - q + i]. A quantized cache (and an fp8 query) is
    dequantized first."""
    batch = dequantized(batch)
    q_all = batch.query.float()
    out = torch.zeros_like(q_all)
    block_size = batch.key_cache.shape[1]
    group = batch.query.shape[1] // batch.num_kv_heads
    device = batch.query.device
    for s, (q_len, kv_len) in enumerate(zip(batch.query_lens, batch.kv_lens, strict=True)):
        if q_len == 0:
            continue
        start = int(batch.cu_seqlens_q[s])
        pos = torch.arange(kv_len, device=device)
        blocks = batch.block_table[s, pos // block_size].long()
        slots = pos % block_size
        k = batch.key_cache[blocks, slots].float().repeat_interleave(group, dim=1)
        v = batch.value_cache[blocks, slots].float().repeat_interleave(group, dim=1)
        q = q_all[start : start + q_len]
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        limit = kv_len - q_len + torch.arange(q_len, device=device)
        visible = pos[None, :] <= limit[:, None]
        scores = scores.masked_fill(~visible[None], float("-inf"))
        out[start : start + q_len] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    return out


def compare(out: torch.Tensor, ref: torch.Tensor, batch: PagedBatch) -> dict[str, Any]:
    """Relative L2 error over the rows the batch defines, plus unwritten-row detection
    (the caller poisons ``out`` with NaN first)."""
    tokens = sum(batch.query_lens)
    got = out[:tokens].float()
    want = ref[:tokens]
    unwritten = int(torch.isnan(got).any(dim=-1).any(dim=-1).sum())
    finite = torch.nan_to_num(got, nan=0.0)
    rel = float((finite - want).norm() / want.norm())
    worst = float((finite - want).abs().max())
    return {"rel_err": rel, "max_abs_err": worst, "unwritten_rows": unwritten}


def fix_interpreter_bf16_dot() -> None:
    """Triton's interpreter multiplies bf16 dot operands as their raw uint16 storage
    (triton/runtime/interpreter.py create_dot only converts 8-bit floats), which makes any
    bf16 tl.dot meaningless on the CPU. Widen bf16 operands to float32 first; every other
    bf16 operation of the interpreter (loads, casts, rounding) is left as it is."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder_cls = interpreter.InterpreterBuilder
    original = builder_cls.create_dot

    def widen(handle: Any) -> Any:
        if handle.dtype.scalar == tl.bfloat16:
            bits = handle.data.astype(np.uint32) << 16
            return interpreter.TensorHandle(bits.view(np.float32), tl.float32)
        return handle

    def create_dot(self: Any, a: Any, b: Any, d: Any, *args: Any) -> Any:
        return original(self, widen(a), widen(b), d, *args)

    builder_cls.create_dot = create_dot

    # Likewise an integer cast to bf16 (an int8 KV cache's load) becomes the integer's
    # value as raw uint16 bits (cast_impl's plain astype); go through float32, whose
    # bf16 conversion the interpreter does right.
    int_to_fp = builder_cls.create_si_to_fp

    def create_si_to_fp(self: Any, src: Any, dst_type: Any) -> Any:
        if dst_type.scalar == tl.bfloat16:
            return self.cast_impl(self.cast_impl(src, tl.float32), dst_type)
        return int_to_fp(self, src, dst_type)

    builder_cls.create_si_to_fp = create_si_to_fp
