"""Where the int8 candidate's fixed cost goes (issue 21; prepared in session 21, not run yet).

About 14-18 µs of each candidate call do not grow with the context (spec_decode_attn.md, "A
widener warpgroup"), and at 16k the 40 % target leaves 20 µs for the whole call. This tool
times the phases of every program of one split launch with the GPU's global timer
(`%globaltimer`, nanoseconds), so the next change goes where the time is.

It does not edit int8_ws_candidate.py: it reads that file, inserts the timer reads into a
copy, and imports the copy (the candidate and its GPU record stay as they are). A timer read
is a store of one 8-byte value by each partition's threads; a program's eight slots are:

    0 entry             the kernel's first statement
    1 query_done        the consumer has the quantized query in shared memory
    2 first_tile        the widener sees the first tile's codes (TMA done)
    3 loop_done         the consumer's last tile is done
    4 epilogue_done     the consumer's partials are stored
    5 first_tma         the loader has issued the first tile's copies
    6 loader_done       the loader's last copy is issued
    7 widener_done      the widener's last tile is widened

    python benchmarks/int8_ws_timeline.py --compile-only          # sm_90a, no GPU
    python benchmarks/int8_ws_timeline.py --tree DIR [--json OUT]  # an H200

On a device it launches the split pass eagerly (no graph) at q = 8 (--q), two terms, fp16 V, and
prints per context the median over programs of each slot's time after the program's own
entry, the spread of the entries, and the latest slot of any program; the median of 10
launches after 2 warm-ups.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
CANDIDATE = HERE / "int8_ws_candidate.py"
SLOTS = ("entry", "query_done", "first_tile", "loop_done", "epilogue_done", "first_tma",
         "loader_done", "widener_done")

_NOW = '''@gluon.jit
def _now():
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64,
                                     is_pure=False, pack=1)


'''

# (text in the candidate, its replacement, how many times it must occur). Each edit says
# where a timer read goes; a candidate reshaped so that one no longer fits is an error here,
# not a timeline of the wrong places.
EDITS: tuple[tuple[str, str, int], ...] = (
    ("@gluon.jit\ndef _loader8(desc,", _NOW + "@gluon.jit\ndef _loader8(tlb, desc,", 1),
    ("(_loader8, (desc,", "(_loader8, (tlb, desc,", 6),
    ("        if BT_AHEAD:\n            blk0 = blk1\n            blk1 = blk2\n",
     "        if BT_AHEAD:\n            blk0 = blk1\n            blk1 = blk2\n"
     "        if i == 0:\n            gl.store(tlb + 5, _now())\n"
     "    gl.store(tlb + 6, _now())\n", 1),
    ("def _widener8(bufs,", "def _widener8(tlb, bufs,", 1),
    ("(_widener8, (bufs,", "(_widener8, (tlb, bufs,", 2),
    ("        mbarrier.wait(ready.index(s), (i // STAGES) & 1)\n"
     "        if DIAG == 1 or DIAG == 3:\n",
     "        mbarrier.wait(ready.index(s), (i // STAGES) & 1)\n"
     "        if i == 0:\n            gl.store(tlb + 2, _now())\n"
     "        if DIAG == 1 or DIAG == 3:\n", 1),
    ("            if not (V_SCALED and WIDENER_RELEASE_EARLY):\n"
     "                mbarrier.arrive(empty.index(s), count=1)\n",
     "            if not (V_SCALED and WIDENER_RELEASE_EARLY):\n"
     "                mbarrier.arrive(empty.index(s), count=1)\n"
     "    gl.store(tlb + 7, _now())\n", 1),
    ("def _consume8(q_ptr,", "def _consume8(tlb, q_ptr,", 1),
    ("(_consume8, (q_ptr,", "(_consume8, (tlb, q_ptr,", 5),
    # The second consumer warpgroup (q x G > 64) and the ping-pong ones write the same
    # slots as the first: the last writer's time stays.
    ("def _consume8_second(q_ptr,", "def _consume8_second(tlb, q_ptr,", 1),
    ("def _consume8_pp(q_ptr,", "def _consume8_pp(tlb, q_ptr,", 1),
    ("(_consume8_second, (q_ptr,", "(_consume8_second, (tlb, q_ptr,", 2),
    ("(_consume8_pp, (q_ptr,", "(_consume8_pp, (tlb, q_ptr,", 2),
    ("    _consume8(q_ptr, part_out_ptr", "    _consume8(tlb, q_ptr, part_out_ptr", 2),
    # After the query's quantization, straight or in chunks (--q-chunks).
    ("    # The query's scale and qk_scale in one factor a row: a score costs one FMUL",
     "    gl.store(tlb + 1, _now())\n"
     "    # The query's scale and qk_scale in one factor a row: a score costs one FMUL", 1),
    # _consume8's own epilogue (--pv-wg's P.V warpgroup has one like it, not timed here).
    ("\n    r_o = gl.arange(0, WG_ROWS, layout=row_layout)\n    d_o = ",
     "\n    gl.store(tlb + 3, _now())\n    r_o = gl.arange(0, WG_ROWS, layout=row_layout)\n"
     "    d_o = ", 1),
    ("(d_t < 2 * CH8)[None, :])\n\n\n@gluon.jit\ndef _consume8_second(",
     "(d_t < 2 * CH8)[None, :])\n    gl.store(tlb + 4, _now())\n\n\n@gluon.jit\n"
     "def _consume8_second(", 1),
    ("rows_per_block, stride_kv_head,\n", "rows_per_block, stride_kv_head, tl_ptr,\n", 1),
    ("    seq = pid\n    tile_q0 = 0\n",
     "    seq = pid\n    tile_q0 = 0\n"
     "    tlb = tl_ptr + ((seq * gl.num_programs(1) + kv_head) * gl.num_programs(2) + seg) * 8\n"
     "    gl.store(tlb, _now())\n", 1),
    ("batch.block_table.stride(0), rows_per_block, s_head,\n",
     "batch.block_table.stride(0), rows_per_block, s_head, TIMELINE[0],\n", 1),
    ("\ndef launch(batch", "\nTIMELINE: list[Any] = [None]\n\n\ndef launch(batch", 1),
)


def instrumented_source(text: str) -> str:
    """The candidate's source with the timer reads in (see EDITS)."""
    for old, new, count in EDITS:
        found = text.count(old)
        if found != count:
            raise ValueError(f"the candidate has {found} of {old.strip()[:60]!r}, the timeline "
                             f"expects {count}: update EDITS to the candidate's new shape")
        text = text.replace(old, new)
    return text


