"""The kvarn tests' helpers: the overlay module loaded for the Triton interpreter, and float32
torch references (the Hadamard matrix, the quantizer written out in torch, a reader of the
packed layout, causal multi-query attention)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from tests.support.modules import load_module

TILE = 128
OVERLAY_FILE = (Path(__file__).resolve().parents[3]
                / "patches/overlay/vllm/v1/attention/ops/kvarn.py")


def load_kvarn(path: Path = OVERLAY_FILE, name: str = "_overlay_kvarn") -> ModuleType:
    """The overlay module (or a deliberately broken copy of it at ``path``; Triton reads a
    kernel's source from its file) under a private name, the real ``vllm`` left out."""
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        module = load_module(path, name)
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved
    return module



def interpret_triton_stdlib(monkeypatch: Any) -> None:
    """Give Triton's standard library (``tl.sum``, ``tl.max``, ``tl.cdiv``...) interpreted
    versions for one test. Triton decides compiled-or-interpreted when a function is
    decorated, and its standard library is decorated when ``triton`` is first imported: in a
    worker where another test imported it first without TRITON_INTERPRET, an interpreted
    kernel calling ``tl.sum`` raised "Cannot call @triton.jit'd outside of the scope of a
    kernel". The swap is undone after the test (monkeypatch), so nothing else sees it."""
    import triton.language as tl
    import triton.language.standard as std
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    swapped: dict[int, Any] = {}
    for module in (std, tl):
        for name, obj in list(vars(module).items()):
            if isinstance(obj, JITFunction):
                new = swapped.setdefault(id(obj), InterpretedFunction(obj.fn))
                monkeypatch.setattr(module, name, new)
    # Members such as ``x.sum()`` are wrappers that close over the compiled function.
    for name, member in list(vars(tl.tensor).items()):
        cells = getattr(member, "__closure__", None) or ()
        target = next((swapped[id(c.cell_contents)] for c in cells
                       if id(c.cell_contents) in swapped), None)
        if target is not None:
            monkeypatch.setattr(tl.tensor, name, _member(target))


def _member(fn: Any) -> Any:
    def member(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)
    return member


def hadamard(d: int) -> torch.Tensor:
    """Orthonormal Sylvester Hadamard matrix (symmetric: its own inverse)."""
    h = torch.ones(1, 1)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


def _normalize(y: torch.Tensor, iters: int) -> torch.Tensor:
    """Column scales of the alternating row/column RMS normalization (unit mean square)."""
    col = torch.ones(y.shape[1])
    for _ in range(iters):
        r2 = ((y / col) ** 2).mean(1)
        row = torch.where(r2 > 0, r2.sqrt(), torch.ones_like(r2))
        col = ((y / row[:, None]) ** 2).mean(0).sqrt()
        rms = (col ** 2).mean().sqrt()
        col = col / rms if rms > 0 else torch.ones_like(col)
        col = col.clamp(min=1e-3)
    return col


def f16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).to(torch.float32)


@dataclass(frozen=True)
class TileCodes:
    k_codes: torch.Tensor  # int [n, D], 0..15
    v_codes: torch.Tensor  # int [n, D], 0..3


def quantize_tile(k: torch.Tensor, v: torch.Tensor, iters: int) -> TileCodes:
    """The store kernel's method in torch, for one head tile of n valid rows [n, D]."""
    h = hadamard(k.shape[1])
    kr = k.float() @ h
    mu = f16(kr.mean(0))
    y = kr - mu
    col = f16(_normalize(y, iters))
    z = y / col
    amax = z.abs().amax(1)
    s = f16(torch.where(amax > 0, amax / 7, torch.ones_like(amax)))
    k_codes = (torch.floor(z / s[:, None] + 0.5).clamp(-8, 7) + 8).to(torch.int32)
    vr = v.float() @ h
    col = f16(_normalize(vr, iters))
    z = vr / col
    lo, hi = z.amin(1), z.amax(1)
    a = f16(torch.where(hi > lo, (hi - lo) / 3, torch.ones_like(hi)))
    b = f16(lo)
    v_codes = torch.floor((z - b[:, None]) / a[:, None] + 0.5).clamp(0, 3).to(torch.int32)
    return TileCodes(k_codes, v_codes)


@dataclass(frozen=True)
class HeadTile:
    """One head tile read back from a kvarn cache, dequantized to the original basis."""

    k_codes: torch.Tensor
    v_codes: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


def read_head_tile(kv: ModuleType, cache: torch.Tensor, block: int, tile: int, head: int,
                   n: int) -> HeadTile:
    nbytes = cache.shape[3]
    raw = cache[block, tile, head]
    head_size = next(x for x in (64, 128, 256, 512) if kv.head_tile_bytes(x) == nbytes)
    lay = kv.HeadTileLayout(head_size)

    def f16_field(off: int, count: int) -> torch.Tensor:
        return raw[off:off + 2 * count].view(torch.float16).float()

    kb = raw[lay.k_codes:lay.v_codes].view(TILE, head_size // 2)[:n].int()
    k_codes = torch.stack([kb & 15, kb >> 4], -1).reshape(n, head_size)
    vb = raw[lay.v_codes:lay.k_token_scale].view(TILE, head_size // 4)[:n].int()
    v_codes = torch.stack([(vb >> (2 * j)) & 3 for j in range(4)], -1).reshape(n, head_size)
    k_s = f16_field(lay.k_token_scale, TILE)[:n]
    v_a = f16_field(lay.v_token_scale, TILE)[:n]
    v_b = f16_field(lay.v_token_zero, TILE)[:n]
    k_mu = f16_field(lay.k_channel_mean, head_size)
    k_c = f16_field(lay.k_channel_scale, head_size)
    v_c = f16_field(lay.v_channel_scale, head_size)
    h = hadamard(head_size)
    k_rot = k_mu + k_c * k_s[:, None] * (k_codes - 8).float()
    v_rot = v_c * (v_a[:, None] * v_codes.float() + v_b[:, None])
    return HeadTile(k_codes, v_codes, k_rot @ h, v_rot @ h)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of one request's queries [q_len, H, D] over its whole context
    k, v [seq_len, H_kv, D] (the queries are its last q_len positions), in float32."""
    q_len, heads, _ = q.shape
    seq_len, kv_heads, _ = k.shape
    group = heads // kv_heads
    kk = k.float().repeat_interleave(group, 1)
    vv = v.float().repeat_interleave(group, 1)
    s = torch.einsum("qhd,khd->hqk", q.float(), kk) * scale
    pos = torch.arange(seq_len)
    last = seq_len - q_len + torch.arange(q_len)
    s = s.masked_fill(pos[None, None, :] > last[None, :, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), vv)
