"""spec-decode-attn's launch planner and TMA checks, imported straight from the overlay.

``spec_decode_attention_plan.py`` decides from shapes only and imports neither vLLM nor
Triton, so these tests load the overlay file itself: no patched tree, no GPU, no reinstall.
The kernels and their dispatch need a patched tree (test_spec_decode_attn.py).
"""

from __future__ import annotations

import ast
import math
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.modules import load_module

pytestmark = pytest.mark.unit

OPS_DIR = Path(__file__).resolve().parents[3] / "patches/overlay/vllm/v1/attention/ops"


def _load(name: str) -> ModuleType:
    """An overlay module by file path, under a private name (the real ``vllm`` stays out)."""
    return load_module(OPS_DIR / f"{name}.py", f"_overlay_{name}")


if TYPE_CHECKING:
    import torch
    import vllm.v1.attention.ops.spec_decode_attention_plan as plan
else:
    plan = _load("spec_decode_attention_plan")

# The model's attention: 24 query heads over 4 kv heads, head_size 256.
HEADS, KV_HEADS, HEAD_SIZE = 24, 4, 256
# (card, SMs, shared memory a program may use, Hopper split pass)
CARDS = [
    ("h200", 132, 227 << 10, True),
    ("h200-triton", 132, 227 << 10, False),
    ("rtx3090", 82, 99 << 10, False),
]


def _shape(sms: int, smem: int, hopper: bool, max_tokens: int = 64) -> plan.WorkspaceShape:
    return plan.WorkspaceShape(max_tokens, HEADS, HEAD_SIZE, sms, max_shared_mem=smem,
                               hopper=hopper)


