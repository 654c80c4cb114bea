"""Benchmark: stock vLLM 0.28.0 ``unified_attention`` against the spec-decode-attn split-KV
kernel on verify batches (GQA 24/4, head_size 256, bf16 paged KV, block 16).

Not a test: run it on a GPU with the patched vLLM tree importable::

    python spec_decode_attn.py --tree DIR [--out DIR] [--sweep] [--sweep-8bit] [--variants]
                               [--contexts 1536,16384] [--kv bf16,int8,fp8]
                               [--batches 1] [--budget 240] [--json PATH]

The issue-21 table (stock vs split per KV dtype, batch 1, 16k/64k/128k, q = 8 and 16)::

    python spec_decode_attn.py --tree DIR --kv bf16,int8,fp8 --batches 1 \
        --contexts 16384,65536,131072 --queries 8,16 --budget 240 --json PATH

DIR contains the patched ``vllm/``; put a ``vllm-0.28.0.dist-info/METADATA`` beside it where no
``vllm`` distribution is installed (vLLM's Triton probe asks importlib.metadata for one).

Per cell it prints the time of each kernel (median of CUDA-graph replays, each replay
cycling through enough cache copies that L2 holds none of them), the new kernel's achieved
bandwidth (bytes of K and V read once / time), its share of the HBM floor (those bytes over
the measured device-to-device copy bandwidth, divided by the time) and the speedup over
stock. ``--sweep`` first times launch-parameter variants on a few cells; ``--sweep-8bit`` the
8-bit caches' tile plans (issue 21: SWEEP8_GRID, split and reduce passes timed apart, configs
with wrong results rejected, the best per cell; OUT/sweep8.json); ``--variants`` times
the named kernel variants of VARIANTS side by side (with the compiled split kernel's registers,
spills and shared memory).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import itertools
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# The paged batches and float32 reference: tests/support/spec_decode_ref.py, the same oracle
# the kernel tests hold the kernel to, imported from python/ (HERE.parent).
PYTHON_DIR = HERE.parent
NUM_KV_HEADS, GROUP, HEAD_SIZE, BLOCK_SIZE = 4, 6, 256, 16
CONTEXTS = (1536, 16384, 32768, 65536, 131072)
QUERY_LENS: tuple[int, ...] = (4, 5, 8, 16)
BATCHES: tuple[int, ...] = (1, 4)
# Bytes the cache copies of one cell should span, so repeated calls miss L2.
ROTATE_BYTES = 1 << 30
# "cpu" only for --smoke: a Triton-interpreter pass over tiny shapes that checks this
# script's plumbing before device time is spent on it.
DEVICE = "cuda"
# The KV caches the cells hold (--kv, one table row per dtype): "bf16"; "int8" (vLLM's
# int8_per_token_head layout, bf16 queries; stock runs unified_attention's int8
# per-token-head mode); "fp8" (fp8_e4m3 with the layer's per-tensor scales and fp8 queries
# with theirs, as TRITON_ATTN runs it on CUDA; stock runs its FP8_PER_TENSOR mode);
# "fp8pth" (fp8_per_token_head). The split-KV path reads the fp8 ones with its Triton
# split pass, and int8 with the int8 Hopper pass on an sm_90 GPU (the Triton pass
# elsewhere): production_plan. The HBM floor counts each dtype's bytes, the per-token-head
# scales included.
KV_KINDS = ("bf16", "int8", "fp8", "fp8pth")
KV = "bf16"


def measure_copy_bandwidth(torch: Any) -> float:
    """Device-to-device copy, bytes read plus bytes written per second; the card is kept
    busy for about a second first so that its clocks have left idle."""
    n = 1 << (31 if DEVICE == "cuda" else 20)
    src = torch.randn(n // 2, device=DEVICE, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    warm_until = time.perf_counter() + (1.0 if DEVICE == "cuda" else 0.0)
    while time.perf_counter() < warm_until:
        for _ in range(50):
            dst.copy_(src)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
    graphed = _time_graph(torch, [lambda: dst.copy_(src)], min_calls=100)
    eager = graphed
    if DEVICE == "cuda":
        # The same copies launched eagerly, timed with events around 20 of them.
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            dst.copy_(src)
        end.record()
        end.synchronize()
        eager = start.elapsed_time(end) / 1e3 / 20
    print(f"copy of {n >> 20} MiB: graphed {2 * n / graphed / 1e12:.2f} TB/s, "
          f"eager {2 * n / eager / 1e12:.2f} TB/s (read + written)", flush=True)
    return 2 * n / min(graphed, eager)


def _time_graph(torch: Any, calls: list[Callable[[], Any]], min_calls: int = 24) -> float:
    """Median seconds per call: the calls (one per cache copy) are captured into one CUDA
    graph, repeated until a replay holds at least ``min_calls`` calls, and the replay is
    timed with events; launch overhead stays out as it does under vLLM's graphs."""
    if DEVICE == "cpu":
        t0 = time.perf_counter()
        for call in calls:
            call()
        return (time.perf_counter() - t0) / len(calls)
    for call in calls:  # compile and warm up outside the capture
        call()
    torch.cuda.synchronize()
    repeat = max(1, math.ceil(min_calls / len(calls)))
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for call in calls:
            call()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        for _ in range(repeat):
            for call in calls:
                call()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / (repeat * len(calls)))
    del graph
    times.sort()
    return float(times[len(times) // 2])


class Cell:
    """One (batch, context) cache, copied enough times to defeat L2, and its kernels."""

    def __init__(self, env: dict[str, Any], batch: int, context: int) -> None:
        torch, ref = env["torch"], env["ref"]
        self.env = env
        self.batch = batch
        self.context = context
        lens = [context] * batch
        self.kv = KV
        make, query_dtype = {
            "bf16": (ref.make_batch, torch.bfloat16),
            "int8": (ref.make_int8_batch, torch.bfloat16),
            "fp8": (ref.make_fp8_batch, ref.FP8),
            "fp8pth": (ref.make_fp8_pth_batch, torch.bfloat16),
        }[KV]
        one = make(
            [1] * batch, lens, NUM_KV_HEADS, GROUP, HEAD_SIZE, BLOCK_SIZE,
            query_dtype, DEVICE, seed=context + batch,
        )
        copies = max(1, min(48, math.ceil(ROTATE_BYTES / one.kv_bytes())))
        self.caches = [one] + [
            make(
                [1] * batch, lens, NUM_KV_HEADS, GROUP, HEAD_SIZE, BLOCK_SIZE,
                query_dtype, DEVICE, seed=context + batch + 1000 * i,
            )
            for i in range(1, copies)
        ]
        self.kv_bytes = one.kv_bytes()

    def batches(self, q: int) -> list[Any]:
        ref = self.env["ref"]
        return [
            ref.with_queries(c, [q] * self.batch, NUM_KV_HEADS * GROUP, seed=q + 17 * i)
            for i, c in enumerate(self.caches)
        ]


def stock_call(env: dict[str, Any], b: Any, out: Any) -> Callable[[], None]:
    """unified_attention exactly as TritonAttentionImpl.forward calls it for this batch."""
    torch, tua = env["torch"], env["tua"]
    heads = NUM_KV_HEADS * GROUP
    threshold = 128 // NUM_KV_HEADS  # MIN_LAUNCH_GRID_SIZE_2D // num_kv_heads
    segm_out = torch.empty((threshold, heads, 16, HEAD_SIZE), device=DEVICE)
    segm_max = torch.empty((threshold, heads, 16), device=DEVICE)
    segm_sum = torch.empty((threshold, heads, 16), device=DEVICE)
    descale = torch.ones((), device=DEVICE).expand((len(b.kv_lens), NUM_KV_HEADS))
    k_descale = v_descale = descale
    quant: dict[str, Any] = {}
    from vllm.v1.kv_cache_interface import KVQuantMode

    if b.k_scale_cache is not None:
        # As TRITON_ATTN calls it for a per-token-head cache: scale views, no descales.
        mode = (KVQuantMode.FP8_PER_TOKEN_HEAD if b.key_cache.dtype == ref_fp8(env)
                else KVQuantMode.INT8_PER_TOKEN_HEAD)
        quant = {"kv_quant_mode": mode,
                 "k_scale_cache": b.k_scale_cache, "v_scale_cache": b.v_scale_cache}
        k_descale = v_descale = None
    elif b.k_descale is not None:
        # Per-tensor fp8: the layer's scales expanded per (request, kv head), and the fp8
        # query's own, as TRITON_ATTN passes them.
        quant = {"kv_quant_mode": KVQuantMode.FP8_PER_TENSOR}
        k_descale, v_descale = b.k_descale, b.v_descale

    def call() -> None:
        tua.unified_attention(
            q=b.query, k=b.key_cache, v=b.value_cache, out=out,
            cu_seqlens_q=b.cu_seqlens_q, max_seqlen_q=b.max_query_len,
            seqused_k=b.seq_lens, max_seqlen_k=max(b.kv_lens),
            softmax_scale=HEAD_SIZE**-0.5, causal=True, window_size=(-1, -1),
            block_table=b.block_table, softcap=0, q_descale=b.q_descale,
            k_descale=k_descale, v_descale=v_descale, seq_threshold_3D=threshold,
            num_par_softmax_segments=16, softmax_segm_output=segm_out,
            softmax_segm_max=segm_max, softmax_segm_expsum=segm_sum, **quant,
        )

    return call


def ref_fp8(env: dict[str, Any]) -> Any:
    return env["ref"].FP8


def production_plan(sda: Any, b: Any, ws: Any) -> Any:
    """The plan vLLM's forward gets for this batch's cache: the int8 Hopper pass's for
    int8 caches on an sm_90 GPU, the Triton pass's with the family's tile plan on this
    card for the other 8-bit caches, the planner's (with the card's overrides) for 16-bit
    ones."""
    return sda.plan_for_cache(
        len(b.kv_lens), b.max_query_len, NUM_KV_HEADS * GROUP, NUM_KV_HEADS, HEAD_SIZE, ws,
        b.key_cache, b.k_scale_cache is not None, sda.cache_tile_plan(b.key_cache))


def new_call(
    env: dict[str, Any], b: Any, out: Any, ws: Any, overrides: dict[str, int] | None = None,
    plan: Any = None,
) -> Callable[[], None]:
    """One call of the split path on batch b: the production plan, the planner's with
    these overrides, or this plan."""
    sda = env["sda"]
    heads = NUM_KV_HEADS * GROUP
    fields: dict[str, Any] = dict(overrides or {})
    # Diagnostic only: time the split pass alone (its output is left unreduced).
    split_only = fields.pop("_split_only", False)
    if plan is None:
        plan = production_plan(sda, b, ws) if not fields else sda.plan_launch(
            len(b.kv_lens), b.max_query_len, heads, NUM_KV_HEADS, HEAD_SIZE, ws, **fields
        )
    if split_only:
        plan = dataclasses.replace(plan, reduce_grid=None)

    def call() -> None:
        sda.spec_decode_attention(
            b.query, b.key_cache, b.value_cache, out, b.cu_seqlens_q, b.seq_lens,
            b.block_table, b.max_query_len, HEAD_SIZE**-0.5, ws, plan,
            b.k_scale_cache, b.v_scale_cache, b.q_descale, b.k_descale, b.v_descale,
        )

    return call


def rel_err(a: Any, b: Any) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def run_cell(env: dict[str, Any], cell: Cell, q: int, ws: Any, copy_bw: float) -> dict[str, Any]:
    torch = env["torch"]
    batches = cell.batches(q)
    # 16-bit outputs whatever the query's dtype (TRITON_ATTN's for fp8 queries too).
    outs_stock = [torch.empty(b.query.shape, dtype=torch.bfloat16, device=DEVICE)
                  for b in batches]
    outs_new = [torch.full_like(o, float("nan")) for o in outs_stock]
    pairs = list(zip(batches, outs_stock, strict=True))
    t_stock = _time_graph(torch, [stock_call(env, b, o) for b, o in pairs])
    pairs = list(zip(batches, outs_new, strict=True))
    new_calls = [new_call(env, b, o, ws) for b, o in pairs]
    t_new = _time_graph(torch, new_calls)
    plan = production_plan(env["sda"], batches[0], ws)
    floor = cell.kv_bytes / copy_bw
    # Both kernels against the float32 reference of the dequantized cache (and query).
    want = env["ref"].reference(batches[0], HEAD_SIZE**-0.5)
    other = other_reduce(env, cell, ws, batches, plan, want)
    return {
        "kv": cell.kv,
        "batch": cell.batch,
        "context": cell.context,
        "q": q,
        "kv_bytes": cell.kv_bytes,
        "stock_us": t_stock * 1e6,
        "new_us": t_new * 1e6,
        "speedup": t_stock / t_new,
        "new_tb_s": cell.kv_bytes / t_new / 1e12,
        "floor_us": floor * 1e6,
        "pct_floor": 100 * floor / t_new,
        "stock_pct_floor": 100 * floor / t_stock,
        "rel_err_vs_stock": rel_err(outs_new[0], outs_stock[0]),
        "rel_err": rel_err(outs_new[0], want),
        "stock_rel_err": rel_err(outs_stock[0], want),
        "kernel": plan.kernel,
        "grid": list(plan.split_grid),
        "min_segment_tokens": plan.min_segment_tokens,
        "fused_reduce": plan.fused_reduce,
        **other,
    }


def other_reduce(env: dict[str, Any], cell: Cell, ws: Any, batches: list[Any], plan: Any,
                 want: Any) -> dict[str, Any]:
    """Where the int8 Hopper pass can merge its own partials (fusable_grid), the cell
    again with the other choice than the production plan's (the pass's merge against
    the reduce pass), timed right after it on the same batches: its time and error."""
    torch, sda = env["torch"], env["sda"]
    if cell.kv != "int8" or plan.kernel != "hopper" or not sda.fusable_grid(
            plan, HEAD_SIZE, ws.num_sms):
        return {}
    alt = dataclasses.replace(plan, fused_reduce=not plan.fused_reduce)
    outs = [torch.full(b.query.shape, float("nan"), dtype=torch.bfloat16, device=DEVICE)
            for b in batches]
    t_alt = _time_graph(torch, [new_call(env, b, o, ws, plan=alt)
                                for b, o in zip(batches, outs, strict=True)])
    return {"other_fused_reduce": alt.fused_reduce, "other_us": t_alt * 1e6,
            "other_rel_err": rel_err(outs[0], want)}


# The first revision's launch-parameter sweep: its cells and the product of these values.
SWEEP_CELLS: tuple[tuple[int, int, int], ...] = (
    (1, 16384, 8), (1, 16384, 16), (1, 131072, 8), (1, 131072, 16), (1, 65536, 4),
    (4, 16384, 8), (4, 16384, 16),
)
SWEEP_SPACE: dict[str, tuple[int, ...]] = {
    "tile_n": (32, 64),
    "num_warps": (4, 8),
    "num_stages": (2, 3),
    "num_segments": (16, 32, 64),
    "min_segment_tokens": (64,),
}


# Kernel variants compared side by side on the q=16 cells the targets miss and on three
# cells that already meet them (see the .md): plan_launch overrides per variant.
VARIANT_CELLS: tuple[tuple[int, int, int], ...] = (
    (1, 16384, 16), (1, 65536, 16), (1, 131072, 16), (4, 16384, 16),
    (1, 16384, 8), (1, 131072, 8), (1, 16384, 4),
)
# name: (plan_launch overrides, the verify lengths q it applies to; () = all)
Configs = dict[str, tuple[dict[str, Any], tuple[int, ...]]]
VARIANTS: Configs = {
    "planner": ({}, ()),
    # The portable Triton split pass (the planner's choice where Gluon's Hopper path is not).
    "triton": ({"kernel": "triton"}, ()),
    # The warp-specialised Hopper split pass with other tiles (needs an sm_90 GPU).
    "hopper n32 s4": ({"kernel": "hopper", "tile_n": 32, "num_stages": 4}, ()),
    "hopper n64 s2": ({"kernel": "hopper", "tile_n": 64, "num_stages": 2}, ()),
    "hopper n32 s3": ({"kernel": "hopper", "tile_n": 32, "num_stages": 3}, (16,)),
    # Diagnostic: the split pass alone (its output is left unreduced).
    "split only": ({"_split_only": True}, (16, 8)),
    "triton split only": ({"kernel": "triton", "_split_only": True}, (16,)),
    # Earlier Triton launches (the campaigns in the .md): no block-table lookahead, the
    # first sweep's tiles, a third stage, 64 segments, 64-row tiles, 64-token tiles with
    # the lookahead, a fifth 32-token stage.
    "triton no lookahead": ({"kernel": "triton", "bt_lookahead": 0}, (16,)),
    "triton earlier n64 s2": (
        {"kernel": "triton", "bt_lookahead": 0, "tile_n": 64, "num_stages": 2}, (16, 4)),
    "triton s3": ({"kernel": "triton", "num_stages": 3}, (16,)),
    "triton 64 segments": ({"kernel": "triton", "num_segments": 64}, (16,)),
    "triton 64-row tiles": ({"kernel": "triton", "block_m": 64}, (16,)),
    "triton n64 s2": ({"kernel": "triton", "tile_n": 64, "num_stages": 2}, (16,)),
    "triton s5": ({"kernel": "triton", "num_stages": 5}, (16,)),
}


class LaunchRecorder:
    """Stands in for a @triton.jit kernel and keeps the compiled kernel of each launch, so
    that its registers, spills, shared memory and MMA instructions can be reported."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.last: Any = None

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        launcher = self.kernel[grid]

        def launch(*args: Any, **kwargs: Any) -> Any:
            self.last = launcher(*args, **kwargs)
            return self.last

        return launch

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.kernel, attr)


def compiled_info(compiled: Any) -> dict[str, Any]:
    if compiled is None:
        return {}
    info: dict[str, Any] = {
        "regs": getattr(compiled, "n_regs", None),
        "spills": getattr(compiled, "n_spills", None),
        "shared": getattr(getattr(compiled, "metadata", None), "shared", None),
    }
    ptx = getattr(compiled, "asm", {}).get("ptx", "")
    info["wgmma"] = ptx.count("wgmma.mma_async")
    info["mma_sync"] = ptx.count("mma.sync")
    return info


def needs_hopper(cfg: dict[str, Any]) -> bool:
    return bool(cfg.get("kernel") == "hopper")


def time_configs(env: dict[str, Any], ws: Any, copy_bw: float, out_path: Path,
                 budget_s: float, cells: tuple[tuple[int, int, int], ...],
                 configs: Configs) -> list[dict[str, Any]]:
    """Each config (plan_launch overrides) on each (batch, context, q) cell it applies to:
    time, % of floor, error against the float32 reference and the compiled split kernel's
    resources; rows also written to out_path as they come. Configs that force the Hopper
    kernel are left out where the workspace has none (no sm_90 GPU)."""
    torch, sda, ref = env["torch"], env["sda"], env["ref"]
    configs = {k: v for k, v in configs.items() if ws.hopper or not needs_hopper(v[0])}
    recorder = LaunchRecorder(sda._spec_decode_split_kernel)
    sda._spec_decode_split_kernel = recorder
    hopper = sda._hopper_module() if ws.hopper else None
    hopper_recorder = None
    if hopper is not None:
        hopper_recorder = LaunchRecorder(hopper._ws_split_kernel)
        hopper._ws_split_kernel = hopper_recorder
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    cell: Cell | None = None
    try:
        for batch, context, q in cells:
            if time.perf_counter() - started > budget_s:
                print(f"{out_path.stem}: time budget spent, stopping", flush=True)
                break
            if cell is None or (cell.batch, cell.context) != (batch, context):
                cell = None  # free the previous cell's caches before allocating the next
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()
                cell = Cell(env, batch, context)
            batches = cell.batches(q)
            want = ref.reference(batches[0], HEAD_SIZE**-0.5)
            first = len(rows)
            for name, (cfg, only) in configs.items():
                if only and q not in only:
                    continue
                outs = [torch.full_like(b.query, float("nan")) for b in batches]
                try:
                    calls = [new_call(env, b, o, ws, cfg) for b, o in zip(batches, outs,
                                                                           strict=True)]
                    t = _time_graph(torch, calls)
                except Exception as exc:
                    rows.append({"batch": batch, "context": context, "q": q,
                                 "variant": name, "error": error_text(exc)})
                    print("error", rows[-1], flush=True)
                    continue
                err = ref.compare(outs[0], want, batches[0])
                plan = sda.plan_launch(batch, q, NUM_KV_HEADS * GROUP, NUM_KV_HEADS,
                                       HEAD_SIZE, ws,
                                       **{k: v for k, v in cfg.items() if k[0] != "_"})
                used = recorder if plan.kernel == "triton" else hopper_recorder
                row = {"batch": batch, "context": context, "q": q, "variant": name,
                       "us": t * 1e6, "pct_floor": 100 * cell.kv_bytes / copy_bw / t,
                       "rel_err": err["rel_err"], "unwritten": err["unwritten_rows"],
                       "kernel": plan.kernel, "grid": list(plan.split_grid),
                       "block_m": plan.block_m, "tile_n": plan.tile_n,
                       "warps": plan.num_warps, "stages": plan.num_stages,
                       "bt_lookahead": plan.bt_lookahead,
                       **compiled_info(used.last if used else None)}
                rows.append(row)
                print(json.dumps(row), flush=True)
            out_path.write_text(json.dumps(rows, indent=1))
            timed = [r for r in rows[first:] if "us" in r]
            if timed:
                print("best", json.dumps(min(timed, key=lambda r: r["us"])), flush=True)
    finally:
        sda._spec_decode_split_kernel = recorder.kernel
        if hopper is not None and hopper_recorder is not None:
            hopper._ws_split_kernel = hopper_recorder.kernel
    return rows


def sweep_configs() -> Configs:
    """SWEEP_SPACE's product as named configs, applying to every q."""
    return {
        " ".join(f"{k}={v}" for k, v in zip(SWEEP_SPACE, values, strict=True)):
            (dict(zip(SWEEP_SPACE, values, strict=True)), ())
        for values in itertools.product(*SWEEP_SPACE.values())
    }


# --sweep-8bit (issue 21): the Triton split pass's tile plans on 8-bit caches. Per KV cache
# (int8 = int8_per_token_head, fp8 = per-tensor fp8 with fp8 queries) and verify length q, every
# config of the grid below plus the production plan and its kernel switches is timed at every
# context; compiles are shared across contexts (the planner's segment count depends on shapes
# only). The grid's product is 18 tile plans; the planner shrinks those that do not fit shared
# memory, and configs that come out as the same launch are timed once.
SWEEP8_KVS: tuple[str, ...] = ("int8", "fp8")
SWEEP8_CONTEXTS: tuple[int, ...] = (16384, 65536, 131072)
SWEEP8_QUERIES: tuple[int, ...] = (8, 16)
# In the order they are timed (a spent budget skips the last): the likeliest first.
SWEEP8_GRID: dict[str, tuple[int, ...]] = {
    "tile_n": (64, 32, 128), "num_warps": (8, 4), "num_stages": (3, 2, 4),
}
# Kernel switches compared at the production tiles (TilePlan fields), each both ways so the
# production plan is always measured against its alternative (a switch equal to production is
# the same launch and is timed once): _widen's bit arithmetic against Triton's own cast for
# int8 (on sm_90 the production plan takes the cast), Q.K on the int8 MMA with the query rows
# quantized in one or two int8 terms against widened K for int8 (TilePlan.int8_qk), and Q.K
# as an fp8 MMA on the codes against widened K for fp8 (the production plan takes the MMA
# since the H200 sweep).
# K rows said 8-byte aligned or not (k_align8: 8-byte copies of K, production's since the
# 2026-12-03 sweep, whose command named k8 and n16+k8; the layout's V rows stay 4-byte).
SWEEP8_SWITCHES: dict[str, dict[str, dict[str, bool | int]]] = {
    "int8": {"bits": {"fast_int8": True}, "cast": {"fast_int8": False},
             "int8qk1": {"int8_qk": 1}, "int8qk2": {"int8_qk": 2}, "widened": {"int8_qk": 0},
             "k8": {"k_align8": True}, "rows4": {"k_align8": False},
             "n16": {"tile_n": 16}, "n16+k8": {"tile_n": 16, "k_align8": True}},
    "fp8": {"fp8qk": {"fp8_qk": True}, "widened": {"fp8_qk": False}},
}
# Switches the whole grid is timed with as well (config name suffixed "+<name>"), for a
# switch that changes what fits in registers or how rows load: K copied 4 bytes at a time
# against production's 8 (int8_qk = 2 had its grid run in 2026-12-02's sweep and is left out
# since: no faster anywhere).
SWEEP8_GRID_SWITCHES: dict[str, dict[str, dict[str, bool | int]]] = {
    "int8": {"rows4": {"k_align8": False}},
}
# A config is rejected (never "best") with any unwritten row or a relative error against the
# float32 reference above this: bf16 q and P rounding lands at 5e-3..6e-3 (the tests' bound).
SWEEP8_REL_ERR = 1e-2


def sweep8_configs(sda: Any, kv: str, q: int, ws: Any, switches: list[str] | None = None,
                   grid: bool = True) -> list[tuple[str, Any, Any]]:
    """(name, TilePlan, LaunchPlan) per distinct launch for one (kv, q): the production plan
    first, then its switches (those named in ``switches``, None: all), then, with ``grid``,
    the grid (in SWEEP8_GRID's order), each grid point as it is and then with each of
    SWEEP8_GRID_SWITCHES."""
    heads = NUM_KV_HEADS * GROUP
    import torch

    device = ws_device(ws)
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    production = sda.tile_plan("int8" if kv == "int8" else "fp8", capability)
    named: list[tuple[str, Any]] = [("production", production)]
    for name, switch in SWEEP8_SWITCHES.get(kv, {}).items():
        if switches is None or name in switches:
            named.append((f"production+{name}", dataclasses.replace(production, **switch)))
    if kv == "int8" and (switches is None or "rtx3090" in switches):
        # The RTX 3090's own plan with the widening that card takes: its arithmetic at full
        # shape on whatever GPU runs the sweep (no 3090 has run it).
        named.append(("rtx3090 plan", dataclasses.replace(sda.tile_plan("int8", (8, 6)),
                                                          fast_int8=True)))
    grid_switches: dict[str, dict[str, bool | int]] = {"": {}}
    for name, switch in SWEEP8_GRID_SWITCHES.get(kv, {}).items():
        grid_switches[f"+{name}"] = switch
    for values in itertools.product(*SWEEP8_GRID.values()) if grid else ():
        fields = dict(zip(SWEEP8_GRID, values, strict=True))
        for suffix, switch in grid_switches.items():
            name = " ".join(f"{k}={v}" for k, v in fields.items()) + suffix
            named.append((name, dataclasses.replace(production, **fields, **switch)))
    seen: set[tuple[Any, ...]] = set()
    configs = []
    for name, tiles in named:
        plan = sda.plan_launch(1, q, heads, NUM_KV_HEADS, HEAD_SIZE, ws, kernel="triton",
                               **tiles.plan_overrides())
        key = (plan.block_m, plan.tile_n, plan.num_warps, plan.num_stages, plan.num_segments,
               sda.use_fast_int8(tiles, ws_device(ws)) if kv == "int8" else None,
               tiles.fp8_qk if kv == "fp8" else None,
               tiles.int8_qk if kv == "int8" else None,
               tiles.k_align8 if kv == "int8" else None)
        if key in seen:
            continue
        seen.add(key)
        configs.append((name, tiles, plan))
    return configs


def ws_device(ws: Any) -> Any:
    return ws.part_out.device


def split_reduce_calls(env: dict[str, Any], b: Any, out: Any, ws: Any, plan: Any,
                       tiles: Any) -> tuple[Callable[[], None], Callable[[], None],
                                            Callable[[], None]]:
    """The whole call, the split pass alone and the reduce pass alone, for one batch."""
    sda = env["sda"]
    split_plan = dataclasses.replace(plan, reduce_grid=None)

    def run(p: Any) -> None:
        sda.spec_decode_attention(
            b.query, b.key_cache, b.value_cache, out, b.cu_seqlens_q, b.seq_lens,
            b.block_table, b.max_query_len, HEAD_SIZE**-0.5, ws, p,
            b.k_scale_cache, b.v_scale_cache, b.q_descale, b.k_descale, b.v_descale, tiles,
        )

    def reduce_only() -> None:
        sda.launch_reduce(out, b.cu_seqlens_q, b.max_query_len, ws, plan)

    return (lambda: run(plan)), (lambda: run(split_plan)), reduce_only


def error_text(exc: BaseException) -> str:
    """An exception for the record: its head and, for Triton's compile errors (which name
    the outermost call first), its tail, where the failing statement and cause are."""
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__ or exc.__context__
    if cause is not None:
        text += f" <- {type(cause).__name__}: {cause}"
    return text if len(text) <= 1800 else text[:300] + " [...] " + text[-1500:]


def sweep8_row(env: dict[str, Any], cell: Cell, batches: list[Any], want: Any, ws: Any,
               copy_bw: float, name: str, tiles: Any, plan: Any,
               recorder: LaunchRecorder) -> dict[str, Any]:
    """One config on one cell: the whole call, then its split and reduce passes each in a
    CUDA graph of their own (events around each replay), checked against the reference."""
    torch, ref = env["torch"], env["ref"]
    outs = [torch.full(b.query.shape, float("nan"), dtype=torch.bfloat16, device=DEVICE)
            for b in batches]
    calls = [split_reduce_calls(env, b, o, ws, plan, tiles)
             for b, o in zip(batches, outs, strict=True)]
    t_all = _time_graph(torch, [c[0] for c in calls])
    err = ref.compare(outs[0], want, batches[0])
    t_split = _time_graph(torch, [c[1] for c in calls])
    t_reduce = _time_graph(torch, [c[2] for c in calls]) if plan.reduce_grid else 0.0
    ok = err["unwritten_rows"] == 0 and err["rel_err"] <= SWEEP8_REL_ERR
    return {
        "kv": cell.kv, "context": cell.context, "q": len(batches[0].query) // cell.batch,
        "config": name, "ok": ok, "us": t_all * 1e6, "split_us": t_split * 1e6,
        "reduce_us": t_reduce * 1e6,
        # What the two launches cost beyond their own times (the boundary, and the reduce
        # pass's wait on the split pass's tail): the part a folded reduce could save.
        "boundary_us": (t_all - t_split - t_reduce) * 1e6,
        "pct_floor": 100 * cell.kv_bytes / copy_bw / t_all,
        "split_pct_floor": 100 * cell.kv_bytes / copy_bw / t_split,
        "rel_err": err["rel_err"], "unwritten": err["unwritten_rows"],
        "block_m": plan.block_m, "tile_n": plan.tile_n, "warps": plan.num_warps,
        "stages": plan.num_stages, "segments": plan.num_segments,
        "fast_int8": env["sda"].use_fast_int8(tiles, ws_device(ws)) if cell.kv == "int8"
        else None,
        "fp8_qk": tiles.fp8_qk if cell.kv == "fp8" else None,
        "int8_qk": tiles.int8_qk if cell.kv == "int8" else None,
        "k_align8": tiles.k_align8 if cell.kv == "int8" else None,
        **compiled_info(recorder.last),
    }


def sweep8_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Best accepted config per (kv, q, context), and per (kv, q) the config whose worst
    slowdown against those bests over the contexts is smallest (one plan per shape: the
    planner never sees the context)."""
    best: dict[str, dict[str, Any]] = {}
    timed = [r for r in rows if "us" in r]
    for r in timed:
        key = f"{r['kv']}/q{r['q']}/{r['context']}"
        if r["ok"] and (key not in best or r["us"] < best[key]["us"]):
            best[key] = r
    per_shape: dict[str, dict[str, Any]] = {}
    for kv, q in sorted({(r["kv"], r["q"]) for r in timed}):
        mine = [r for r in timed if (r["kv"], r["q"]) == (kv, q)]
        contexts = sorted({r["context"] for r in mine})
        regret: dict[str, float] = {}
        for name in {r["config"] for r in mine}:
            got = {r["context"]: r for r in mine if r["config"] == name}
            if set(got) != set(contexts) or not all(r["ok"] for r in got.values()):
                continue  # rejected somewhere, or not timed at every context
            regret[name] = max(got[c]["us"] / best[f"{kv}/q{q}/{c}"]["us"] for c in contexts)
        if regret:
            name = min(regret, key=lambda n: regret[n])
            per_shape[f"{kv}/q{q}"] = {"config": name, "worst_slowdown": regret[name],
                                       "production_worst_slowdown": regret.get("production")}
    return {"best_per_cell": best, "best_per_shape": per_shape}


def run_sweep8(env: dict[str, Any], ws: Any, copy_bw: float, out_path: Path, budget_s: float,
               kvs: list[str], contexts: list[int], queries: list[int],
               switches: list[str] | None = None, grid: bool = True) -> dict[str, Any]:
    """SWEEP8's grid: rows printed and written to out_path as they come, then the summary.
    Configs go round-robin over the (kv, q) shapes (the production plan and its switches of
    every shape first), so a budget that runs out leaves every shape the same coverage."""
    global KV
    sda, ref = env["sda"], env["ref"]
    recorder = LaunchRecorder(sda._spec_decode_split_kernel)
    sda._spec_decode_split_kernel = recorder
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    shapes = []
    for kv in kvs:
        KV = kv
        cells = [Cell(env, 1, c) for c in contexts]
        for q in queries:
            per_cell = [(cell, cell.batches(q)) for cell in cells]
            wants = [ref.reference(batches[0], HEAD_SIZE**-0.5) for _, batches in per_cell]
            shapes.append((kv, q, per_cell, wants,
                           sweep8_configs(sda, kv, q, ws, switches, grid)))
    print(f"8-bit sweep: {sum(len(c[4]) for c in shapes)} configs over {len(shapes)} shapes "
          f"x {len(contexts)} contexts (cells built in {time.perf_counter() - started:.0f} s)",
          flush=True)
    try:
        for i in range(max(len(c[4]) for c in shapes)):
            for kv, q, per_cell, wants, configs in shapes:
                if i >= len(configs):
                    continue
                name, tiles, plan = configs[i]
                if time.perf_counter() - started > budget_s:
                    skipped.append(f"{kv}/q{q}/{name}")
                    continue
                for (cell, batches), want in zip(per_cell, wants, strict=True):
                    try:
                        row = sweep8_row(env, cell, batches, want, ws, copy_bw, name, tiles,
                                         plan, recorder)
                    except Exception as exc:  # a config Triton refuses (resources)
                        row = {"kv": kv, "context": cell.context, "q": q, "config": name,
                               "ok": False, "error": error_text(exc)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                out_path.write_text(json.dumps(
                    {"rows": rows, "seconds": round(time.perf_counter() - started, 1),
                     **sweep8_summary(rows)}, indent=1))
    finally:
        sda._spec_decode_split_kernel = recorder.kernel
    result = {"rows": rows, "skipped": skipped,
              "seconds": round(time.perf_counter() - started, 1), **sweep8_summary(rows)}
    out_path.write_text(json.dumps(result, indent=1))
    print_sweep8(result)
    return result


def print_sweep8(result: dict[str, Any]) -> None:
    print("\n| KV | q | context | config | µs | % floor | split µs | reduce µs | boundary µs "
          "| rel err | regs/spill |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for r in result["rows"]:
        if "us" not in r:
            print(f"| {r['kv']} | {r['q']} | {r['context']} | {r['config']} | error: "
                  f"{r.get('error', '')[:80]} |")
            continue
        flag = "" if r["ok"] else " REJECTED"
        print(f"| {r['kv']} | {r['q']} | {r['context']} | {r['config']}{flag} | {r['us']:.1f} | "
              f"{r['pct_floor']:.1f}% | {r['split_us']:.1f} | {r['reduce_us']:.1f} | "
              f"{r['boundary_us']:.1f} | {r['rel_err']:.1e} | {r.get('regs')}/{r.get('spills')} |")
    print("\nbest per (kv, q, context):")
    for key, r in result["best_per_cell"].items():
        print(f"  {key}: {r['config']} {r['us']:.1f} us, {r['pct_floor']:.1f}% of floor "
              f"(split {r['split_us']:.1f} + reduce {r['reduce_us']:.1f} us)")
    print("one plan per (kv, q), smallest worst slowdown over the contexts:")
    for key, r in result["best_per_shape"].items():
        prod = r["production_worst_slowdown"]
        print(f"  {key}: {r['config']} (worst {r['worst_slowdown']:.3f}x the per-context best; "
              f"production {'rejected' if prod is None else f'{prod:.3f}x'})")
    if result["skipped"]:
        print(f"skipped (budget): {len(result['skipped'])} configs: "
              + ", ".join(result["skipped"][:40]))


def _smoke_setup() -> None:
    global DEVICE, ROTATE_BYTES, QUERY_LENS, BATCHES, SWEEP_CELLS, SWEEP_SPACE, VARIANT_CELLS
    global SWEEP8_CONTEXTS, SWEEP8_QUERIES, SWEEP8_GRID
    import os

    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    DEVICE, ROTATE_BYTES, QUERY_LENS, BATCHES = "cpu", 1, (4,), (1,)
    SWEEP_CELLS = ((1, 64, 4),)
    SWEEP_SPACE = {"tile_n": (32,), "num_warps": (4,), "num_stages": (2,),
                   "num_segments": (2, 4), "min_segment_tokens": (32,)}
    VARIANT_CELLS = ((1, 64, 16), (1, 64, 4))
    SWEEP8_CONTEXTS, SWEEP8_QUERIES = (64, 96), (4,)
    SWEEP8_GRID = {"tile_n": (32, 64), "num_warps": (4,), "num_stages": (2,)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", required=True, help="directory that contains patched vllm/")
    parser.add_argument("--out", default=".", help="directory for results.json / table.md")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--sweep-budget", type=float, default=240.0, help="seconds")
    parser.add_argument("--sweep-8bit", action="store_true",
                        help="issue 21: time SWEEP8_GRID's tile plans (and the production "
                        "plan's kernel switches) on 8-bit caches; OUT/sweep8.json")
    parser.add_argument("--sweep-8bit-kv", default=",".join(SWEEP8_KVS),
                        help="comma-separated 8-bit caches for --sweep-8bit (int8, fp8)")
    parser.add_argument("--sweep-8bit-contexts", default=None,
                        help="comma-separated contexts for --sweep-8bit (default "
                        f"{','.join(map(str, SWEEP8_CONTEXTS))})")
    parser.add_argument("--sweep-8bit-queries", default=None,
                        help="comma-separated verify lengths for --sweep-8bit (default "
                        f"{','.join(map(str, SWEEP8_QUERIES))})")
    parser.add_argument("--sweep-8bit-budget", type=float, default=150.0,
                        help="seconds for --sweep-8bit: configs not started by then are "
                        "listed as skipped")
    parser.add_argument("--sweep-8bit-switches", default=None,
                        help="comma-separated SWEEP8_SWITCHES to time with the production "
                        "plan, and 'rtx3090' for the RTX 3090's int8 plan (default: all)")
    parser.add_argument("--sweep-8bit-no-grid", action="store_true",
                        help="--sweep-8bit times the production plan and its switches only")
    parser.add_argument("--variants", action="store_true",
                        help="compare the kernel variants of VARIANTS first")
    parser.add_argument("--variants-budget", type=float, default=300.0, help="seconds")
    parser.add_argument("--variant-names", default="",
                        help="comma-separated VARIANTS to time (default: all)")
    parser.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    parser.add_argument("--queries", default=",".join(map(str, QUERY_LENS)))
    parser.add_argument("--kv", default="bf16",
                        help="comma-separated KV caches of the table's cells, of "
                        f"{', '.join(KV_KINDS)} (see KV_KINDS)")
    parser.add_argument("--batches", default=None,
                        help="comma-separated batch sizes of the table (default 1,4)")
    parser.add_argument("--budget", type=float, default=0.0,
                        help="seconds for the table: cells not started by then are left "
                        "out, and listed as skipped (0: no limit)")
    parser.add_argument("--json", type=Path, default=None,
                        help="also write the table's results JSON to this path")
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global KV, BATCHES
    kvs = [k for k in args.kv.split(",") if k]
    unknown = sorted(set(kvs) - set(KV_KINDS))
    if unknown or not kvs:
        parser.error(f"--kv {args.kv!r}: unknown KV cache {', '.join(unknown) or '(none)'}; "
                     f"choose from {', '.join(KV_KINDS)}")
    if args.smoke:
        _smoke_setup()
    if args.batches:
        BATCHES = tuple(int(b) for b in args.batches.split(",") if b)
    sys.path.insert(0, args.tree)
    sys.path.insert(1, str(PYTHON_DIR))  # after the tree: its vllm must win
    import torch

    from tests.support import spec_decode_ref as ref

    if args.smoke:
        # Without it the interpreter's bf16 dots are meaningless and so is every error.
        ref.fix_interpreter_bf16_dot()
    from vllm.triton_utils import HAS_TRITON

    # Imported by name: the installed (unpatched) vLLM that type checkers see lacks it.
    sda = importlib.import_module("vllm.v1.attention.ops.spec_decode_attention")
    tua = importlib.import_module("vllm.v1.attention.ops.triton_unified_attention")

    if not HAS_TRITON or (DEVICE == "cuda" and not torch.cuda.is_available()):
        print("needs a CUDA GPU and vLLM's Triton enabled", file=sys.stderr)
        return 2
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {"torch": torch, "ref": ref, "sda": sda, "tua": tua}
    card = "CPU (Triton interpreter smoke run)"
    if DEVICE == "cuda":
        props = torch.cuda.get_device_properties(0)
        card = (f"{props.name}, {props.multi_processor_count} SMs, "
                f"{props.total_memory / 2**30:.0f} GiB")
    # The kernels' speed depends on the Triton that compiled them (3.6 and 3.7.1 differ).
    software = f"torch {torch.__version__}, triton {importlib.import_module('triton').__version__}"
    copy_bw = measure_copy_bandwidth(torch)
    print(f"card: {card}; copy bandwidth {copy_bw / 1e12:.2f} TB/s; {software}", flush=True)
    # One workspace as the backends size it: max_num_seqs x QMAX tokens (4 x 16 here).
    ws = sda.get_workspace(max(BATCHES) * 16, NUM_KV_HEADS * GROUP, HEAD_SIZE,
                           torch.device(DEVICE))
    started = time.perf_counter()
    if args.sweep:
        time_configs(env, ws, copy_bw, out_dir / "sweep.json", args.sweep_budget, SWEEP_CELLS,
                     sweep_configs())
        print(f"sweep took {time.perf_counter() - started:.0f} s", flush=True)
    if args.sweep_8bit:
        kvs8 = [k for k in args.sweep_8bit_kv.split(",") if k]
        bad = sorted(set(kvs8) - set(SWEEP8_KVS))
        if bad or not kvs8:
            parser.error(f"--sweep-8bit-kv {args.sweep_8bit_kv!r}: choose from "
                         f"{', '.join(SWEEP8_KVS)}")
        contexts8 = ([int(c) for c in args.sweep_8bit_contexts.split(",") if c]
                     if args.sweep_8bit_contexts else list(SWEEP8_CONTEXTS))
        queries8 = ([int(c) for c in args.sweep_8bit_queries.split(",") if c]
                    if args.sweep_8bit_queries else list(SWEEP8_QUERIES))
        switches8 = (None if args.sweep_8bit_switches is None
                     else [n for n in args.sweep_8bit_switches.split(",") if n])
        known = {n for kv in kvs8 for n in SWEEP8_SWITCHES.get(kv, {})}
        if "int8" in kvs8:
            known.add("rtx3090")  # the RTX 3090's own int8 plan (sweep8_configs)
        if switches8 is not None and set(switches8) - known:
            parser.error(f"--sweep-8bit-switches: unknown {sorted(set(switches8) - known)}; "
                         f"choose from {', '.join(sorted(known))}")
        run_sweep8(env, ws, copy_bw, out_dir / "sweep8.json", args.sweep_8bit_budget, kvs8,
                   contexts8, queries8, switches8, not args.sweep_8bit_no_grid)
        print(f"8-bit sweep took {time.perf_counter() - started:.0f} s", flush=True)
    if args.variants:
        names = [n for n in args.variant_names.split(",") if n]
        unknown = sorted(set(names) - set(VARIANTS))
        if unknown:
            parser.error(f"unknown variants: {', '.join(unknown)}")
        chosen = {n: VARIANTS[n] for n in names} if names else VARIANTS
        time_configs(env, ws, copy_bw, out_dir / "variants.json", args.variants_budget,
                     VARIANT_CELLS, chosen)
        print(f"variants took {time.perf_counter() - started:.0f} s", flush=True)
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    contexts = [int(c) for c in args.contexts.split(",") if c]
    if not contexts:
        return 0
    queries = [int(x) for x in args.queries.split(",")]
    table_started = time.perf_counter()
    for batch in BATCHES:
        for context in contexts:
            for kv in kvs:
                if args.budget and time.perf_counter() - table_started > args.budget:
                    skipped += [{"batch": batch, "context": context, "kv": kv, "q": q}
                                for q in queries]
                    print(f"time budget spent: skipping batch {batch}, context {context}, "
                          f"{kv} KV", flush=True)
                    continue
                KV = kv
                cell = Cell(env, batch, context)
                for q in queries:
                    row = run_cell(env, cell, q, ws, copy_bw)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    with (out_dir / "rows.jsonl").open("a") as f:
                        f.write(json.dumps(row) + "\n")
                del cell
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()
    # The floor uses the better of two copy measurements (start and end of the run).
    copy_bw = max(copy_bw, measure_copy_bandwidth(torch))
    for r in rows:
        r["floor_us"] = r["kv_bytes"] / copy_bw * 1e6
        r["pct_floor"] = 100 * r["floor_us"] / r["new_us"]
        r["stock_pct_floor"] = 100 * r["floor_us"] / r["stock_us"]
    lines = [
        f"card: {card}; measured copy bandwidth {copy_bw / 1e12:.2f} TB/s; {software}",
        "",
        "| KV | batch | context | q | stock µs | new µs | stock/split | new TB/s "
        "| HBM floor µs | % of floor | stock % of floor | rel err new / stock "
        "| new vs stock | split pass |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['kv']} | {r['batch']} | {r['context']} | {r['q']} | {r['stock_us']:.1f} | "
            f"{r['new_us']:.1f} | {r['speedup']:.1f}x | {r['new_tb_s']:.2f} | "
            f"{r['floor_us']:.1f} | {r['pct_floor']:.1f}% | {r['stock_pct_floor']:.1f}% | "
            f"{r['rel_err']:.1e} / {r['stock_rel_err']:.1e} | "
            f"{r['rel_err_vs_stock']:.1e} | {r['kernel']} |"
        )
    others = [r for r in rows if "other_us" in r]
    if others:
        lines += [
            "", "The int8 Hopper pass with its partials merged by itself (fused) and by the "
            "reduce pass (separate), each cell's two timed one after the other:", "",
            "| batch | context | q | fused µs | separate µs | separate / fused "
            "| % of floor fused / separate | rel err fused / separate |",
            "|---:|---:|---:|---:|---:|---:|---|---|",
        ]
        for r in others:
            prod, alt = (r["new_us"], r["rel_err"]), (r["other_us"], r["other_rel_err"])
            (t_f, e_f), (t_s, e_s) = (prod, alt) if r["fused_reduce"] else (alt, prod)
            lines.append(
                f"| {r['batch']} | {r['context']} | {r['q']} | {t_f:.1f} | {t_s:.1f} | "
                f"{t_s / t_f:.3f} | {100 * r['floor_us'] / t_f:.1f}% / "
                f"{100 * r['floor_us'] / t_s:.1f}% | {e_f:.2e} / {e_s:.2e} |"
            )
    if skipped:
        lines += ["", f"skipped (time budget {args.budget:.0f} s): "
                  + ", ".join(f"{s['kv']} b{s['batch']} {s['context']} q{s['q']}"
                              for s in skipped)]
    table = "\n".join(lines)
    (out_dir / "table.md").write_text(table + "\n")
    results = json.dumps({"card": card, "copy_bw": copy_bw, "software": software,
                          "seconds": round(time.perf_counter() - started, 1),
                          "rows": rows, "skipped": skipped}, indent=1)
    (out_dir / "results.json").write_text(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(results)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
