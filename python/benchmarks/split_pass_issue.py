"""Issue budget of the split pass's steady-state loop, read from its compiled SASS (no GPU).

Compiles the split pass the way a launch on an H200 specialises it (the worker's compile
report: spec_decode_worker.compile_triton_split / compile_hopper, sm_90a, the installed
Triton and the ptxas and cuobjdump it ships), finds the loop that runs once per KV tile
(tests/support/sass_loops.py: the innermost loop holding an MMA; for the Triton pass the
shorter of its unmasked and masked loops, for the warp-specialised Gluon pass every consumer
partition's loop) and prints what one tile costs in warp instructions, by opcode class.

From that it derives, per context, two times that bound the kernel from below:
- the HBM floor: the cache's bytes (a per-token-head cache's scales included) over
  ``--bandwidth-tbs`` (default: the H200 copy bandwidth spec_decode_attn.py measured);
- the issue floor: the loop's warp instructions for every tile of the context (batch 1, 4 KV
  heads), issued at 4 per cycle on each of ``--sms`` multiprocessors at ``--clock-ghz``.
and the IPC (warp instructions per cycle per multiprocessor, at most 4) the loop would have
to sustain for the call to reach a share of the HBM floor (issue 21's 40 % at 16k and 60 %
at 64k-128k). The count is static: a block inside the loop that a predicated branch can jump
over (the Gluon pass builds its causal mask inside its one loop) is counted too, and shown
apart as the loop's guarded instructions. Only the loop is counted: prologue, epilogue, the
loader warp of the Gluon pass and the reduce pass come on top, so the true requirement is
higher still.

    python benchmarks/split_pass_issue.py --tree DIR [--json OUT] [--queries 8,16]

The tree is a patched vLLM tree (the CPU wheel's will do: nothing runs on a device).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PYTHON_DIR = HERE.parent

HEADS, KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 24, 4, 256, 16
H200_SMS = 132
# SM clock nvidia-smi read on a loaded H200 (the device lender's notes, 2026-10-28).
H200_CLOCK_GHZ = 1.98
# Device-to-device copy bandwidth the 8-bit sweeps measured on the H200 (2026-12-03): what
# spec_decode_attn.md's "% of floor" divides by.
H200_COPY_TBS = 4.27
ISSUE_PER_SM = 4  # warp schedulers a multiprocessor, one instruction each a cycle
CONTEXTS = (16384, 65536, 131072)
# Issue 21's targets: share of the HBM floor per context.
TARGETS = {16384: 0.40, 65536: 0.60, 131072: 0.60}
# Bytes of one token's K and V for one KV head (TRITON_ATTN's per-token-head rows carry a
# float32 scale each).
TOKEN_HEAD_BYTES = {"bf16": 2 * HEAD_SIZE * 2, "fp8q": 2 * HEAD_SIZE,
                    "int8": 2 * (HEAD_SIZE + 4)}


@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    kv: str  # the worker's cache kinds: bf16, fp8q, int8
    kernel: str  # "triton" or "hopper"
    int8_qk: int | None = None  # int8 only: the production plan with this Q.K mode


CONFIGS = (
    Config("bf16 Triton", "bf16", "triton"),
    Config("bf16 Gluon (warp-specialised)", "bf16", "hopper"),
    Config("fp8 production (fp8 Q.K MMA)", "fp8q", "triton"),
    Config("int8 production", "int8", "triton", int8_qk=0),
    Config("int8 production +int8qk1", "int8", "triton", int8_qk=1),
    Config("int8 production +int8qk2", "int8", "triton", int8_qk=2),
)


def sass_of(cubin: bytes, workdir: Path) -> str:
    """cuobjdump -sass of a cubin, with the cuobjdump Triton ships."""
    import triton

    path = workdir / "split.cubin"
    path.write_bytes(cubin)
    exe = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    proc = subprocess.run([str(exe), "-sass", str(path)], capture_output=True, text=True,
                          check=True)
    return proc.stdout


def budget_row(config: Config, q: int, workdir: Path, sms: int, clock_ghz: float,
               bandwidth_tbs: float) -> dict[str, Any]:
    import torch

    from tests.patch import spec_decode_worker as worker
    from tests.support.sass_loops import mma_loops

    sda = importlib.import_module(worker.SDA_MODULE)
    ws = sda.SpecDecodeWorkspace(64, HEADS, HEAD_SIZE, torch.device("cpu"), num_sms=sms,
                                 max_shared_mem=227 << 10, hopper=config.kernel == "hopper")
    family = {"int8": "int8", "fp8q": "fp8"}.get(config.kv)
    overrides = sda.TILE_PLANS[family].plan_overrides() if family else {}
    plan = sda.plan_launch(1, q, HEADS, KV_HEADS, HEAD_SIZE, ws, kernel=config.kernel,
                           **overrides)
    if plan.kernel != config.kernel:
        raise RuntimeError(f"{config.name}: the planner chose {plan.kernel}")
    if config.kernel == "hopper":
        hopper = importlib.import_module(worker.HOPPER_MODULE)
        compiled = worker.compile_hopper(hopper, plan, HEADS, KV_HEADS, HEAD_SIZE, BLOCK_SIZE)
        partitions, warps = plan.num_wg, 4  # consumer warpgroups, each its own loop
    else:
        # The fp8 production plan's Q.K on the fp8 MMA (FP8_QK), which the compile report's
        # planner-plan rows leave off.
        extra = {"FP8_QK": True} if config.kv == "fp8q" and sda.TILE_PLANS["fp8"].fp8_qk else {}
        compiled = worker.compile_triton_split(sda, plan, config.kv, 90,
                                               int8_qk=config.int8_qk, extra=extra)
        partitions, warps = 1, plan.num_warps
    found = mma_loops(sass_of(compiled.asm["cubin"], workdir))
    if config.kernel == "hopper":
        if len(found) != partitions:
            raise RuntimeError(f"{config.name} q={q}: {len(found)} MMA loops for "
                               f"{partitions} consumer partitions")
        chosen = found
    else:
        chosen = [min(found, key=lambda loop: loop.instructions)]
    per_warp = sum(loop.instructions for loop in chosen)
    classes: dict[str, int] = {}
    for loop in chosen:
        for name, n in loop.classes().items():
            classes[name] = classes.get(name, 0) + n
    opcodes: dict[str, int] = {}
    for loop in chosen:
        for op, n in loop.opcodes.items():
            opcodes[op] = opcodes.get(op, 0) + n
    # Warp instructions a KV token costs (every warp of the CTA runs the loop once a tile).
    per_token = per_warp * warps / plan.tile_n
    issue_rate = sms * ISSUE_PER_SM * clock_ghz * 1e9
    contexts = {}
    for ctx in CONTEXTS:
        warp_insts = per_token * ctx * KV_HEADS
        floor_s = ctx * KV_HEADS * TOKEN_HEAD_BYTES[config.kv] / (bandwidth_tbs * 1e12)
        issue_s = warp_insts / issue_rate
        target = TARGETS[ctx]
        need_ipc = warp_insts / (sms * clock_ghz * 1e9 * floor_s / target)
        contexts[str(ctx)] = {"hbm_floor_us": floor_s * 1e6, "issue_floor_us": issue_s * 1e6,
                              "target_pct": 100 * target, "ipc_for_target": need_ipc}
    return {
        "config": config.name, "kv": config.kv, "kernel": plan.kernel, "q": q,
        "tile_n": plan.tile_n, "warps": warps * partitions, "num_stages": plan.num_stages,
        "loops_found": [loop.instructions for loop in found],
        # Summed over the consumer partitions (each run by its own warps).
        "loop_insts_per_warp": per_warp, "mma_per_warp": sum(loop.mma for loop in chosen),
        # Of those, what a predicated forward branch can skip (a mask built on some tiles
        # only): when not 0, the count is an upper bound on what a steady tile issues.
        "loop_insts_guarded": sum(loop.guarded for loop in chosen),
        "warp_insts_per_token": per_token, "classes": classes,
        "top_opcodes": dict(sorted(opcodes.items(), key=lambda kv: -kv[1])[:12]),
        "contexts": contexts,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    print("\n| config | q | tile | warps | loop insts a warp (guarded) | warp insts a token | "
          "copy / shared / convert / integer / softmax / mma / other |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        c = r["classes"]
        mix = " / ".join(str(c[k]) for k in ("copy", "shared", "convert", "integer", "softmax",
                                               "mma", "other"))
        print(f"| {r['config']} | {r['q']} | {r['tile_n']} | {r['warps']} | "
              f"{r['loop_insts_per_warp']} ({r['loop_insts_guarded']}) | "
              f"{r['warp_insts_per_token']:.0f} | {mix} |")
    print("\n| config | q | " + " | ".join(
        f"{ctx // 1024}k: HBM floor / issue floor µs, IPC for {int(100 * t)} %"
        for ctx, t in TARGETS.items()) + " |")
    print("|---|---:|" + "---|" * len(TARGETS))
    for r in rows:
        cells = [f"{c['hbm_floor_us']:.1f} / {c['issue_floor_us']:.1f}, "
                 f"{c['ipc_for_target']:.2f}" for c in r["contexts"].values()]
        print(f"| {r['config']} | {r['q']} | " + " | ".join(cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", required=True, help="directory that contains patched vllm/")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--queries", default="8,16", help="comma-separated verify lengths")
    parser.add_argument("--configs", default="",
                        help="comma-separated indices into CONFIGS (default: all)")
    parser.add_argument("--sms", type=int, default=H200_SMS)
    parser.add_argument("--clock-ghz", type=float, default=H200_CLOCK_GHZ)
    parser.add_argument("--bandwidth-tbs", type=float, default=H200_COPY_TBS)
    args = parser.parse_args()
    # Triton's compiler, not its interpreter or a device.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.pop("TRITON_INTERPRET", None)
    sys.path.insert(0, args.tree)
    sys.path.insert(1, str(PYTHON_DIR))  # after the tree: its vllm must win
    from vllm.triton_utils import HAS_TRITON

    if not HAS_TRITON:
        print("vLLM turned Triton off (is a 'vllm' distribution on the path?)",
              file=sys.stderr)
        return 2
    import triton

    chosen = ([CONFIGS[int(i)] for i in args.configs.split(",") if i] if args.configs
              else list(CONFIGS))
    queries = [int(q) for q in args.queries.split(",") if q]
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"split-pass-issue-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"Triton {triton.__version__}; {args.sms} SMs at {args.clock_ghz} GHz, "
          f"{args.bandwidth_tbs} TB/s", flush=True)
    rows = []
    for config in chosen:
        for q in queries:
            row = budget_row(config, q, workdir, args.sms, args.clock_ghz, args.bandwidth_tbs)
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("config", "q", "loops_found",
                                                  "loop_insts_per_warp", "loop_insts_guarded",
                                                  "top_opcodes")}),
                  flush=True)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps({"triton": triton.__version__, "rows": rows},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
