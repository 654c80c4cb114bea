"""benchmarks/rtx3090_tile_model.py (issue 21): the cost model that chose the RTX 3090's tile
plans. Its arithmetic on hand-made kernels: how many programs an SM holds, what a tile's MMAs
cost on a GeForce GA102, when DRAM and when the SM bounds a call, and how plans are ranked.
Compiling the grid for sm_86 and checking the series' choice against it is the patch tier's
(tests/patch/test_spec_decode_attn.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.modules import load_module

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "rtx3090_tile_model.py"


@pytest.fixture(scope="module")
def model() -> ModuleType:
    return load_module(SCRIPT, "rtx3090_tile_model_unit")


def _kernel(model: ModuleType, **fields: Any) -> Any:
    base = {"kv": "int8", "q": 8, "block_m": 64, "q_tiles": 1, "tile_n": 32, "num_warps": 8,
            "num_stages": 2, "int8_qk": 0, "shared": 53_504, "regs": 224, "spill_bytes": 0,
            "loop_insts": 500, "num_segments": 32}
    return model.Compiled(**{**base, **fields})


def test_residency_follows_the_scarcest_resource(model: ModuleType) -> None:
    card = model.RTX3090
    # Shared memory: 53.5 KB and its 1 KiB reserve twice is over 100 KiB.
    assert model.residency(card, 53_504, 128, 4) == 1
    assert model.residency(card, 43_136, 128, 4) == 2
    # Registers, allocated 256 a warp: 255 a thread is 8,192 a warp; 64 Ki hold 8 warps.
    assert model.residency(card, 1_024, 255, 4) == 2
    assert model.residency(card, 1_024, 255, 8) == 1
    # Threads: 1,536 an SM; blocks: 16.
    assert model.residency(card, 0, 32, 16) == 3
    assert model.residency(card, 0, 16, 1) == 16
    # Over the 99 KiB a block may have: it does not launch.
    assert model.residency(card, (99 << 10) + 1, 32, 4) == 0


def test_tensor_clocks_on_a_geforce_ga102(model: ModuleType) -> None:
    """64 rows x 32 keys x 256: P.V at 256 bf16 FMAs a clock is 2,048 clocks; Q.K the same
    widened, half of it on the int8 MMA with two terms, a quarter with one."""
    card = model.RTX3090
    assert model.tensor_clocks_per_tile(card, _kernel(model, int8_qk=0)) == 4096
    assert model.tensor_clocks_per_tile(card, _kernel(model, int8_qk=2)) == 3072
    assert model.tensor_clocks_per_tile(card, _kernel(model, int8_qk=1)) == 2560


def test_dram_or_the_sm_bounds_the_call(model: ModuleType) -> None:
    card = model.RTX3090
    # q = 4 in 32 rows: the cache's bytes over 936 GB/s bound the split (16k: 36.4 us plus
    # the partials it writes); the reduce pass reads the partials back after it.
    small = _kernel(model, q=4, block_m=32, int8_qk=2, loop_insts=100)
    t = model.model_us(card, small, 16384, 32)
    partials = 4 * 24 * 32 * 258 * 4
    assert t["dram"] == pytest.approx((16384 * 4 * 520 + partials) / 936e3)
    assert t["dram"] > t["tensor"]
    assert t["reduce"] == pytest.approx(partials / 936e3)
    assert t["total"] == pytest.approx(t["dram"] + t["reduce"])
    # One segment: no partials, no reduce pass.
    assert model.model_us(card, small, 16384, 1)["reduce"] == 0
    # q = 8 in 64 rows, K widened: 128 programs on 82 SMs, one each, is two waves of 16
    # tiles of 4,096 clocks at 1.695 GHz.
    big = _kernel(model)
    t = model.model_us(card, big, 16384, 32)
    assert t["waves"] == 2 and t["per_sm"] == 1
    assert t["tensor"] == pytest.approx(2 * 16 * 4096 / 1695)
    assert t["total"] == pytest.approx(t["tensor"] + t["reduce"])
    # Half the segments: one wave of twice the tiles, the same MMA time, half the partials.
    half = model.model_us(card, big, 16384, 16)
    assert half["waves"] == 1 and half["tensor"] == pytest.approx(t["tensor"])
    assert half["reduce"] == pytest.approx(t["reduce"] / 2)
    # Issue: 8 warps x 1,000 instructions at 4 a clock is 2,000 clocks a tile, under the
    # MMAs' 4,096 overlapped, on top of them in series.
    t = model.model_us(card, dataclasses.replace(big, loop_insts=1000), 16384, 32)
    assert t["total"] == pytest.approx(t["tensor"] + t["reduce"])
    assert t["serial"] == pytest.approx(2 * 16 * 6096 / 1695 + t["reduce"])
    # A kernel that does not fit is never chosen.
    assert model.model_us(card, _kernel(model, shared=200_000), 16384, 32)["total"] == float(
        "inf")


def test_ranking_prefers_the_lower_bound_then_no_spills(model: ModuleType) -> None:
    """The int8 MMA's point wins on the bound; of two points tied there, the one that does
    not spill; a tie on both goes to the smaller serial bound."""
    widened = {8: _kernel(model)}
    qk2_spills = {8: _kernel(model, int8_qk=2, num_warps=4, spill_bytes=416, loop_insts=900)}
    qk2 = {8: _kernel(model, int8_qk=2, loop_insts=1000)}
    qk2_slow_issue = {8: _kernel(model, int8_qk=2, loop_insts=1400)}
    a, b, c, d = ((32, 8, 2, 0, 128, 0), (32, 4, 2, 2, 128, 0), (32, 8, 2, 2, 128, 0),
                  (16, 8, 2, 2, 128, 0))
    ranked = model.rank(model.RTX3090, {a: widened, b: qk2_spills, c: qk2, d: qk2_slow_issue},
                        (16384, 131072))
    assert [r.point for r in ranked] == [c, d, b, a]
    assert ranked[0].worst_slowdown == pytest.approx(1.0)
    reduce = model.model_us(model.RTX3090, qk2[8], 131072, 32)["reduce"]
    tiles = 131072 // (32 * 32)
    assert ranked[-1].worst_slowdown == pytest.approx(
        (2 * tiles * 4096 / 1695 + reduce) / (2 * tiles * 3072 / 1695 + reduce))
    assert model.point_name((32, 8, 2, 2, 128, 0), "int8") == "n32 8w 2s qk2"
    assert model.point_name((32, 8, 2, 0, 128, 0), "bf16") == "n32 8w 2s"
    assert model.point_name((32, 8, 2, 2, 64, 0), "int8") == "n32 8w 2s qk2 m<=64"
    assert model.point_name((32, 8, 2, 2, 64, 1), "int8") == "n32 8w 2s qk2 m<=64 1/SM"
