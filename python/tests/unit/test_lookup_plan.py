"""The planner's dflash2 lookup knobs against what a build of ``patches/series`` reads
(issue 22): with dflash2-lookup.patch in the series they are emitted as the original launcher
set them; without it a default is dropped with a warning and an explicit knob is refused,
naming the patch. Every VLLM_* variable a dflash2 plan emits is registered in vLLM."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import pytest

from qwen3090.capabilities import Capabilities
from qwen3090.errors import Qwen3090Error
from qwen3090.knobs import load_settings
from qwen3090.plan import PlatformFacts, ServePlan, resolve
from qwen3090.vllm_envs import SERIES_REGISTERED, STOCK_VLLM_ENV
from tests.support.planning import series_caps as support_series_caps

pytestmark = pytest.mark.unit

PATCH = "dflash2-lookup.patch"


def series_caps(*, without: str | None = None) -> Capabilities:
    """The series' build, plus the DFlash2 drafter's layers on the KVarN cache, which
    SPEC=dflash2 CTX=huge needs and no patch here provides yet (issue 24)."""
    return support_series_caps(without=without, extra_features=("kvarn-dflash2-drafter",))


def plan(env: Mapping[str, str], caps: Capabilities, cwd: Path) -> ServePlan:
    facts = dataclasses.replace(PlatformFacts(), cwd=cwd)
    return resolve(load_settings(environ=dict(env), cli=None), caps, facts)


def test_the_series_build_reads_the_lookup_knobs() -> None:
    caps = series_caps()
    assert {"VLLM_DFLASH2_LOOKUP", "VLLM_DFLASH2_LOOKUP_ADAPTIVE"} <= caps.env
    assert "dflash2-lookup" in caps.features


@pytest.mark.parametrize("k", [7, 15])
@pytest.mark.parametrize("ctx", ["fast", "long", "huge"])
def test_dflash2_rows_emit_the_lookup_on_the_series_build(ctx: str, k: int,
                                                          tmp_path: Path) -> None:
    got = plan({"SPEC": "dflash2", "CTX": ctx, "DFLASH_TOKENS": str(k)}, series_caps(),
               tmp_path)
    assert got.env["VLLM_DFLASH2_LOOKUP"] == "1"
    assert "VLLM_DFLASH2_LOOKUP_ADAPTIVE" not in got.env  # the patch's default (1) holds
    args = list(got.vllm_args)
    # Gotcha 18: the adaptive block (k > 7) needs async scheduling off.
    assert ("--no-async-scheduling" in args) is (k > 7)
    assert not [w for w in got.warnings if "LOOKUP" in w]
    # Everything a dflash2 plan sets that vLLM is to read is registered there.
    for name in got.env:
        if name.startswith("VLLM_"):
            assert name in STOCK_VLLM_ENV | SERIES_REGISTERED, name


def test_huge_with_prefix_caching_keeps_the_constant_block(tmp_path: Path) -> None:
    got = plan({"SPEC": "dflash2", "CTX": "huge", "DFLASH_TOKENS": "15", "PREFIX_CACHE": "1"},
               series_caps(), tmp_path)
    assert got.env["VLLM_DFLASH2_LOOKUP"] == "1"
    assert got.env["VLLM_DFLASH2_LOOKUP_ADAPTIVE"] == "0"


def test_without_the_patch_the_default_is_dropped_and_the_knob_refused(tmp_path: Path) -> None:
    caps = series_caps(without=PATCH)
    got = plan({"SPEC": "dflash2", "DFLASH_TOKENS": "15"}, caps, tmp_path)
    assert "VLLM_DFLASH2_LOOKUP" not in got.env
    assert [w for w in got.warnings if "VLLM_DFLASH2_LOOKUP" in w]
    with pytest.raises(Qwen3090Error) as err:
        plan({"SPEC": "dflash2", "LOOKUP": "1"}, caps, tmp_path)
    assert f"patches/{PATCH}" in err.value.message
