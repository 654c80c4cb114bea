"""Issue 19, items 2-5: the graph-memory knob, a pinned pool that must hold one request, the
memory fraction's bounds, the verify-cost stairs and other processes' GPU memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen3090 import profiles as P
from qwen3090.errors import Qwen3090Error
from qwen3090.plan import PlatformFacts
from tests.support.planning import STOCK, arg_map, plan_for

pytestmark = pytest.mark.unit

MIB = 1 << 20


def _warned(warnings: tuple[str, ...], *needles: str) -> bool:
    return any(all(n in w for n in needles) for w in warnings)


def _refusal(env: dict[str, str], tmp_path: Path, **kw: object) -> Qwen3090Error:
    with pytest.raises(Qwen3090Error) as info:
        plan_for(env, cwd=tmp_path, **kw)  # type: ignore[arg-type]
    return info.value


# ---- item 3: one max-length request -------------------------------------------------------


def test_dflash_tokens_20_pool_cannot_hold_one_request(tmp_path: Path) -> None:
    err = _refusal({"SPEC": "dflash2", "DFLASH_TOKENS": "20"}, tmp_path)
    assert "holds 0.91 requests of 57344 tokens" in err.message
    assert "5583457484 bytes" in err.message
    assert err.fix is not None
    assert "DFLASH_TOKENS=20 (from the environment, --dflash-tokens)" in err.fix
    assert "KV_MEM" in err.fix and "DFLASH_MAX_LEN" in err.fix


def test_dflash_max_len_131072_at_fast_is_refused_naming_its_source(tmp_path: Path) -> None:
    err = _refusal({"SPEC": "dflash2", "DFLASH_MAX_LEN": "131072"}, tmp_path)
    assert "holds 0.58 requests of 131072 tokens" in err.message
    assert err.fix is not None and "DFLASH_MAX_LEN=131072 (from the environment" in err.fix


def test_a_pinned_mtp_pool_is_held_to_the_same_rule(tmp_path: Path) -> None:
    err = _refusal({"KV_MEM": "4000000000"}, tmp_path)
    assert "holds 0.81 requests of 65536 tokens" in err.message
    assert err.fix is not None and "MAX_LEN" in err.fix and "DRAFT_TOKENS" in err.fix
    fits = plan_for({"KV_MEM": "4000000000", "MAX_LEN": "32768"}, cwd=tmp_path)
    assert fits.memory.full_length_requests is not None
    assert fits.memory.full_length_requests >= 1


@pytest.mark.parametrize("ctx", ["fast", "long", "huge"])
@pytest.mark.parametrize("k", P.DFLASH_SHIPPED_TOKENS)
def test_every_shipped_dflash_row_plans(ctx: str, k: int, tmp_path: Path) -> None:
    plan = plan_for({"SPEC": "dflash2", "CTX": ctx, "DFLASH_TOKENS": str(k)}, cwd=tmp_path)
    fits = plan.memory.full_length_requests
    assert fits is not None
    # CTX=long at k = 15 is the one shipped row under one request: said, not refused.
    assert _warned(plan.warnings, "gotcha 25", "run the pool dry") == (fits < 1)
    if (ctx, k) == ("long", 15):
        assert fits == 0.9


def test_a_shipped_row_with_a_user_length_is_refused(tmp_path: Path) -> None:
    err = _refusal({"SPEC": "dflash2", "CTX": "long", "DFLASH_TOKENS": "15",
                    "DFLASH_MAX_LEN": "131072"}, tmp_path)
    assert "0.9 requests" in err.message


# ---- item 3: the verify-cost stairs (gotcha 24) --------------------------------------------


@pytest.mark.parametrize(
    ("k", "warns"),
    [(7, False), (15, False), (16, True), (19, True), (20, False), (21, True), (30, True)],
)
def test_verify_block_between_the_stairs_warns(k: int, warns: bool, tmp_path: Path) -> None:
    plan = plan_for({"SPEC": "dflash2", "DFLASH_TOKENS": str(k), "DFLASH_MAX_LEN": "16384"},
                    cwd=tmp_path)
    assert _warned(plan.warnings, f"DFLASH_TOKENS={k}", "gotcha 24") is warns


def test_mtp_draft_tokens_16_is_past_the_first_stair(tmp_path: Path) -> None:
    assert _warned(plan_for({"DRAFT_TOKENS": "16"}, cwd=tmp_path).warnings,
                   "DRAFT_TOKENS=16", "k+1 = 17", "gotcha 24")
    assert not _warned(plan_for({"DRAFT_TOKENS": "15"}, cwd=tmp_path).warnings, "gotcha 24")


# ---- item 4: GPU_UTIL ------------------------------------------------------------------------


def test_gpu_util_above_093_under_a_speculator_warns(tmp_path: Path) -> None:
    hot = plan_for({"GPU_UTIL": "0.97"}, cwd=tmp_path)
    assert _warned(hot.warnings, "GPU_UTIL=0.97", "from the environment", "gotcha 4")
    assert not _warned(plan_for({"GPU_UTIL": "0.93"}, cwd=tmp_path).warnings, "gotcha 4")
    assert not _warned(plan_for({"GPU_UTIL": "0.97", "SPEC": "off"}, cwd=tmp_path).warnings,
                       "gotcha 4")
    # The batch default 0.972 runs no speculator.
    assert not _warned(plan_for(cli={"PROFILE": "batch"}, cwd=tmp_path).warnings, "gotcha 4")


@pytest.mark.parametrize("value", ["0.99", "1.0"])
@pytest.mark.parametrize("profile", ["single-user", "batch"])
def test_gpu_util_from_099_is_refused(value: str, profile: str, tmp_path: Path) -> None:
    err = _refusal({}, tmp_path, cli={"PROFILE": profile, "GPU_UTIL": value})
    assert f"GPU_UTIL={float(value)} (from the command line)" in err.message
    assert err.fix is not None and "--gpu-util" in err.fix


def test_gpu_util_is_not_refused_where_the_pool_is_pinned(tmp_path: Path) -> None:
    plan = plan_for({"SPEC": "dflash2", "GPU_UTIL": "0.99"}, cwd=tmp_path)
    assert "--gpu-memory-utilization" not in arg_map(plan.vllm_args)


# ---- item 5: other processes' GPU memory ---------------------------------------------------


def test_foreign_memory_beyond_the_baseline_lowers_a_pinned_pool(tmp_path: Path) -> None:
    used = P.FOREIGN_BASELINE_MIB + 200
    plan = plan_for({"SPEC": "dflash2"}, facts=PlatformFacts(foreign_gpu_mib=used),
                    cwd=tmp_path)
    lowered = P.KV_MEM_DEFAULT - 200 * MIB
    assert arg_map(plan.vllm_args)["--kv-cache-memory-bytes"] == str(lowered)
    assert _warned(plan.warnings, f"{used} MiB in use", "lowered by 200 MiB", "gotcha 31")


def test_foreign_memory_within_the_baseline_changes_nothing(tmp_path: Path) -> None:
    plan = plan_for({"SPEC": "dflash2"},
                    facts=PlatformFacts(foreign_gpu_mib=P.FOREIGN_BASELINE_MIB), cwd=tmp_path)
    assert arg_map(plan.vllm_args)["--kv-cache-memory-bytes"] == str(P.KV_MEM_DEFAULT)
    assert not _warned(plan.warnings, "gotcha 31")


def test_a_desktop_leaves_a_pinned_pool_too_small_and_is_refused(tmp_path: Path) -> None:
    err = _refusal({"SPEC": "dflash2"}, tmp_path, facts=PlatformFacts(foreign_gpu_mib=1300))
    assert "other processes' GPU memory" in err.message
    assert err.fix is not None and "free the GPU memory" in err.fix


def test_foreign_memory_leaves_an_unpinned_pool_to_vllm(tmp_path: Path) -> None:
    plan = plan_for({}, facts=PlatformFacts(foreign_gpu_mib=1300), cwd=tmp_path)
    assert arg_map(plan.vllm_args)["--gpu-memory-utilization"] == "0.93"
    assert not _warned(plan.warnings, "gotcha 31")


# ---- item 2: the graph-memory knob ---------------------------------------------------------


@pytest.mark.parametrize(("k", "mib"), [(7, 1400), (8, 1900), (15, 1900), (18, 2250), (20, 2400)])
def test_graph_memory_default_grows_with_the_block(k: int, mib: int, tmp_path: Path) -> None:
    plan = plan_for({"SPEC": "dflash2", "DFLASH_TOKENS": str(k), "DFLASH_MAX_LEN": "16384"},
                    cwd=tmp_path)
    assert plan.env["VLLM_V2_CUDAGRAPH_MEM_MIB"] == str(mib)
    # Above 15 it covers gotcha 25's measurement (1.82 / 2.12 / 2.27 GiB at 15 / 18 / 20).
    measured = dict(P.V2_GRAPH_MEM_MEASURED_MIB)
    if k in measured:
        assert mib >= measured[k]


def test_graph_mem_mib_sets_the_reservation(tmp_path: Path) -> None:
    plan = plan_for({"SPEC": "dflash2", "GRAPH_MEM_MIB": "2600"}, cwd=tmp_path)
    assert plan.env["VLLM_V2_CUDAGRAPH_MEM_MIB"] == "2600"
    low = plan_for({"SPEC": "dflash2", "DFLASH_TOKENS": "15", "GRAPH_MEM_MIB": "1400"},
                   cwd=tmp_path)
    assert _warned(low.warnings, "GRAPH_MEM_MIB=1400", "below the 1900 MiB", "gotcha 25")
    assert _warned(plan_for({"GRAPH_MEM_MIB": "2600"}, cwd=tmp_path).warnings,
                   "GRAPH_MEM_MIB (from the environment) has no effect")


def test_graph_mem_mib_on_a_build_without_the_patch_is_refused(tmp_path: Path) -> None:
    err = _refusal({"SPEC": "dflash2", "GRAPH_MEM_MIB": "2600"}, tmp_path, caps=STOCK)
    assert "GRAPH_MEM_MIB=2600" in err.message
    assert "hybrid-kv-groups-v2-cudagraph.patch" in err.message


# ---- issue 24: the KVarN pool against fp8 and int8 ------------------------------------------


def test_kvarn_pool_tokens_per_gib_against_fp8_and_int8() -> None:
    """16 attention layers x 4 kv heads x head 256: kvarn 840 B/token/layer (the overlay's
    layout, python/docs/kvarn.md), fp8 2048, int8_per_token_head 2080 (its fp32 scales)."""
    from qwen3090.resolver.memory import pool_tokens_per_gib

    per_gib = {d: pool_tokens_per_gib(d)
               for d in ("kvarn_k4v2_g128", "fp8", "int8_per_token_head", "bfloat16")}
    assert per_gib == {"kvarn_k4v2_g128": 79891, "fp8": 32768,
                       "int8_per_token_head": 32263, "bfloat16": 16384}
    assert 2.4 < per_gib["kvarn_k4v2_g128"] / per_gib["fp8"] < 2.5
