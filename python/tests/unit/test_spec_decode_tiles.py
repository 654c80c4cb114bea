"""spec-decode-attn's Triton split pass on 8-bit KV caches, per tile plan, on the interpreter.

Issue 21: the H200 sweep (benchmarks/spec_decode_attn.py --sweep-8bit) may pick any tile plan
of its grid, and either widening of int8 tiles, as a cache family's production plan
(TILE_PLANS in the overlay). Each of those must give the reference's result. The interpreter
ignores num_warps and num_stages (they change scheduling, not arithmetic), so what differs
between the grid's configs here is the key tile (tile_n), the KV split and the kernel switches.

The overlay file is loaded by path under a private name, its planner import pointed at the
overlay's planner and its ``vllm.triton_utils`` import at Triton itself (vLLM's CPU build
disables Triton there), with TRITON_INTERPRET=1 while its kernels are decorated: no patched
tree, no subprocess.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.support import kvarn_ref
from tests.support import spec_decode_ref as ref
from tests.support.modules import load_module

pytestmark = pytest.mark.unit

OPS_DIR = Path(__file__).resolve().parents[3] / "patches/overlay/vllm/v1/attention/ops"
PLAN_MODULE = "vllm.v1.attention.ops.spec_decode_attention_plan"
# Small shapes: 2 kv heads x 6 query heads each, head_size 64, 16-token cache blocks.
KV_HEADS, GROUP, HEAD_SIZE, BLOCK_SIZE = 2, 6, 64, 16
# Two requests, ragged: query lengths 8 and 3 over 270 and 90 keys (NaN past their ends).
QUERY_LENS, KV_LENS = [8, 3], [270, 90]
# bf16 q and P rounding against the float32 reference of the dequantized cache (the patch
# tests' INT8_REL_ERR / FP8_REL_ERR; 5e-3..6e-3 measured).
REL_ERR = 1e-2
# The tile_n values of the sweep's grid, and the KV splits it runs (the planner's for the
# model's shapes on an H200, and a forced one).
TILE_NS = (32, 64, 128)
SEGMENTS = (None, 4)


def _load(name: str, module_name: str) -> ModuleType:
    return load_module(OPS_DIR / f"{name}.py", module_name)


# _widen and _quantize_q of the loaded overlay, for the kernels below (jit functions
# resolve globals).
_widen: Any = None
_quantize_q: Any = None


@pytest.fixture(scope="module")
def sda() -> Iterator[Any]:
    """The overlay module, its kernels decorated for the interpreter (TRITON_INTERPRET=1 is
    read at decoration; set only while the module loads, as kvarn_ref.load_kvarn does)."""
    global _widen, _quantize_q
    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("TRITON_INTERPRET", "1")
        plan = _load("spec_decode_attention_plan", "_overlay_tiles_plan")
        mp.setitem(sys.modules, PLAN_MODULE, plan)
        utils = types.ModuleType("vllm.triton_utils")
        utils.tl, utils.triton = tl, triton  # type: ignore[attr-defined]
        mp.setitem(sys.modules, "vllm.triton_utils", utils)
        module = _load("spec_decode_attention", "_overlay_tiles_sda")
        mp.delenv("TRITON_INTERPRET")
        # The bf16 fixes of the interpreter, undone with the fixture (other modules' tests
        # share this worker).
        for name in ("create_dot", "create_si_to_fp"):
            mp.setattr(interpreter.InterpreterBuilder, name,
                       getattr(interpreter.InterpreterBuilder, name))
        ref.fix_interpreter_bf16_dot()
        _widen = module._widen
        _quantize_q = module._quantize_q
        yield module
    finally:
        mp.undo()


@pytest.fixture(autouse=True)
def _interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton also reads TRITON_INTERPRET while launching an interpreted kernel, and its
    standard library (tl.cdiv, tl.max...) may have been decorated compiled by another test
    of this worker: both per test, as test_kvarn_kernels does."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kvarn_ref.interpret_triton_stdlib(monkeypatch)


def _workspace(sda: Any) -> Any:
    return sda.SpecDecodeWorkspace(
        max_tokens=len(QUERY_LENS) * max(QUERY_LENS), num_heads=KV_HEADS * GROUP,
        head_size=HEAD_SIZE, device=torch.device("cpu"), num_sms=8,
    )


def _batch(kind: str, seed: int) -> ref.PagedBatch:
    args = (QUERY_LENS, KV_LENS, KV_HEADS, GROUP, HEAD_SIZE, BLOCK_SIZE)
    if kind == "int8":
        batch = ref.make_int8_batch(*args, torch.bfloat16, "cpu", seed)
    elif kind == "int8/fp16":
        batch = ref.make_int8_batch(*args, torch.float16, "cpu", seed)
    elif kind == "fp8":  # per tensor, with TRITON_ATTN's fp8 queries
        batch = ref.make_fp8_batch(*args, ref.FP8, "cpu", seed)
    else:
        raise AssertionError(kind)
    ref.poison_tail(batch)
    return batch


def _run(sda: Any, batch: ref.PagedBatch, tiles: Any, segments: int | None) -> dict[str, Any]:
    ws = _workspace(sda)
    plan = sda.plan_launch(
        len(QUERY_LENS), max(QUERY_LENS), KV_HEADS * GROUP, KV_HEADS, HEAD_SIZE, ws,
        kernel="triton", **tiles.plan_overrides(),
        **({} if segments is None else {"num_segments": segments, "min_segment_tokens": 1}),
    )
    out_dtype = torch.float16 if batch.query.dtype == torch.float16 else torch.bfloat16
    out = torch.full(batch.query.shape, float("nan"), dtype=out_dtype)
    sda.spec_decode_attention(
        batch.query, batch.key_cache, batch.value_cache, out, batch.cu_seqlens_q,
        batch.seq_lens, batch.block_table, batch.max_query_len, HEAD_SIZE**-0.5, ws, plan,
        batch.k_scale_cache, batch.v_scale_cache, batch.q_descale, batch.k_descale,
        batch.v_descale, tiles,
    )
    result = ref.compare(out, ref.reference(batch, HEAD_SIZE**-0.5), batch)
    result["out"] = out
    result["tile_n"] = plan.tile_n
    result["segments"] = plan.num_segments
    result["q_tiles"] = plan.q_tiles
    return result


def test_widen_is_exact_for_every_int8_value(sda: Any) -> None:
    """Both widenings of _widen, to bf16 and to fp16, give every int8 code's value."""
    import triton
    import triton.language as tl

    # Decorated while _interpreted holds TRITON_INTERPRET=1: an interpreted kernel.
    @triton.jit  # type: ignore[untyped-decorator]
    def widen_kernel(src: Any, dst: Any, OUT_FP16: tl.constexpr,
                     FAST_INT8: tl.constexpr) -> None:
        offs = tl.arange(0, 256)
        tl.store(dst + offs, _widen(tl.load(src + offs), OUT_FP16, FAST_INT8))

    codes = torch.arange(-128, 128, dtype=torch.int8)
    for out_dtype in (torch.bfloat16, torch.float16):
        for fast in (True, False):
            got = torch.empty(256, dtype=out_dtype)
            widen_kernel[(1,)](codes, got, out_dtype == torch.float16, fast)
            assert torch.equal(got.float(), codes.float()), (out_dtype, fast, got)