def test_the_planner_imports_neither_vllm_nor_triton() -> None:
    tree = ast.parse((OPS_DIR / "spec_decode_attention_plan.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"math", "dataclasses", "typing", "torch"}, imported
    # torch only for annotations: the module loaded above without it being needed.
    assert "if TYPE_CHECKING:\n    import torch" in (OPS_DIR / "spec_decode_attention_plan.py"
                                                     ).read_text()


@pytest.mark.parametrize(("card", "sms", "smem", "hopper"), CARDS)
def test_query_rows_are_tiled_never_capped(card: str, sms: int, smem: int, hopper: bool) -> None:
    """Gotcha 12's cap bug: every verify length up to 64 is covered by the plan's tiles."""
    ws = _shape(sms, smem, hopper)
    for q in range(2, 65):
        p = plan.plan_launch(1, q, HEADS, KV_HEADS, HEAD_SIZE, ws)
        assert p.block_q * p.q_tiles >= q, (card, q, p)
        assert (p.block_q * (p.q_tiles - 1)) < q, (card, q, p)  # no empty tile
        assert p.block_m <= plan.MAX_BLOCK_M and p.block_q >= 1, (card, q, p)
        assert plan.plan_smem(p, HEAD_SIZE) <= smem, (card, q, p)
        assert p.kernel == ("hopper" if hopper else "triton"), (card, q)


def test_query_tile_sizes_at_the_model_shape() -> None:
    # The Triton kernel's 128-row tile holds 21 tokens at G=6; the Hopper kernel's two
    # 64-row warpgroups hold 10 each (one warpgroup up to 10).
    triton = _shape(132, 227 << 10, False)
    hopper = _shape(132, 227 << 10, True)

    def tiles(ws: plan.WorkspaceShape, q: int) -> int:
        return plan.plan_launch(1, q, HEADS, KV_HEADS, HEAD_SIZE, ws).q_tiles

    assert (tiles(triton, 21), tiles(triton, 22)) == (1, 2)
    assert (tiles(hopper, 20), tiles(hopper, 21)) == (1, 2)
    wg = {q: plan.plan_launch(1, q, HEADS, KV_HEADS, HEAD_SIZE, hopper).block_m for q in (10, 11)}
    assert wg == {10: 64, 11: 128}


def test_workspace_sizing() -> None:
    # 64 tokens x 24 heads x (256 + 2) fp32 values = 1.51 MiB a segment; the 64 MiB budget
    # holds 42 of them, rounded down to a power of two.
    ws = _shape(132, 227 << 10, False)
    per_segment = 64 * HEADS * (HEAD_SIZE + 2) * 4
    assert ws.segments_per_token == 1 << int(math.log2(plan.WORKSPACE_BUDGET_BYTES // per_segment))
    assert ws.segments_per_token == 32
    assert ws.slots_per_head == 64 * 32 and ws.slots == 64 * 32 * HEADS
    # A budget too small for one segment still gets one slot per (token, head).
    assert plan.segments_per_token(64, HEADS, HEAD_SIZE, budget_bytes=1) == 1
    # A generous one stops at the launch ceiling.
    assert plan.segments_per_token(1, 1, 16, budget_bytes=1 << 40) == plan.MAX_SEGMENTS
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        plan.WorkspaceShape(0, HEADS, HEAD_SIZE, 132)


@settings(max_examples=300, deadline=None)
@given(
    num_seqs=st.integers(1, 16),
    qmax=st.integers(2, 32),
    data=st.data(),
    kv_heads=st.sampled_from([1, 2, 4, 8]),
    group=st.sampled_from([1, 2, 4, 6, 8, 16]),
    head_size=st.sampled_from([64, 128, 256]),
    card=st.sampled_from(CARDS),
)
def test_plans_fit_their_workspace_and_grid(
    num_seqs: int, qmax: int, data: st.DataObject, kv_heads: int, group: int, head_size: int,
    card: tuple[str, int, int, bool],
) -> None:
    """Whatever the batch, a plan stays inside the scratch sized at startup (the launch
    raises otherwise) and its grids cover every request, query tile and head."""
    _name, sms, smem, hopper = card
    heads = kv_heads * group
    ws = plan.WorkspaceShape(num_seqs * qmax, heads, head_size, sms, max_shared_mem=smem,
                             hopper=hopper)
    q = data.draw(st.integers(2, qmax), label="max_query_len")
    p = plan.plan_launch(num_seqs, q, heads, kv_heads, head_size, ws)
    assert p.num_segments & (p.num_segments - 1) == 0 and p.num_segments <= plan.MAX_SEGMENTS
    assert num_seqs * q * p.num_segments <= ws.slots_per_head
    assert p.split_grid == (num_seqs * p.q_tiles, kv_heads, p.num_segments)
    assert p.block_q * p.q_tiles >= q
    assert p.min_segment_tokens % p.tile_n == 0
    assert p.min_segment_tokens >= plan.MIN_SEGMENT_TOKENS
    assert plan.plan_smem(p, head_size) <= smem
    if p.kernel == "hopper":
        assert hopper and head_size % 64 == 0 and group <= 64
        assert p.block_m == 64 * p.num_wg and p.block_q == p.wg_q * p.num_wg
        assert p.wg_q * group <= 64  # a warpgroup's 64 rows hold its query tokens' heads
        assert p.reduce_grid == (num_seqs * q, heads)  # always partials
    else:
        assert p.block_q * group <= p.block_m
        assert p.reduce_grid == (None if p.num_segments == 1 else (num_seqs * q, heads))


@settings(max_examples=60, deadline=None)
@given(num_seqs=st.integers(1, 8), q=st.integers(2, 16), sms=st.sampled_from([16, 82, 132]))
def test_hopper_plans_of_the_model_shape_may_merge_their_own_partials(
    num_seqs: int, q: int, sms: int
) -> None:
    """The int8 Hopper pass merges its own partials only where every program of the grid
    is resident at once (one an SM) and each takes an equal share of the head's columns:
    the Hopper planner's own plans always qualify, a forced grid wider than the card does
    not, and neither does a Triton plan."""
    ws = _shape(sms, 227 << 10, True, max_tokens=num_seqs * 16)
    p = plan.plan_launch(num_seqs, q, HEADS, KV_HEADS, HEAD_SIZE, ws)
    assert p.kernel == "hopper" and not p.fused_reduce  # the field defaults off
    programs = math.prod(p.split_grid)
    assert plan.fusable_grid(p, HEAD_SIZE, sms) == (programs <= sms)
    assert programs <= sms or num_seqs * KV_HEADS > sms
    wide = plan.plan_launch(num_seqs, q, HEADS, KV_HEADS, HEAD_SIZE, ws,
                            num_segments=plan.MAX_SEGMENTS)
    assert not plan.fusable_grid(wide, HEAD_SIZE, sms)  # 128 segments x 4 heads > sms
    assert not plan.fusable_grid(p, 96, sms) or 96 % p.num_segments == 0
    triton = plan.plan_launch(num_seqs, q, HEADS, KV_HEADS, HEAD_SIZE, ws, kernel="triton")
    assert not plan.fusable_grid(triton, HEAD_SIZE, sms)


def test_forced_shapes_are_honoured_or_refused() -> None:
    ws = _shape(132, 227 << 10, True)
    forced = plan.plan_launch(1, 8, HEADS, KV_HEADS, HEAD_SIZE, ws, kernel="triton",
                              num_segments=4, tile_n=64, bt_lookahead=0)
    assert (forced.kernel, forced.num_segments, forced.tile_n, forced.bt_lookahead) == (
        "triton", 4, 64, 0)
    with pytest.raises(ValueError, match="power of two"):
        plan.plan_launch(1, 8, HEADS, KV_HEADS, HEAD_SIZE, ws, num_segments=3)
    with pytest.raises(ValueError, match="bt_lookahead"):
        plan.plan_launch(1, 8, HEADS, KV_HEADS, HEAD_SIZE, ws, kernel="triton", bt_lookahead=2)
    with pytest.raises(ValueError, match="'triton' or 'hopper'"):
        plan.plan_launch(1, 8, HEADS, KV_HEADS, HEAD_SIZE, ws, kernel="cuda")
    with pytest.raises(ValueError, match="64-column chunks"):
        plan.plan_launch(1, 8, 8, 8, 80, ws, kernel="hopper")
    # Unforced, a head size the Hopper kernel cannot take plans the Triton one.
    assert plan.plan_launch(1, 8, 8, 8, 32, ws).kernel == "triton"


def test_a_smaller_shared_memory_plans_smaller_tiles() -> None:
    # What SpecDecodeAttention.forward does after an OutOfResources: lower the limit below
    # the failed plan's estimate and plan again, until a plan fits.
    ws = _shape(132, 227 << 10, False)
    p = plan.plan_launch(1, 16, HEADS, KV_HEADS, HEAD_SIZE, ws)
    seen = [plan.plan_smem(p, HEAD_SIZE)]
    for _ in range(6):
        ws.max_shared_mem = seen[-1] - 1
        p = plan.plan_launch(1, 16, HEADS, KV_HEADS, HEAD_SIZE, ws)
        seen.append(plan.plan_smem(p, HEAD_SIZE))
        assert seen[-1] <= ws.max_shared_mem and p.block_q * p.q_tiles >= 16
    assert seen == sorted(seen, reverse=True) and len(set(seen)) == len(seen)


@pytest.mark.parametrize("tile_n", [16, 32, 64, 128])
def test_box_tokens_is_the_largest_run_inside_block_and_tile(tile_n: int) -> None:
    for block in range(1, 1100):
        box = plan.box_tokens(block, tile_n)
        runs = [b for b in range(8, tile_n + 1, 8) if block % b == 0 and tile_n % b == 0]
        assert box == (max(runs) if runs else None), (block, tile_n, box)
    # Hybrid models' attention blocks stay on the Hopper kernel, in narrower boxes.
    assert (plan.box_tokens(864, 64), plan.box_tokens(944, 64)) == (32, 16)


def test_tma_compatible_on_real_cache_layouts() -> None:
    torch = pytest.importorskip("torch")
    blocks, bs, kvh, hs = 6, 16, 4, 256
    # vLLM's TRITON_ATTN / FLASH_ATTN layout: K and V interleaved per block, so each is a
    # non-contiguous view with the same strides.
    kv = torch.empty(blocks, 2, bs, kvh, hs, dtype=torch.bfloat16)
    assert plan.tma_compatible(kv[:, 0], kv[:, 1], 64)
    assert plan.tma_compatible(kv[:, 0], kv[:, 1], 32)
    # A block size no TMA box fits without splitting the 8-row swizzle atom.
    odd = torch.empty(blocks, 2, 12, kvh, hs, dtype=torch.bfloat16)
    assert not plan.tma_compatible(odd[:, 0], odd[:, 1], 64)
    # K and V laid out differently.
    v_alone = torch.empty(blocks, bs, kvh, hs, dtype=torch.bfloat16)
    assert not plan.tma_compatible(kv[:, 0], v_alone, 64)
    # Head dim not innermost.
    transposed = kv.transpose(-1, -2)
    assert not plan.tma_compatible(transposed[:, 0], transposed[:, 1], 64)
    # Per-block padding that is not a whole number of slots: no fixed row stride.
    padded = torch.empty(blocks, bs * kvh * hs + 8, dtype=torch.bfloat16)
    pk = padded[:, : bs * kvh * hs].view(blocks, bs, kvh, hs)
    assert not plan.tma_compatible(pk, pk, 64)
    # Slots of 8 bytes (one head of four bf16 values): rows not 16-byte aligned.
    tiny = torch.empty(blocks, 2, bs, 1, 4, dtype=torch.bfloat16)
    assert not plan.tma_compatible(tiny[:, 0], tiny[:, 1], 16)
    # A base address off the 16-byte grid.
    flat = torch.empty(blocks * 2 * bs * kvh * hs + 1, dtype=torch.bfloat16)
    shifted = flat[1:].view(blocks, 2, bs, kvh, hs)
    assert shifted.data_ptr() % 16 != 0
    assert not plan.tma_compatible(shifted[:, 0], shifted[:, 1], 64)


def _int8_views(blocks: int = 6, bs: int = 16, kvh: int = 4, hs: int = 256,
                raw: torch.Tensor | None = None) -> tuple[Any, Any, Any, Any]:
    """TRITON_ATTN's views of an int8_per_token_head cache stored NHD: K, V (each [blocks,
    bs, kvh, hs + 4]) and the float32 K and V scale views ([blocks, bs, kvh]), carved as
    spec_decode_ref.make_int8_batch carves them (its dispatch test holds them to vLLM's)."""
    import torch

    padded = hs + 4
    if raw is None:
        raw = torch.zeros(blocks, bs, kvh, 2 * padded, dtype=torch.int8)
    key, value = raw[..., :padded], raw[..., padded:]
    k_scale = raw[..., hs:padded].view(torch.float32)[..., 0]
    v_scale = raw[..., padded + hs:].view(torch.float32)[..., 0]
    return key, value, k_scale, v_scale


def _hopper_plan(q: int, **overrides: int) -> plan.LaunchPlan:
    return plan.plan_launch(1, q, HEADS, KV_HEADS, HEAD_SIZE, _shape(132, 227 << 10, True),
                            kernel="hopper", **overrides)


def test_int8_hopper_pass_takes_the_model_cache_at_one_or_two_warpgroups() -> None:
    pytest.importorskip("torch")
    views = _int8_views()
    for q, num_wg in ((2, 1), (8, 1), (10, 1), (11, 2), (16, 2), (20, 2)):
        p = _hopper_plan(q)
        assert (p.num_wg, p.q_tiles, p.tile_n % plan.INT8_HOPPER_TILE_N) == (num_wg, 1, 0)
        assert plan.int8_hopper_unsupported(*views, p) is None, q
    # Blocks of any multiple of the 16-token box.
    assert plan.int8_hopper_unsupported(*_int8_views(bs=64), _hopper_plan(8)) is None


def test_int8_hopper_pass_says_why_it_cannot_take_a_cache_or_plan() -> None:
    torch = pytest.importorskip("torch")
    views = _int8_views()
    k, v, ks, vs = views
    cases = {
        # Past two warpgroups of rows: a second query tile, which the pass does not walk.
        "query tiles": (views, _hopper_plan(21)),
        "a triton plan": (views, plan.plan_launch(1, 8, HEADS, KV_HEADS, HEAD_SIZE,
                                           _shape(132, 227 << 10, False))),
        "32-key plan tiles": (views, _hopper_plan(8, tile_n=32)),
        "head size 128": (_int8_views(hs=128), _hopper_plan(8)),
        "blocks of 8 tokens": (_int8_views(bs=8), _hopper_plan(8)),
        # One kv head: 520-byte token rows, off TMA's 16-byte grid.
        "token rows of 520 bytes": (_int8_views(kvh=1), _hopper_plan(8)),
        "not [K | K scale | V | V scale]": ((v, k, ks, vs), _hopper_plan(8)),
        "scale views": ((k, v, vs, ks), _hopper_plan(8)),
    }
    # The same bytes laid out HND (a block's heads one after another): rows of one head.
    hnd = torch.zeros(6, KV_HEADS, 16, 2 * 260, dtype=torch.int8).transpose(1, 2)
    cases["strides"] = (_int8_views(raw=hnd), _hopper_plan(8))
    # The whole buffer one byte off the 16-byte grid.
    flat = torch.zeros(6 * 16 * KV_HEADS * 520 + 16, dtype=torch.int8)
    shifted = flat[4:4 + 6 * 16 * KV_HEADS * 520].view(6, 16, KV_HEADS, 520)
    cases["at 4 past 16"] = (_int8_views(raw=shifted), _hopper_plan(8))
    for words, (cache_views, p) in cases.items():
        why = plan.int8_hopper_unsupported(*cache_views, p)
        assert why is not None and words in why, (words, why)


@pytest.mark.parametrize("name", ["spec_decode_attention", "spec_decode_attention_hopper",
                                  "spec_decode_attention_hopper_int8"])
def test_only_kernels_go_unannotated(name: str) -> None:
    """mypy's override for these modules (pyproject.toml) lets @triton.jit / @gluon.jit
    kernels keep bare parameters; every other function must stay fully annotated."""
    tree = ast.parse((OPS_DIR / f"{name}.py").read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        jit = any(isinstance(d, ast.Attribute) and d.attr == "jit" for d in node.decorator_list)
        args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        if args and args[0].arg in ("self", "cls"):
            args = args[1:]
        annotated = node.returns is not None and all(a.annotation is not None for a in args)
        if not jit:
            assert annotated, f"{name}.{node.name} (line {node.lineno}) is not annotated"


def test_max_block_m_caps_the_query_tile() -> None:
    """max_block_m (the RTX 3090's int8 plan says 64): a verify block of more rows takes
    more query tiles, a smaller one keeps its own tile; the cap is a power of two of at
    least 16 rows, or refused."""
    ws = _shape(82, 99 << 10, False)
    q16 = plan.plan_launch(1, 16, HEADS, KV_HEADS, HEAD_SIZE, ws, kernel="triton",
                           max_block_m=64)
    assert (q16.block_m, q16.block_q, q16.q_tiles) == (64, 10, 2), q16
    assert q16.split_grid[0] == 2
    uncapped = plan.plan_launch(1, 16, HEADS, KV_HEADS, HEAD_SIZE, ws, kernel="triton")
    assert (uncapped.block_m, uncapped.q_tiles) == (128, 1), uncapped
    q4 = plan.plan_launch(1, 4, HEADS, KV_HEADS, HEAD_SIZE, ws, kernel="triton",
                          max_block_m=64)
    assert (q4.block_m, q4.q_tiles) == (32, 1), q4
    for bad in (8, 48, 0):
        with pytest.raises(ValueError, match="max_block_m must be a power of two >= 16"):
            plan.plan_launch(1, 16, HEADS, KV_HEADS, HEAD_SIZE, ws, kernel="triton",
                             max_block_m=bad)


def test_programs_per_sm_sizes_the_split() -> None:
    """programs_per_sm (the RTX 3090's plans say 1): the KV split is sized to one wave of
    that many programs an SM, where the planner's own rule assumes two below 128 rows."""
    ws = _shape(82, 99 << 10, False)
    own = plan.plan_launch(1, 8, HEADS, KV_HEADS, HEAD_SIZE, ws, kernel="triton")
    one = plan.plan_launch(1, 8, HEADS, KV_HEADS, HEAD_SIZE, ws, kernel="triton",
                           programs_per_sm=1)
    assert (own.num_segments, one.num_segments) == (32, 16), (own, one)
    assert one.split_grid == (1, KV_HEADS, 16) and one.reduce_grid == (8, HEADS)
    # Four requests: 16 programs before any split; one wave of 82 leaves 4 segments each.
    four = plan.plan_launch(4, 8, HEADS, KV_HEADS, HEAD_SIZE, ws, kernel="triton",
                            programs_per_sm=1)
    assert four.num_segments == 4, four
    with pytest.raises(ValueError, match="programs_per_sm must be >= 1"):
        plan.plan_launch(1, 8, HEADS, KV_HEADS, HEAD_SIZE, ws, kernel="triton",
                         programs_per_sm=0)
