"""The RTX 3090's tile plans for the Triton split pass, chosen by a cost model over the kernels
ptxas compiles for sm_86 (no GPU: nothing here runs a kernel).

Each candidate plan (KV tile, warps, stages, int8 Q.K mode) is compiled the way a launch on a
3090 specialises it (the worker's compile report: spec_decode_worker.compile_triton_split,
the installed Triton and its ptxas). From the compiled kernel it takes what the card's
limits act on: shared memory, registers, spilled bytes, and the warp instructions of the loop
that runs once a KV tile (tests/support/sass_loops.py; spill loads and stores are in it). The
model then bounds the call from below, per context and segment count, by three rates of the
card (NVIDIA's GA102 figures for the RTX 3090):

- DRAM: the cache's bytes, once per query tile, plus the partial outputs written, at
  936 GB/s;
- tensor cores, per SM: Q.K and P.V MMAs of the tile's padded rows. A GeForce GA102 SM does
  256 bf16 FMAs a clock into float32, and 1,024 int8 MACs into int32 (71 and 284 TOPS at
  82 SMs and 1.695 GHz): Q.K on the int8 MMA with two query terms costs half of Q.K on
  widened K;
- issue, per SM: the loop's warp instructions at 4 a clock.

Programs an SM holds follow from shared memory (100 KiB an SM, 1 KiB of it reserved a block),
registers (64 Ki an SM, allocated 256 a warp), threads (1,536) and blocks (16); the SM-bound
terms run in waves of that many programs an SM over 82 SMs, the KV split as the planner sizes
it (its own rule, or told how many programs an SM holds). A plan's time at a context is the
larger of the DRAM time and the busiest SM's time, plus the reduce pass reading the partials
back from DRAM. Not modelled: latency (every plan keeps two or more stages in flight), L2
hits, clocks below boost, and the reduce pass's fixed cost (the same for every plan). The
figures rank plans; they are not a prediction of a 3090's microseconds.

The chosen plan per (cache, q) is the one with the smallest worst slowdown over the contexts
against the best plan at each (the rule the H200's 8-bit sweep used: the planner never sees
the context).

    python benchmarks/rtx3090_tile_model.py --tree DIR [--json OUT] [--queries 4,8,16]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import itertools
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PYTHON_DIR = HERE.parent

HEADS, KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 24, 4, 256, 16
CONTEXTS = (16384, 65536, 131072)
QUERY_LENS = (4, 8, 16)
# Bytes of one token's K and V for one KV head (TRITON_ATTN's int8 rows carry a float32
# scale each).
TOKEN_HEAD_BYTES = {"bf16": 2 * HEAD_SIZE * 2, "int8": 2 * (HEAD_SIZE + 4)}
# Partial output a (token, head, segment): head_size float32 values, its max and its sum.
PARTIAL_BYTES = (HEAD_SIZE + 2) * 4


@dataclasses.dataclass(frozen=True)
class Card:
    name: str = "RTX 3090 (GA102, sm_86)"
    sms: int = 82
    clock_ghz: float = 1.695  # boost clock
    dram_gbs: float = 936.0
    smem_per_sm: int = 100 << 10
    smem_per_block: int = 99 << 10
    smem_reserved_per_block: int = 1 << 10
    regs_per_sm: int = 64 << 10
    reg_alloc_per_warp: int = 256
    max_threads: int = 1536
    max_blocks: int = 16
    bf16_fma_per_clk: int = 256  # dense, float32 accumulate (GeForce: half the fp16-acc rate)
    int8_mac_per_clk: int = 1024
    issue_per_clk: int = 4


RTX3090 = Card()


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What the model reads of one compiled split kernel."""

    kv: str
    q: int
    block_m: int
    q_tiles: int
    tile_n: int
    num_warps: int
    num_stages: int
    int8_qk: int
    shared: int
    regs: int
    spill_bytes: int
    loop_insts: int  # warp instructions of the whole-tile loop, one warp, one tile
    num_segments: int  # the planner's for this shape

    @property
    def name(self) -> str:
        qk = f" qk{self.int8_qk}" if self.kv == "int8" else ""
        return f"m{self.block_m} n{self.tile_n} {self.num_warps}w {self.num_stages}s{qk}"