@pytest.mark.parametrize("segments", SEGMENTS, ids=lambda s: f"seg{s or 'plan'}")
@pytest.mark.parametrize("tile_n", TILE_NS)
def test_int8_tile_plans_match_reference(sda: Any, tile_n: int, segments: int | None) -> None:
    """Each tile of the grid with the widening an H200 takes (Triton's cast; the plan's
    None, which use_fast_int8 resolves to the cast off sm_86)."""
    batch = _batch("int8", seed=tile_n + (segments or 0))
    tiles = sda.TilePlan(tile_n=tile_n)
    assert not sda.use_fast_int8(tiles, torch.device("cpu"))
    got = _run(sda, batch, tiles, segments)
    assert got["tile_n"] == tile_n, got
    assert got["unwritten_rows"] == 0 and got["rel_err"] < REL_ERR, got


@pytest.mark.parametrize("tile_n", TILE_NS)
def test_int8_bit_widening_matches_reference(sda: Any, tile_n: int) -> None:
    """Each tile of the grid with _widen's bit arithmetic (what an sm_86 card takes)."""
    batch = _batch("int8", seed=60 + tile_n)
    got = _run(sda, batch, sda.TilePlan(tile_n=tile_n, fast_int8=True), 4)
    assert got["unwritten_rows"] == 0 and got["rel_err"] < REL_ERR, got


@pytest.mark.parametrize("fast", [True, False], ids=["bits", "cast"])
def test_int8_with_fp16_queries(sda: Any, fast: bool) -> None:
    """fp16 models: _widen's fp16 branch (0x6400 | u) and the plain cast."""
    batch = _batch("int8/fp16", seed=3)
    got = _run(sda, batch, sda.TilePlan(tile_n=64, fast_int8=fast), 4)
    assert got["unwritten_rows"] == 0 and got["rel_err"] < REL_ERR, got


# Q.K on the int8 MMA (TilePlan.int8_qk), against the widened path on the same batch. Two
# terms carry q to ~2^-15 of its row max, far below bf16's 2^-9 rounding of P and the output,
# so the error must be the widened path's to within noise (measured: equal to 3 digits). One
# term rounds q to 1/254 of its row max (RMS ~0.2 % of that max an element): measured
# 2-3x the widened path's error here, and under REL_ERR.
INT8_QK_SAME = 1.05


