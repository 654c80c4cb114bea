"""Where the int8 Hopper pass's own merge loses its time (issue 21; session 37).

Session 36's fused merge (`ws_split_int8(..., fuse=True)`) is exact and slower than the
split pass plus the reduce pass: on an H100, at 16k, by 0.2 us a call at q = 4, 2.1 at
q = 8 and 20.7 at q = 16 (spec_decode_attn.md, "The int8 Hopper pass merges its own
partials"). Its tail has three parts the full kernel cannot time apart: the cooperative
launch, the barrier a (request, kv head) meets at (`_segments_met`), and the merge of the
partials (`_merge_columns`). This file times each alone, on the split pass's grid (one
request, 4 kv heads, 32 segments) with one program an SM as there (the split pass's
shared memory, reserved), in CUDA-graph replay as the benchmark times a call:

- empty: the program does nothing (the launch's own cost), plain and cooperative;
- barrier: the programs meet, cooperative;
- merge: each program merges its columns of partials already in memory, plain (no
  barrier: nothing writes them);
- both: the barrier, then the merge, cooperative (the fused pass's tail);
- reduce: the series' reduce pass over the same partials (what the fused tail replaces).

The merge's output is checked against the reduce pass's on the same partials. The
series' helpers are imported from the tree, not copied, so this is the code that ships.

Session 38 on an H100: the tail alone costs 2.3 / 3.9 / 5.2 us more than the reduce pass at
q = 4 / 8 / 16, but inside the pass the fused form loses 0.2-0.8 / 2 / 21 us. So at q = 16
most of the loss is not in the tail's own work. --in-kernel looks inside: the int8 Hopper
pass on a real int8 cache (the benchmark's cells), each form in a process of its own, with
the series' barrier or merge swapped for an empty function before the first compile:

- separate: the production call (split pass, then the reduce pass);
- split-only: the split pass alone, its partials left unmerged (plain launch);
- coop-only: the fused build with neither barrier nor merge (the cooperative launch and
  the build's other changes);
- barrier-only, merge-only: one of the two (merge-only reads partials not yet all written:
  a timing, not a result);
- fused: the fused build as it ships (its error against the float32 reference checked).

    python benchmarks/fused_tail.py --tree TREE --compile-only   # sm_90a, no GPU
    python benchmarks/fused_tail.py --tree TREE [--json OUT]     # an H100/H200: us a launch
    python benchmarks/fused_tail.py --tree TREE --in-kernel [--contexts 16384,65536] [--json OUT]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

NUM_KV_HEADS = 4
G = 6
HEAD = 256
SEGMENTS = 32
# The split pass's shared memory at q <= 10 (spec_decode_attn.md): one program an SM.
SPLIT_SMEM = 210_264
# Bound by _kernel() to the series' helpers before the first compile.
_segments_met: Any = None
_merge_columns: Any = None
VARIANTS = ("empty", "empty-coop", "barrier", "merge", "both", "reduce")


def _series() -> Any:
    from vllm.v1.attention.ops import spec_decode_attention_hopper_int8 as mod

    return mod


@gluon.jit
def _tail_kernel(out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, sync_ptr, q_len, max_q,
                 stride_o_tok, stride_o_head, NUM_HEADS: gl.constexpr, GQ: gl.constexpr,
                 TILE_Q: gl.constexpr, NUM_SEGMENTS: gl.constexpr, HEAD_SIZE: gl.constexpr,
                 BARRIER: gl.constexpr, MERGE: gl.constexpr, L3: gl.constexpr):
    seq = gl.program_id(0)
    kv_head = gl.program_id(1)
    seg = gl.program_id(2)
    # At least the split pass's shared memory, so that the scheduler places one program
    # an SM (208 KiB: a shape's sides are powers of two). A row of each is written, or
    # the compiler drops them.
    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    row = gl.zeros([1024], gl.int8, gl.BlockedLayout([8], [32], [4], [0]))
    big = gl.allocate_shared_memory(gl.int8, [131072], plain)
    mid = gl.allocate_shared_memory(gl.int8, [65536], plain)
    small = gl.allocate_shared_memory(gl.int8, [16384], plain)
    big.slice(0, 1024).store(row)
    mid.slice(0, 1024).store(row)
    small.slice(0, 1024).store(row)
    if BARRIER:
        _segments_met(sync_ptr + (seq * NUM_HEADS + kv_head) * 2, NUM_SEGMENTS)
    if MERGE:
        _merge_columns(out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, seq, kv_head, seg,
                       0, q_len, max_q, stride_o_tok, stride_o_head, NUM_HEADS, GQ, TILE_Q,
                       NUM_SEGMENTS, HEAD_SIZE, L3)


@gluon.jit
def _no_barrier(sync_ptr, ARRIVALS: gl.constexpr):
    pass


@gluon.jit
def _no_merge(out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, seq, kv_head, seg, q_start,
              q_len, max_q, stride_o_tok, stride_o_head, NUM_HEADS: gl.constexpr,
              G: gl.constexpr, TILE_Q: gl.constexpr, NUM_SEGMENTS: gl.constexpr,
              HEAD: gl.constexpr, L3: gl.constexpr):
    pass


IN_KERNEL = ("separate", "split-only", "coop-only", "barrier-only", "merge-only", "fused")


def _kernel() -> Any:
    """The tail kernel, once the tree is importable: its two helpers are the series'
    (bound as this module's globals, where the JIT looks them up at compile time)."""
    mod = _series()
    globals()["_segments_met"] = mod._segments_met
    globals()["_merge_columns"] = mod._merge_columns
    return _tail_kernel


def _flags(variant: str) -> tuple[bool, bool, bool]:
    """(barrier, merge, cooperative launch) of a variant."""
    return {"empty": (False, False, False), "empty-coop": (False, False, True),
            "barrier": (True, False, True), "merge": (False, True, False),
            "both": (True, True, True)}[variant]


def _tile_q(q: int) -> int:
    """The split pass's query tile at verify length q (the planner's wg_q x num_wg)."""
    per_wg = 64 // G
    num_wg = 1 if q <= per_wg else 2
    return min(per_wg, -(-q // num_wg)) * num_wg


def compile_report(q: int, variant: str) -> dict[str, Any]:
    """The variant compiled for sm_90a (no GPU): shared memory, stack traffic, and the
    SASS's atomics (the barrier's, or none)."""
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from split_pass_issue import sass_of

    fn = _kernel()
    barrier, merge, _ = _flags(variant)
    ints = ("q_len", "max_q", "stride_o_tok", "stride_o_head")
    signature = {name: ("i32" if name in ints else "*i32" if name == "sync_ptr" else
                        "*bf16" if name == "out_ptr" else "*fp32")
                 for name in fn.arg_names if name.endswith("_ptr") or name in ints}
    consts = {"NUM_HEADS": NUM_KV_HEADS * G, "GQ": G, "TILE_Q": _tile_q(q),
              "NUM_SEGMENTS": SEGMENTS, "HEAD_SIZE": HEAD, "BARRIER": barrier,
              "MERGE": merge, "L3": _series().merge_layout(SEGMENTS, HEAD)}
    signature.update({name: "constexpr" for name in consts})
    constexprs = {(fn.arg_names.index(k),): v for k, v in consts.items()}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name.endswith("_ptr")}
    source = GluonASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
    k = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    ptx = k.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        sass = sass_of(k.asm["cubin"], Path(tmp))
    return {"q": q, "variant": variant, "shared": k.metadata.shared,
            "one_an_sm": k.metadata.shared >= SPLIT_SMEM,
            "stack_ops": sum(1 for line in sass.splitlines() if "STL" in line or "LDL" in line),
            # As the worker's compile report reads the split pass: each scalar atomic is one
            # predicated instruction, a single thread's, named by its memory order.
            "atomics": re.findall(r"@%p\d+ (?:atom|red|ld)\.global\.gpu\.(\w+)", ptx),
            "merge_loads_v4": len(re.findall(r"ld\.global\.cg\.v4\.b32", ptx))}


class _Cell:
    """One verify length's partials (random, as a split pass leaves them) and outputs."""

    def __init__(self, torch: Any, q: int) -> None:
        dev = torch.device("cuda")
        self.q, self.heads = q, NUM_KV_HEADS * G
        gen = torch.Generator(device=dev).manual_seed(20261207 + q)
        slots = q * self.heads * SEGMENTS
        self.part_out = torch.randn(slots * HEAD, device=dev, generator=gen)
        self.part_max = torch.randn(slots, device=dev, generator=gen) * 4
        self.part_sum = torch.rand(slots, device=dev, generator=gen) + 0.5
        self.sync = torch.zeros(2 * self.heads, dtype=torch.int32, device=dev)
        self.cu = torch.tensor([0, q], dtype=torch.int32, device=dev)
        self.outs = {v: torch.zeros(q, self.heads, HEAD, dtype=torch.bfloat16, device=dev)
                     for v in ("merge", "both", "reduce")}
        # What launch_reduce reads of a workspace and a plan.
        self.ws: Any = argparse.Namespace(part_out=self.part_out, part_max=self.part_max,
                                     part_sum=self.part_sum)
        self.plan: Any = argparse.Namespace(reduce_grid=(q, self.heads), num_segments=SEGMENTS)

    def launch(self, variant: str) -> None:
        from vllm.v1.attention.ops import spec_decode_attention as sda

        if variant == "reduce":
            sda.launch_reduce(self.outs["reduce"], self.cu, self.q, self.ws, self.plan)
            return
        barrier, merge, coop = _flags(variant)
        o = self.outs.get(variant, self.outs["merge"])
        _kernel()[(1, NUM_KV_HEADS, SEGMENTS)](
            o, self.part_out, self.part_max, self.part_sum, self.sync, self.q, self.q,
            o.stride(0), o.stride(1), NUM_HEADS=self.heads, GQ=G, TILE_Q=_tile_q(self.q),
            NUM_SEGMENTS=SEGMENTS, HEAD_SIZE=HEAD, BARRIER=barrier, MERGE=merge,
            L3=_series().merge_layout(SEGMENTS, HEAD), num_warps=4,
            launch_cooperative_grid=coop)


def device_run(queries: list[int], out: Path | None) -> int:
    import torch

    # The benchmark's own graph timing: the launches in one CUDA graph, events around it.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from spec_decode_attn import _time_graph

    rows: list[dict[str, Any]] = []
    for q in queries:
        cell = _Cell(torch, q)
        row: dict[str, Any] = {"q": q}
        for variant in VARIANTS:
            call = functools.partial(cell.launch, variant)
            row[variant] = round(_time_graph(torch, [call], min_calls=48) * 1e6, 2)
        ref = cell.outs["reduce"].float()
        for variant in ("merge", "both"):
            row[f"{variant}_max_diff"] = (cell.outs[variant].float() - ref).abs().max().item()
        # Each (request, kv head)'s count is back at 0 (its generation moved on).
        row["sync_left_zero"] = bool((cell.sync[0::2] == 0).all().item())
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| q | " + " | ".join(VARIANTS) + " | both - reduce |")
    print("|---:|" + "---:|" * (len(VARIANTS) + 1))
    for row in rows:
        print(f"| {row['q']} | " + " | ".join(f"{row[v]:.2f}" for v in VARIANTS)
              + f" | {row['both'] - row['reduce']:+.2f} |")
    if out:
        out.write_text(json.dumps(rows, indent=1))
    # The merge and the reduce pass differ in summation order only (bf16 outputs).
    bad = [r for r in rows if r["merge_max_diff"] > 1e-2 or r["both_max_diff"] > 1e-2
           or not r["sync_left_zero"]]
    return 1 if bad else 0


def in_kernel_form(form: str, contexts: list[int], queries: list[int]) -> list[dict[str, Any]]:
    """One form of IN_KERNEL timed on the benchmark's int8 cells at batch 1 (this process
    only: the swapped helpers must be in place before the kernel's first compile)."""
    import dataclasses

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import spec_decode_attn as bench

    from tests.support import spec_decode_ref as ref

    bench.KV = "int8"
    sda = importlib.import_module("vllm.v1.attention.ops.spec_decode_attention")
    mod = _series()
    # Looked up in the module's globals when the kernel compiles.
    if form in ("coop-only", "merge-only"):
        mod._segments_met = _no_barrier
    if form in ("coop-only", "barrier-only"):
        mod._merge_columns = _no_merge
    env = {"torch": torch, "ref": ref, "sda": sda, "tua": None}
    heads = bench.NUM_KV_HEADS * bench.GROUP
    ws = sda.get_workspace(16, heads, bench.HEAD_SIZE, torch.device("cuda"))
    rows = []
    for context in contexts:
        cell = bench.Cell(env, 1, context)
        for q in queries:
            batches = cell.batches(q)
            plan = bench.production_plan(sda, batches[0], ws)
            if plan.kernel != "hopper":
                raise RuntimeError(f"q={q}: the production plan is {plan.kernel!r}, not the "
                                   "int8 Hopper pass (an sm_90 GPU is needed)")
            if form == "split-only":
                plan = dataclasses.replace(plan, reduce_grid=None, fused_reduce=False)
            elif form == "separate":
                plan = dataclasses.replace(plan, fused_reduce=False)
            else:
                if not sda.fusable_grid(plan, bench.HEAD_SIZE, ws.num_sms):
                    raise RuntimeError(f"q={q}: grid {plan.split_grid} cannot be fused here")
                plan = dataclasses.replace(plan, fused_reduce=True)
            outs = [torch.full(b.query.shape, float("nan"), dtype=torch.bfloat16,
                               device="cuda") for b in batches]
            calls = [bench.new_call(env, b, o, ws, plan=plan)
                     for b, o in zip(batches, outs, strict=True)]
            row: dict[str, Any] = {"form": form, "context": context, "q": q,
                                   "us": round(bench._time_graph(torch, calls) * 1e6, 2)}
            if form in ("separate", "fused"):
                want = ref.reference(batches[0], bench.HEAD_SIZE**-0.5)
                row["rel_err"] = bench.rel_err(outs[0], want)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def in_kernel_run(tree: str, contexts: list[int], queries: list[int],
                  out: Path | None) -> int:
    """Every form of IN_KERNEL in a process of its own, then one table: each form's time
    and its difference from the split pass alone."""
    rows: list[dict[str, Any]] = []
    for n, form in enumerate(IN_KERNEL, 1):
        print(f"[{n}/{len(IN_KERNEL)}] {form}", flush=True)
        cmd = [sys.executable, __file__, "--tree", tree, "--in-kernel-form", form,
               "--contexts", ",".join(map(str, contexts)),
               "--queries", ",".join(map(str, queries))]
        done = subprocess.run(cmd, capture_output=True, text=True)
        got = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not got:
            print(f"{form} failed (rc {done.returncode}):\n{done.stderr[-2000:]}", flush=True)
            return 1
        rows.extend(got)
    by = {(r["form"], r["context"], r["q"]): r for r in rows}
    print("\nus a call; in brackets, minus split-only (the split pass alone)\n")
    print("| context | q | " + " | ".join(IN_KERNEL) + " | rel err separate / fused |")
    print("|---:|---:|" + "---:|" * len(IN_KERNEL) + "---|")
    for context in contexts:
        for q in queries:
            base = by[("split-only", context, q)]["us"]
            cells = [f"{by[(f, context, q)]['us']:.1f}"
                     + ("" if f == "split-only" else f" ({by[(f, context, q)]['us'] - base:+.1f})")
                     for f in IN_KERNEL]
            errs = (by[("separate", context, q)]["rel_err"], by[("fused", context, q)]["rel_err"])
            print(f"| {context} | {q} | " + " | ".join(cells)
                  + f" | {errs[0]:.2e} / {errs[1]:.2e} |")
    if out:
        out.write_text(json.dumps(rows, indent=1))
    # The fused build as it ships must stay as close to the reference as the reduce pass.
    bad = [r for r in rows if r["form"] == "fused"
           and r["rel_err"] > 1.5 * by[("separate", r["context"], r["q"])]["rel_err"]]
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", required=True, help="directory that contains patched vllm/")
    parser.add_argument("--queries", default="4,8,16", help="comma-separated verify lengths")
    parser.add_argument("--compile-only", action="store_true",
                        help="compile every variant for sm_90a and print its report")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--in-kernel", action="store_true",
                        help="time the fused build's parts inside the int8 Hopper pass")
    parser.add_argument("--in-kernel-form", choices=IN_KERNEL, help=argparse.SUPPRESS)
    parser.add_argument("--contexts", default="16384,65536",
                        help="comma-separated contexts for --in-kernel")
    args = parser.parse_args()
    sys.path.insert(0, args.tree)
    # After the tree (its vllm must win): the test support the benchmark's cells use.
    sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
    queries = [int(q) for q in args.queries.split(",") if q]
    if any(not 1 <= q <= 2 * (64 // G) for q in queries):
        parser.error(f"--queries: each between 1 and {2 * (64 // G)}, got {args.queries!r}")
    contexts = [int(c) for c in args.contexts.split(",") if c]
    if args.in_kernel_form:
        in_kernel_form(args.in_kernel_form, contexts, queries)
        return 0
    if args.in_kernel:
        return in_kernel_run(args.tree, contexts, queries, args.json)
    if args.compile_only:
        reports = [compile_report(q, v) for q in queries for v in VARIANTS if v != "reduce"]
        for report in reports:
            print(json.dumps(report))
        if args.json:
            args.json.write_text(json.dumps(reports, indent=1))
        return 0
    return device_run(queries, args.json)


if __name__ == "__main__":
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    sys.exit(main())