def load(workdir: Path) -> ModuleType:
    """The instrumented candidate as a module (its file in workdir: Gluon reads a kernel's
    source from its file)."""
    path = workdir / "int8_ws_candidate_timeline.py"
    path.write_text(instrumented_source(CANDIDATE.read_text()))
    sys.path.insert(0, str(HERE))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compile_report(workdir: Path) -> dict[str, Any]:
    """The instrumented kernel compiled for sm_90a (q = 8, two terms, fp16 V): its timer
    reads in the PTX and its shared memory, beside the plain candidate's."""
    module = load(workdir)  # puts HERE on sys.path: the plain candidate imports from it
    plain = importlib.import_module("int8_ws_candidate")
    timed = module.compile_sm90(2, 2, q=8, v_tile="fp16")
    base = plain.compile_sm90(2, 2, q=8, v_tile="fp16")
    return {"timer_reads": timed.asm["ptx"].count("%globaltimer"),
            "shared": timed.metadata.shared, "plain_shared": base.metadata.shared}


def series_globals(q: int) -> dict[str, bool | int]:
    """The candidate's options the series' int8 Hopper pass compiles with at this verify
    length (spec_decode_attn.md, "The one-warpgroup path in the series"): with one consumer
    warpgroup (q x G <= 64) the widener's scales, one Q.K wait, V scaled as it is widened and
    the stage released early; two warpgroups keep the candidate's defaults. The same set as
    tests/patch/spec_decode_worker.py's SERIES_ONE_WG_FLAGS, as module globals."""
    if q * 6 > 64:
        return {}
    return {"SCALES_AT": 2, "QK_ONCE": True, "V_SCALED": True, "WIDENER_RELEASE_EARLY": True}


