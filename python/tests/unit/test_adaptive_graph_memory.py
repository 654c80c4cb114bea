"""Issue 22, gotcha 23: with the adaptive verify block on, dflash2-lookup.patch captures
uniform-decode graphs for the short steps too (1.8 instead of 1.45 GiB of graphs at k = 15),
and the plan's graph reservation must hold them; a plan without the block needs less."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen3090 import profiles as P
from tests.support.planning import plan_for

pytestmark = pytest.mark.unit

GIB_MIB = 1024
ONE_LENGTH_K15_MIB = 1.45 * GIB_MIB  # gotcha 23: one decode length at k = 15
BOTH_LENGTHS_K15_MIB = 1.8 * GIB_MIB  # gotcha 23: the long and the short block's graphs
BASE = {"SPEC": "dflash2", "DFLASH_TOKENS": "15", "DFLASH_MAX_LEN": "16384"}

ADAPTIVE = [
    pytest.param({}, id="fast"),
    pytest.param({"CTX": "long"}, id="long"),
    pytest.param({"CTX": "huge"}, id="huge"),
    pytest.param({"LOOKUP_ADAPTIVE": "1", "ASYNC_SCHED": "0"}, id="explicit"),
]
NOT_ADAPTIVE = [
    pytest.param({"LOOKUP_ADAPTIVE": "0"}, id="adaptive-0"),
    pytest.param({"LOOKUP": "0"}, id="lookup-0"),
    pytest.param({"ASYNC_SCHED": "1"}, id="async"),  # gotcha 18: the patch drops the block
    pytest.param({"CTX": "huge", "PREFIX_CACHE": "1"}, id="huge-prefix"),  # pinned constant
]


def _graph_warnings(extra: dict[str, str], tmp_path: Path, mib: int) -> list[str]:
    plan = plan_for({**BASE, **extra, "GRAPH_MEM_MIB": str(mib)}, cwd=tmp_path)
    assert plan.env["VLLM_V2_CUDAGRAPH_MEM_MIB"] == str(mib)
    return [w for w in plan.warnings if w.startswith(f"GRAPH_MEM_MIB={mib} ")]


def _default_mib(extra: dict[str, str], tmp_path: Path) -> int:
    return int(plan_for({**BASE, **extra}, cwd=tmp_path).env["VLLM_V2_CUDAGRAPH_MEM_MIB"])


@pytest.mark.parametrize("extra", ADAPTIVE)
def test_the_adaptive_block_needs_its_short_step_graphs_reserved(
    extra: dict[str, str], tmp_path: Path,
) -> None:
    default = _default_mib(extra, tmp_path)
    assert default >= BOTH_LENGTHS_K15_MIB
    # One length's worth is short of what the patch captures: the warning says so.
    below = default - P.V2_GRAPH_MEM_SHORT_BLOCK_MIB
    (warning,) = _graph_warnings(extra, tmp_path, below)
    assert f"below the {default} MiB" in warning
    assert "short-step graphs" in warning and "gotcha 23" in warning
    assert not _graph_warnings(extra, tmp_path, default)


@pytest.mark.parametrize("extra", NOT_ADAPTIVE)
def test_without_the_adaptive_block_one_length_is_enough(
    extra: dict[str, str], tmp_path: Path,
) -> None:
    default = _default_mib(extra, tmp_path)
    # The default stays the shipped figure, which holds both lengths (the original's rows).
    assert default == _default_mib({}, tmp_path)
    need = default - P.V2_GRAPH_MEM_SHORT_BLOCK_MIB
    assert need >= ONE_LENGTH_K15_MIB
    assert not _graph_warnings(extra, tmp_path, need)
    (warning,) = _graph_warnings(extra, tmp_path, need - 1)
    assert f"below the {need} MiB" in warning and "gotcha 23" not in warning


def test_the_short_block_term_is_gotcha_23s_difference() -> None:
    assert abs(P.V2_GRAPH_MEM_SHORT_BLOCK_MIB - (BOTH_LENGTHS_K15_MIB - ONE_LENGTH_K15_MIB)) <= 10
