"""Issue 24: the KVarN rows (CTX=huge, batch KV=kvarn) on a build of this repository's series.

The capabilities come from the patch headers of ``patches/series`` alone, as the build manifest
would list them, so these plans are what ``qwen3090 plan`` gives on the real build."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from qwen3090 import profiles as P
from qwen3090.errors import Qwen3090Error
from qwen3090.resolver.common import kvarn_staging_bytes, kvarn_workspace_bytes
from tests.support.planning import arg_map, plan_for, series_caps

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
BACKEND = REPO / "patches" / "overlay" / "vllm" / "v1" / "attention" / "backends" / "kvarn_attn.py"
GIB = 1 << 30


def test_ctx_huge_plans_the_kvarn_cache_on_the_series(tmp_path: Path) -> None:
    plan = plan_for({"CTX": "huge", "PREFIX_CACHE": "1"}, caps=series_caps(), cwd=tmp_path)
    args = arg_map(plan.vllm_args)
    assert args["--kv-cache-dtype"] == "kvarn_k4v2_g128"
    assert args["--block-size"] == "128"
    assert args["--prefix-match-unit"] == "128"
    assert args["--max-model-len"] == "200000"
    # The original's pool fraction has no reader here, so the plan does not set it.
    assert not [k for k in plan.env if k.startswith("KVARN_")], plan.env
    assert any("gotcha 46" in w for w in plan.warnings), plan.warnings


def test_batch_kvarn_plans_on_the_series_and_prices_its_seats(tmp_path: Path) -> None:
    plan = plan_for({"KV": "kvarn"}, cli={"PROFILE": "batch"}, caps=series_caps(),
                    cwd=tmp_path)
    assert arg_map(plan.vllm_args)["--kv-cache-dtype"] == "kvarn_k4v2_g128"
    staging = [w for w in plan.warnings if "staging" in w]
    assert len(staging) == 1 and "MAX_SEQS=64" in staging[0], plan.warnings
    # 1.01 GiB of staging and 0.05 GiB of workspace at 64 seats: batch has no speculator, so
    # its split rows (64 seats x 1 query x 32 segments) are no more than a prefill chunk's.
    assert "allocates 1.06 GiB" in staging[0], staging
    assert "1.01 GiB of bf16 staging" in staging[0] and "0.05 GiB of split-pass" in staging[0]
    few = plan_for({"KV": "kvarn", "MAX_SEQS": "8"}, cli={"PROFILE": "batch"},
                   caps=series_caps(), cwd=tmp_path)
    assert not [w for w in few.warnings if "staging" in w], few.warnings


def test_dflash2_at_ctx_huge_is_refused_before_the_engine_refuses_it(tmp_path: Path) -> None:
    with pytest.raises(Qwen3090Error) as err:
        plan_for({"SPEC": "dflash2", "CTX": "huge"}, caps=series_caps(), cwd=tmp_path)
    assert err.value.message.startswith("CTX=huge ")
    assert "kvarn-dflash2-drafter" in err.value.message
    assert "SPEC=mtp" in (err.value.fix or "")


@pytest.mark.parametrize(("knobs", "profile"), [({"CTX": "huge"}, "single-user"),
                                               ({"KV": "kvarn"}, "batch")])
def test_a_full_cuda_graph_on_the_kvarn_cache_is_refused_before_the_engine(
        knobs: dict[str, str], profile: str, tmp_path: Path) -> None:
    """vLLM 0.28.0 refuses cudagraph_mode FULL for a backend with no graph support (the
    KVARN builder's) only after loading the weights; the plan refuses it first."""
    with pytest.raises(Qwen3090Error) as err:
        plan_for({**knobs, "CUDAGRAPH_MODE": "FULL"}, cli={"PROFILE": profile},
                 caps=series_caps(), cwd=tmp_path)
    assert err.value.message.startswith("CUDAGRAPH_MODE=FULL ")
    assert "KVarN" in err.value.message
    assert "CUDAGRAPH_MODE=PIECEWISE" in (err.value.fix or "")


@pytest.mark.parametrize("mode", ["FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_a_full_decode_mode_on_the_kvarn_cache_is_said_to_become_piecewise(
        mode: str, tmp_path: Path) -> None:
    plan = plan_for({"KV": "kvarn", "CUDAGRAPH_MODE": mode}, cli={"PROFILE": "batch"},
                    caps=series_caps(), cwd=tmp_path)
    assert [w for w in plan.warnings if w.startswith(f"CUDAGRAPH_MODE={mode} with the KVarN")]


def test_piecewise_and_other_caches_keep_their_modes_quietly(tmp_path: Path) -> None:
    huge = plan_for({"CTX": "huge"}, caps=series_caps(), cwd=tmp_path)
    assert not [w for w in huge.warnings if "with the KVarN cache" in w], huge.warnings
    fp8 = plan_for({"KV": "fp8", "CUDAGRAPH_MODE": "FULL"}, cli={"PROFILE": "batch"},
                   caps=series_caps(), cwd=tmp_path)
    assert not [w for w in fp8.warnings if "with the KVarN cache" in w], fp8.warnings


def _constant(text: str, name: str) -> int:
    m = re.search(rf"^{name} = (\d+)$", text, re.M)
    assert m is not None, f"kvarn_attn.py has no {name}"
    return int(m.group(1))


def test_the_staging_figures_are_the_backends() -> None:
    """profiles' seat price mirrors kvarn_attn.py's buffers: staging entries a seat and the
    tile, and the split workspace's rows."""
    text = BACKEND.read_text()
    rows = re.search(r"rows = \(stage_entries\(max_num_seqs\) \+ 1\) \* TILE", text)
    assert rows is not None
    assert _constant(text, "STAGE_ENTRIES_PER_SEQ") == P.KVARN_STAGE_TILES_PER_SEAT
    assert _constant(text, "SPLIT_QUERY_MAX") == P.KVARN_SPLIT_QUERY_MAX
    assert _constant(text, "SPLIT_SEGMENTS") == P.KVARN_SPLIT_SEGMENTS
    queries = re.search(r"return min\(1 \+ num_speculative_tokens, SPLIT_QUERY_MAX\)", text)
    split = re.search(r"split = max_num_seqs \* split_queries\(num_speculative_tokens\) "
                      r"\* SPLIT_SEGMENTS\n\s+return max\(split, max_num_batched_tokens\)",
                      text)
    sized = re.search(r"_workspace\(device, self\.split_rows \* num_heads \* head_size,", text)
    pairs = re.search(r"torch.empty\(floats // head_size \* 2, dtype=torch.float32", text)
    assert queries is not None and split is not None and sized is not None and pairs is not None
    # 64 seats x 16 queries (15 drafts) x 32 segments rows, 24 heads, fp32 acc of 256 and an
    # (m, l) pair; more drafts than that are still 16 queries, a prefill chunk's longest.
    row = 24 * (256 + 2) * 4
    assert kvarn_workspace_bytes(64, spec_tokens=15) == 64 * 16 * 32 * row
    assert kvarn_workspace_bytes(64, spec_tokens=40) == 64 * 16 * 32 * row
    # 8 seats verifying 3 MTP drafts: 8 x 4 x 32 = 1,024 rows, under a 2,048-token chunk's.
    assert kvarn_workspace_bytes(8, spec_tokens=3) == 2048 * row
    assert kvarn_workspace_bytes(64, spec_tokens=0, max_batched_tokens=512) == 64 * 32 * row
    # 16 attention layers x 128 rows x 4 kv heads x head 256, bf16 K and V.
    assert kvarn_staging_bytes(64) == 129 * 16 * 128 * 4 * 256 * 2 * 2
    assert 1.0 * GIB < kvarn_staging_bytes(64) < 1.1 * GIB