def residency(card: Card, shared: int, regs: int, warps: int) -> int:
    """Programs of this kernel one SM holds at once (0: it does not fit)."""
    if shared > card.smem_per_block:
        return 0
    by_smem = card.smem_per_sm // (shared + card.smem_reserved_per_block)
    regs_per_warp = -(-regs * 32 // card.reg_alloc_per_warp) * card.reg_alloc_per_warp
    by_regs = card.regs_per_sm // (regs_per_warp * warps)
    by_threads = card.max_threads // (32 * warps)
    return max(0, min(by_smem, by_regs, by_threads, card.max_blocks))


def tensor_clocks_per_tile(card: Card, c: Compiled) -> float:
    """One tile's MMAs on one SM: P.V in bf16, Q.K in bf16 (widened K) or on the int8 MMA
    with int8_qk query terms."""
    macs = c.block_m * c.tile_n * HEAD_SIZE
    pv = macs / card.bf16_fma_per_clk
    qk = macs / card.bf16_fma_per_clk if c.int8_qk == 0 else (
        c.int8_qk * macs / card.int8_mac_per_clk)
    return pv + qk


def model_us(card: Card, c: Compiled, context: int, segments: int) -> dict[str, float]:
    """Lower bounds on one call (batch 1) of this kernel, in µs: DRAM, the busiest SM's
    tensor and issue time, and their max."""
    per_sm = residency(card, c.shared, c.regs, c.num_warps)
    if per_sm == 0:
        return {"dram": math.inf, "tensor": math.inf, "issue": math.inf, "reduce": math.inf,
                "total": math.inf, "serial": math.inf, "waves": 0, "per_sm": 0}
    programs = c.q_tiles * KV_HEADS * segments
    waves = -(-programs // (card.sms * per_sm))
    # Programs on the busiest SM at once (fewer than per_sm when the grid is small).
    on_sm = min(per_sm, -(-programs // card.sms))
    tiles = -(-context // (segments * c.tile_n))
    clock = card.clock_ghz * 1e3  # clocks a µs
    tensor = waves * tiles * on_sm * tensor_clocks_per_tile(card, c) / clock
    issue = waves * tiles * on_sm * c.loop_insts * c.num_warps / card.issue_per_clk / clock
    kv_bytes = context * KV_HEADS * TOKEN_HEAD_BYTES[c.kv] * c.q_tiles
    partial_bytes = c.q * HEADS * segments * PARTIAL_BYTES if segments > 1 else 0
    # The split pass writes the partials; the reduce pass, a kernel of its own after it,
    # reads them back (L2, 6 MB on a 3090, is not modelled).
    dram = (kv_bytes + partial_bytes) / (card.dram_gbs * 1e3)
    reduce = partial_bytes / (card.dram_gbs * 1e3)
    # "total" lets the SM's tensor and issue time overlap fully (a lower bound);
    # "serial" adds them (what a loop that waits on each MMA would take).
    return {"dram": dram, "tensor": tensor, "issue": issue, "reduce": reduce,
            "total": max(dram, tensor, issue) + reduce,
            "serial": max(dram, tensor + issue) + reduce,
            "waves": waves, "per_sm": per_sm}


# A grid point: the TilePlan fields asked for (tile_n, warps, stages, int8_qk, max_block_m,
# programs_per_sm; 0: the planner's rule). The planner may shrink the tile at some q to fit
# 99 KiB, so one point compiles to a kernel a q.
Point = tuple[int, int, int, int, int, int]


def point_name(point: Point, kv: str) -> str:
    tile_n, warps, stages, qk, max_m, per_sm = point
    return (f"n{tile_n} {warps}w {stages}s" + (f" qk{qk}" if kv == "int8" else "")
            + (f" m<={max_m}" if max_m < MAX_BLOCK_M else "")
            + (f" {per_sm}/SM" if per_sm else ""))


@dataclasses.dataclass(frozen=True)
class Ranked:
    point: Point
    worst_slowdown: float
    worst_slowdown_serial: float
    spill_bytes: int
    kernels: dict[int, Compiled]
    times: dict[tuple[int, int], dict[str, float]]


def rank(card: Card, kernels: dict[Point, dict[int, Compiled]],
         contexts: tuple[int, ...]) -> list[Ranked]:
    """Grid points ranked for one cache family, best first. A point's slowdown at (q,
    context) is its modelled time (tensor and issue overlapped) over the best point's
    there; points are ranked by their worst slowdown, to 1 %. Ties go to the point whose
    kernels spill less (the model counts a spill's instructions, not its traffic), then to
    the smaller worst slowdown with tensor and issue time in series."""
    qs = sorted({q for by_q in kernels.values() for q in by_q})
    cells = [(q, ctx) for q in qs for ctx in contexts]
    times = {pt: {(q, ctx): model_us(card, by_q[q], ctx, by_q[q].num_segments)
                  for q, ctx in cells if q in by_q}
             for pt, by_q in kernels.items()}

    def worst(pt: Point, key: str) -> float:
        best = {c: min(t[c][key] for t in times.values() if c in t) for c in cells}
        return max((times[pt][c][key] / best[c] if c in times[pt] else math.inf)
                   for c in cells)

    ranked = [Ranked(pt, worst(pt, "total"), worst(pt, "serial"),
                     sum(k.spill_bytes for k in by_q.values()), by_q, times[pt])
              for pt, by_q in kernels.items()]
    ranked.sort(key=lambda r: (round(r.worst_slowdown, 2), r.spill_bytes,
                               r.worst_slowdown_serial))
    return ranked


# The grid: KV tile keys, warps, stages (two or more: the model has no latency term, so
# every plan must keep a tile in flight), for int8 the Q.K mode (one term misses the error
# bar, so only widened K and two terms), and the query tile's largest row count.
GRID_TILE_N = (16, 32, 64)
GRID_WARPS = (4, 8)
GRID_STAGES = (2, 3)
GRID_INT8_QK = (0, 2)
# The query tile's rows: the planner's (up to 128), or at most 64 (q = 16 then takes two
# tiles, each reading the KV again, and the 64-row kernel's registers).
MAX_BLOCK_M = 128
GRID_MAX_BLOCK_M = (MAX_BLOCK_M, 64)
# The programs an SM holds, as the planner sizes the KV split for one wave: its own rule
# (two below 128 rows, made for an H200's shared memory) or one (what 99 KiB leaves most
# 3090 kernels). Segments do not change the loop, so both share one compiled kernel.
GRID_PROGRAMS_PER_SM = (0, 1)


def compile_grid(kv: str, queries: tuple[int, ...], workdir: Path,
                 tile_ns: tuple[int, ...] = GRID_TILE_N,
                 warps_list: tuple[int, ...] = GRID_WARPS,
                 max_ms: tuple[int, ...] = GRID_MAX_BLOCK_M) -> dict[Point, dict[int, Compiled]]:
    """Every grid point at each q, as the planner plans it for a 3090 (tiles shrunk to fit
    99 KiB where they must be), compiled for sm_86 with the switches a 3090 launch gets.
    Points that shrink to another point's kernel at every q are left out."""
    import torch

    from tests.patch import spec_decode_worker as worker
    from tests.support.sass_loops import mma_loops

    sys.path.insert(0, str(HERE))
    from split_pass_issue import sass_of

    sda = importlib.import_module(worker.SDA_MODULE)
    ws = sda.SpecDecodeWorkspace(64, HEADS, HEAD_SIZE, torch.device("cpu"),
                                 num_sms=RTX3090.sms, max_shared_mem=RTX3090.smem_per_block,
                                 hopper=False)
    cache: dict[tuple[int, ...], Compiled] = {}
    grid: dict[Point, dict[int, Compiled]] = {}
    qks = GRID_INT8_QK if kv == "int8" else (0,)
    # Every point launches with the K alignment the card's own plan asks for.
    card_k_align8 = sda.tile_plan("int8" if kv == "int8" else "16bit", (8, 6)).k_align8
    for point in itertools.product(tile_ns, warps_list, GRID_STAGES, qks, max_ms,
                                   GRID_PROGRAMS_PER_SM):
        tile_n, warps, stages, qk, max_m, per_sm = point
        by_q: dict[int, Compiled] = {}
        for q in queries:
            plan = sda.plan_launch(1, q, HEADS, KV_HEADS, HEAD_SIZE, ws, kernel="triton",
                                   tile_n=tile_n, num_warps=warps, num_stages=stages,
                                   max_block_m=max_m)
            segments = sda.plan_launch(1, q, HEADS, KV_HEADS, HEAD_SIZE, ws, kernel="triton",
                                       tile_n=tile_n, num_warps=warps, num_stages=stages,
                                       max_block_m=max_m,
                                       programs_per_sm=per_sm or None).num_segments
            key = (q, plan.block_m, plan.tile_n, warps, plan.num_stages, qk)
            if key not in cache:
                compiled = worker.compile_triton_split(
                    sda, plan, kv, 86, int8_qk=qk if kv == "int8" else None,
                    k_align8=card_k_align8)
                regs, spill = worker._ptxas_report(compiled.asm["ptx"], "sm_86", workdir)
                if regs is None or spill is None:
                    # No report means no figures to rank on: a guess would rank silently.
                    raise RuntimeError(f"ptxas gave no register/spill report for {kv} q={q} "
                                       f"point {point}")
                loops = mma_loops(sass_of(compiled.asm["cubin"], workdir))
                cache[key] = Compiled(
                    kv=kv, q=q, block_m=plan.block_m, q_tiles=plan.q_tiles,
                    tile_n=plan.tile_n, num_warps=warps, num_stages=plan.num_stages,
                    int8_qk=qk, shared=compiled.metadata.shared, regs=regs,
                    spill_bytes=spill,
                    loop_insts=min(loop.instructions for loop in loops),
                    num_segments=plan.num_segments)
                k = cache[key]
                print(f"{kv} q={q} {k.name}: shared {k.shared}, regs {k.regs}, spilled "
                      f"{k.spill_bytes} B, loop {k.loop_insts} insts", flush=True)
            by_q[q] = dataclasses.replace(cache[key], num_segments=segments)
        if any(by_q == other for other in grid.values()):
            continue  # shrunk to an earlier point's kernels everywhere
        grid[point] = by_q
    return grid


def production_point(kv: str) -> Point:
    """The grid point of what the series plans for this cache on a 3090."""
    from tests.patch import spec_decode_worker as worker

    sda = importlib.import_module(worker.SDA_MODULE)
    tiles = sda.tile_plan("int8" if kv == "int8" else "16bit", (8, 6))
    return (tiles.tile_n or 32, tiles.num_warps or 4, tiles.num_stages or 2, tiles.int8_qk,
            tiles.max_block_m or MAX_BLOCK_M, tiles.programs_per_sm or 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", required=True, help="a patched vLLM tree (no GPU needed)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--queries", default=",".join(map(str, QUERY_LENS)))
    parser.add_argument("--kv", default="int8,bf16")
    parser.add_argument("--tile-n", default=",".join(map(str, GRID_TILE_N)),
                        help="a smaller grid (the tests')")
    parser.add_argument("--warps", default=",".join(map(str, GRID_WARPS)))
    parser.add_argument("--max-block-m", default=",".join(map(str, GRID_MAX_BLOCK_M)))
    args = parser.parse_args()
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.pop("TRITON_INTERPRET", None)
    sys.path[:0] = [args.tree, str(PYTHON_DIR)]
    workdir = (args.json.parent if args.json else Path(".")).resolve()
    queries = tuple(int(x) for x in args.queries.split(","))
    out: dict[str, Any] = {"card": dataclasses.asdict(RTX3090), "families": {}}
    for kv in args.kv.split(","):
        grid = compile_grid(kv, queries, workdir,
                            tuple(int(x) for x in args.tile_n.split(",")),
                            tuple(int(x) for x in args.warps.split(",")),
                            tuple(int(x) for x in args.max_block_m.split(",")))
        ranked = rank(RTX3090, grid, CONTEXTS)
        prod = production_point(kv)
        out["families"][kv] = {
            "chosen": point_name(ranked[0].point, kv),
            "production": point_name(prod, kv),
            "points": [{"point": point_name(r.point, kv),
                        "worst_slowdown": r.worst_slowdown,
                        "worst_slowdown_serial": r.worst_slowdown_serial,
                        "spill_bytes": r.spill_bytes,
                        "kernels": {str(q): {**dataclasses.asdict(k), "per_sm": residency(
                            RTX3090, k.shared, k.regs, k.num_warps)}
                            for q, k in r.kernels.items()},
                        "us": {f"q{q}/{ctx}": t for (q, ctx), t in r.times.items()}}
                       for r in ranked]}
        print(f"\n{kv}: the model's choice {point_name(ranked[0].point, kv)}; the "
              f"series' plan on sm_86 {point_name(prod, kv)}")
        head = " | ".join(f"q={q} {ctx // 1024}k" for q in queries for ctx in CONTEXTS)
        print(f"| point | kernels at q = {', '.join(map(str, queries))}: regs / spilled B, "
              f"loop insts, programs an SM | {head} | worst slowdown (serial) |")
        print("|---|---|" + "---:|" * (len(queries) * len(CONTEXTS)) + "---:|")
        for r in ranked:
            ks = "; ".join(f"{k.regs} / {k.spill_bytes}, {k.loop_insts}, "
                           f"{residency(RTX3090, k.shared, k.regs, k.num_warps)}"
                           for k in r.kernels.values())
            us = " | ".join(f"{r.times[(q, ctx)]['total']:.0f}" if (q, ctx) in r.times
                            else "-" for q in queries for ctx in CONTEXTS)
            print(f"| {point_name(r.point, kv)} | {ks} | {us} | "
                  f"{r.worst_slowdown:.2f} ({r.worst_slowdown_serial:.2f}) |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
