"""dflash2-lookup.patch captures uniform-decode graphs for the adaptive verify block's short
steps (issue 22, gotcha 23), on the CPU trees.

``lookup_graphs_probe.py`` builds vLLM 0.28.0's real ``ModelCudaGraphManager`` the way the V2
runner would for a DFlash2 server with 15 draft tokens (query length 16), with the extra
lengths the patched runner's ``lookup_decode_query_lens`` takes from the patched speculator,
and dispatches short (8 query tokens: the drafter's 7 drafts and the bonus token) and long
steps of 1-4 requests. Not exercised here: the capture itself, the graphs' memory and the
replay on a GPU (the GPU tier's job).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import patchtrees

pytestmark = pytest.mark.patch

PROBE = Path(__file__).resolve().parent / "probes" / "lookup_graphs_probe.py"
MARKER = "QWEN3090-PROBE "
LONG = 16  # num_speculative_tokens 15 + the bonus token
SHORT = 8  # the drafter's 7-token block + the bonus token
_CACHE: dict[tuple[str, str, str, str], dict[str, Any]] = {}


def _probe(tree: Path, scheduling: str = "sync", lookup: str = "1",
           adaptive: str = "1") -> dict[str, Any]:
    key = (str(tree), scheduling, lookup, adaptive)
    if key not in _CACHE:
        env = {"VLLM_DFLASH2_LOOKUP": lookup, "VLLM_DFLASH2_LOOKUP_ADAPTIVE": adaptive}
        proc = patchtrees.run_in_tree(tree, PROBE, env=env, args=[scheduling])
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        lines = [ln[len(MARKER):] for ln in proc.stdout.splitlines() if ln.startswith(MARKER)]
        assert len(lines) == 1, out
        _CACHE[key] = json.loads(lines[0])
    return _CACHE[key]


def _full_uniform(steps: list[dict[str, Any]], query_len: int) -> bool:
    return all(s["mode"] == "FULL" and s["uniform"] == query_len
               and s["num_tokens"] == s["num_reqs"] * query_len for s in steps)


def test_stock_runner_sends_a_short_step_piecewise(pristine_cpu_tree: Path) -> None:
    got = _probe(pristine_cpu_tree)
    assert got["patched"] is False
    assert got["full_uniform_lens"] == [LONG]
    assert _full_uniform(got["long"], LONG)
    # Gotcha 23 on stock 0.28.0: no uniform graph of 8, so every short step runs piecewise.
    assert {s["mode"] for s in got["short"]} == {"PIECEWISE"}


def test_adaptive_block_captures_both_decode_lengths(patched_cpu_tree: Path) -> None:
    got = _probe(patched_cpu_tree)
    assert got["patched"] is True
    assert got["extra"] == [SHORT]
    assert got["full_uniform_lens"] == [SHORT, LONG]
    assert got["full_graphs"] == [[q, n] for q in (SHORT, LONG) for n in range(1, 5)]
    assert _full_uniform(got["short"], SHORT)
    assert _full_uniform(got["long"], LONG)


@pytest.mark.parametrize(("scheduling", "lookup", "adaptive"), [
    ("sync", "1", "0"),  # lookup without the adaptive block
    ("sync", "0", "1"),  # no lookup: ADAPTIVE alone changes nothing
    ("async", "1", "1"),  # async scheduling drops the adaptive block (gotcha 18)
])
def test_without_the_adaptive_block_the_graphs_are_stock(
    patched_cpu_tree: Path, pristine_cpu_tree: Path, scheduling: str, lookup: str,
    adaptive: str,
) -> None:
    got = _probe(patched_cpu_tree, scheduling, lookup, adaptive)
    stock = _probe(pristine_cpu_tree)
    assert got["extra"] == []
    for field in ("full_graphs", "num_piecewise", "short", "long"):
        assert got[field] == stock[field], field