def _device_run(tree: str, contexts: list[int], stages: int, epilogue_smem: bool,
                out: Path | None, workdir: Path, q: int = 8, q_magic: bool = False,
                series: bool = False) -> int:
    sys.path.insert(0, tree)
    sys.path.insert(1, str(HERE.parent))
    import spec_decode_attn as bench
    import torch
    from triton.experimental.gluon import language as gl

    from tests.support import spec_decode_ref as ref

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("needs an sm_90 GPU (H100/H200)", file=sys.stderr)
        return 2
    cand = load(workdir)
    vars(cand)["EPI_SMEM"] = gl.constexpr(epilogue_smem)  # read when the kernel compiles
    vars(cand)["Q_MAGIC"] = gl.constexpr(q_magic)
    flags = series_globals(q) if series else {}
    for name, value in flags.items():
        vars(cand)[name] = gl.constexpr(value)
    sda = importlib.import_module("vllm.v1.attention.ops.spec_decode_attention")
    bench.KV = "int8"
    env = {"torch": torch, "ref": ref, "sda": sda}
    heads = bench.NUM_KV_HEADS * bench.GROUP
    ws = sda.get_workspace(64, heads, bench.HEAD_SIZE, torch.device("cuda"))
    plan = sda.plan_launch(1, q, heads, bench.NUM_KV_HEADS, bench.HEAD_SIZE, ws,
                           kernel="hopper")
    programs = bench.NUM_KV_HEADS * plan.num_segments
    cand.TIMELINE[0] = torch.zeros(programs * len(SLOTS), dtype=torch.int64, device="cuda")
    qk_scale = bench.HEAD_SIZE**-0.5 * 1.4426950408889634
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "stages": stages, "q": q,
                              "q_magic": q_magic, "series_flags": sorted(flags),
                              "epilogue_smem": epilogue_smem, "contexts": {}}
    for ctx in contexts:
        batch = bench.Cell(env, 1, ctx).batches(q)[0]
        launches = []
        for _ in range(12):
            cand.TIMELINE[0].zero_()
            # Eager with one consumer warpgroup, lazy with two: the series' pass.
            cand.launch(batch, ws, plan, qk_scale, 2, stages, q * bench.GROUP > 64, "fp16")
            torch.cuda.synchronize()
            t = cand.TIMELINE[0].view(programs, len(SLOTS)).double().cpu() / 1e3  # µs
            entry = t[:, 0]
            row = {"entry_spread_us": float(entry.max() - entry.min()),
                   "end_us": float(t.max() - entry.min())}
            for k, name in enumerate(SLOTS[1:], 1):
                # Programs past a short request's end (an empty segment) record no slot.
                ran = t[:, k] > 0
                row[f"{name}_us"] = (float((t[ran, k] - entry[ran]).median())
                                     if bool(ran.any()) else float("nan"))
            launches.append(row)
        kept = launches[2:]
        med = {k: sorted(r[k] for r in kept)[len(kept) // 2] for k in kept[0]}
        result["contexts"][str(ctx)] = med
        print(ctx, json.dumps({k: round(v, 2) for k, v in med.items()}), flush=True)
    if out:
        out.write_text(json.dumps(result, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", help="directory that contains patched vllm/ (device runs)")
    parser.add_argument("--compile-only", action="store_true",
                        help="compile the instrumented kernel for sm_90a and count its reads")
    parser.add_argument("--contexts", default="2048,16384,65536")
    parser.add_argument("--q", type=int, default=8,
                        help="verify length (above 10, two consumer warpgroups, lazy)")
    parser.add_argument("--q-round", choices=("floor", "magic"), default="magic",
                        help="the candidate's --q-round")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--epilogue", choices=("rows", "smem"), default="rows",
                        help="the candidate's --epilogue (smem frees room for --stages 3)")
    parser.add_argument("--series", action="store_true",
                        help="time the candidate with the options the series compiles at --q")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.compile_only:
            report = compile_report(Path(tmp))
            print(json.dumps(report))
            if args.json:
                args.json.write_text(json.dumps(report, indent=1))
            return 0
        if not args.tree:
            parser.error("--tree is needed for a device run")
        return _device_run(args.tree, [int(c) for c in args.contexts.split(",") if c],
                           args.stages, args.epilogue == "smem", args.json, Path(tmp), args.q,
                           args.q_round == "magic", args.series)


if __name__ == "__main__":
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    sys.exit(main())