def _int8_qk_runs(sda: Any, kind: str, seed: int, tile_n: int) -> dict[int, dict[str, Any]]:
    """The same batch with int8_qk = 0 (K widened), 1 and 2; each result with its output."""
    batch = _batch(kind, seed)
    runs = {}
    for terms in (0, 1, 2):
        runs[terms] = _run(sda, batch, sda.TilePlan(tile_n=tile_n, int8_qk=terms), 4)
    return runs


def test_int8_qk_takes_zero_one_or_two_terms(sda: Any) -> None:
    with pytest.raises(ValueError, match=r"int8_qk=3\).*0 \(off\), 1 or 2"):
        sda.TilePlan(int8_qk=3)


@pytest.mark.parametrize(("kind", "tile_n"), [("int8", 32), ("int8", 64), ("int8/fp16", 32)])
def test_int8_qk_matches_reference(sda: Any, kind: str, tile_n: int) -> None:
    """Q.K on the int8 MMA with the query rows quantized in the kernel, over the ragged,
    NaN-tailed batch: both term counts within REL_ERR of the float32 reference, two terms
    as close as the widened path, one term measurably further (the rounding of q shows:
    the switch was taken), and each output differs from the widened one."""
    runs = _int8_qk_runs(sda, kind, seed=80 + tile_n, tile_n=tile_n)
    for terms, got in runs.items():
        assert got["unwritten_rows"] == 0 and got["rel_err"] < REL_ERR, (terms, got)
    widened, one, two = runs[0], runs[1], runs[2]
    assert two["rel_err"] <= widened["rel_err"] * INT8_QK_SAME, (two, widened)
    assert one["rel_err"] > two["rel_err"] * 1.2, (one, two)
    assert not torch.equal(one["out"], widened["out"])
    assert not torch.equal(two["out"], widened["out"])


def test_int8_qk_rounds_rows_as_specified(sda: Any) -> None:
    """_quantize_q on rows of very different magnitudes and a zero row: each row's codes
    times its scale give the row back to half a step (one term) and to half a step of the
    second term (two terms); the largest element of each row is code +-127; a zero row
    gives codes 0 and scale 0, never NaN."""
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def kernel(src: Any, hi: Any, lo: Any, sc: Any, TERMS: tl.constexpr) -> None:
        rows = tl.arange(0, 4)
        offs = rows[:, None] * 64 + tl.arange(0, 64)[None, :]
        q_hi, q_lo, q_sc = _quantize_q(tl.load(src + offs), TERMS)
        tl.store(hi + offs, q_hi)
        tl.store(lo + offs, q_lo)
        tl.store(sc + rows, q_sc)

    gen = torch.Generator().manual_seed(5)
    q = torch.randn(4, 64, generator=gen) * torch.tensor([1.0, 1e-3, 300.0, 0.0])[:, None]
    q = q.to(torch.bfloat16)
    for terms in (1, 2):
        hi, lo = torch.empty(4, 64, dtype=torch.int8), torch.empty(4, 64, dtype=torch.int8)
        sc = torch.empty(4)
        kernel[(1,)](q, hi, lo, sc, terms)
        assert torch.equal(hi.abs().amax(dim=1), torch.tensor([127, 127, 127, 0], dtype=torch.int8))
        codes = hi.float() if terms == 1 else hi.float() * 256 + lo.float()
        back = codes * sc[:, None]
        assert torch.all((back - q.float()).abs() <= sc[:, None] * 0.5 * 1.0001), terms
        assert sc[3] == 0 and torch.equal(back[3], torch.zeros(64))
    assert float(sc[0]) == pytest.approx(float(q[0].float().abs().max()) / 127 / 256)


@pytest.mark.parametrize(("tile_n", "fp8_qk"), [(32, True), (64, True), (128, True),
                                                (64, False)])
def test_fp8_tile_plans_match_reference(sda: Any, tile_n: int, fp8_qk: bool) -> None:
    """Per-tensor fp8 with fp8 queries: Q.K on the e4m3 codes, or widened."""
    batch = _batch("fp8", seed=40 + tile_n)
    assert batch.query.dtype == ref.FP8 and batch.q_descale is not None
    got = _run(sda, batch, sda.TilePlan(tile_n=tile_n, fp8_qk=fp8_qk), 4)
    assert got["unwritten_rows"] == 0 and got["rel_err"] < REL_ERR, got


def test_production_plans_are_the_table(sda: Any) -> None:
    """Every cache family has an entry; the sweep's grid can express each of them."""
    assert set(sda.TILE_PLANS) == {"16bit", "int8", "fp8"}
    assert sda.TILE_PLANS["16bit"] == sda.TilePlan()  # bf16 keeps the planner's plan
    for plan in sda.TILE_PLANS.values():
        assert plan.tile_n in (None, *TILE_NS)
    cases = {torch.int8: "int8", ref.FP8: "fp8", torch.bfloat16: "16bit"}
    for dtype, family in cases.items():
        assert sda.kv_family(torch.zeros(1, dtype=dtype)) == family


def test_cards_take_their_own_plans(sda: Any) -> None:
    """tile_plan: a card's ARCH_TILE_PLANS entry where it has one (sm_86's bf16 and int8),
    the H200's TILE_PLANS otherwise (fp8 on sm_86; every family on sm_90 and without a
    CUDA card, as a CPU cache is)."""
    sm86 = sda.ARCH_TILE_PLANS[(8, 6)]
    assert set(sm86) == {"16bit", "int8"}
    assert sda.tile_plan("int8", (8, 6)) == sm86["int8"] != sda.TILE_PLANS["int8"]
    assert sda.tile_plan("16bit", (8, 6)) == sm86["16bit"] != sda.TILE_PLANS["16bit"]
    assert sda.tile_plan("fp8", (8, 6)) == sda.TILE_PLANS["fp8"]
    for family in sda.TILE_PLANS:
        assert sda.tile_plan(family, (9, 0)) == sda.TILE_PLANS[family]
        assert sda.tile_plan(family, None) == sda.TILE_PLANS[family]
    assert sda.cache_tile_plan(torch.zeros(1, dtype=torch.int8)) == sda.TILE_PLANS["int8"]
    # Two query terms: one misses stock's error (test_int8_qk_matches_reference).
    assert sm86["int8"].int8_qk == 2 and sm86["int8"].tile_n in TILE_NS


@pytest.mark.parametrize("kind", ["int8", "int8/fp16"])
def test_rtx3090_int8_plan_matches_reference(sda: Any, kind: str) -> None:
    """The RTX 3090's int8 plan with the widening that card takes (_widen's bit arithmetic
    for V, use_fast_int8 below sm_90) over the ragged, NaN-tailed batch: within REL_ERR of
    the float32 reference and as close as the H200's widened-K plan on the same batch."""
    batch = _batch(kind, seed=120)
    sm86 = dataclasses.replace(sda.tile_plan("int8", (8, 6)), fast_int8=True)
    got = _run(sda, batch, sm86, 4)
    widened = _run(sda, batch, sda.TILE_PLANS["int8"], 4)
    assert got["tile_n"] == sm86.tile_n, got
    assert got["unwritten_rows"] == 0 and got["rel_err"] < REL_ERR, got
    assert got["rel_err"] <= widened["rel_err"] * INT8_QK_SAME, (got, widened)
    assert not torch.equal(got["out"], widened["out"])  # Q.K did take the int8 MMA
    # Its query tiles of at most 64 rows, here capped at 32 so that the 8-token request
    # (48 rows) takes two: the same result to rounding.
    assert sm86.max_block_m == 64
    two_tiles = _run(sda, batch, dataclasses.replace(sm86, max_block_m=32), 4)
    assert two_tiles["q_tiles"] == 2 and got["q_tiles"] == 1, (two_tiles, got)
    assert two_tiles["unwritten_rows"] == 0 and two_tiles["rel_err"] < REL_ERR, two_tiles
    assert two_tiles["rel_err"] <= widened["rel_err"] * INT8_QK_SAME, two_tiles


# TilePlan.k_align8: 8-byte K copies (the layout's K rows are 8-byte aligned; see the
# compile report for the copies' widths).
def test_int8_k_align8_matches_reference(sda: Any) -> None:
    """TilePlan.k_align8 on the same batch: the arithmetic is unchanged (bit for bit); and
    rows_aligned, the launcher's check before it says 8, holds for this layout's K rows and
    refuses V rows and a K view shifted by 4 bytes."""
    batch = _batch("int8", seed=9)
    k, v = batch.key_cache, batch.value_cache
    # K rows at 2 x (head size + 4) x head: 8-byte aligned; V rows 4 bytes further.
    assert sda.rows_aligned(k, 8) and not sda.rows_aligned(v, 8) and sda.rows_aligned(v, 4)
    raw = k.as_strided((k.numel() + 64,), (1,), 0)
    assert not sda.rows_aligned(raw[4:].as_strided(k.shape, k.stride()), 8)
    a8 = _run(sda, batch, sda.TilePlan(tile_n=32, k_align8=True), 4)
    a4 = _run(sda, batch, sda.TilePlan(tile_n=32), 4)
    assert a8["unwritten_rows"] == 0 and a8["rel_err"] < REL_ERR, a8
    assert torch.equal(a8["out"], a4["out"])
