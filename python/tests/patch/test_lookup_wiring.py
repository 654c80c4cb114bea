"""dflash2-lookup.patch wired into vLLM 0.28.0's DFlash2 speculator and V2 model runner
(issue 22; gotchas 18, 20, 26, 27), on the patched CPU tree.

The V2 runner does not run on the CPU build, so ``lookup_wiring_probe.py`` drives the patched
speculator's own ``__init__`` (reading the registered variables), ``propose`` and
``next_num_draft_tokens`` and the runner's own ``take_draft_token_ids`` on a real
``InputBatch``; the drafter's forward and the base class's GPU set-up are stand-ins (the probe
says which). Not exercised here: the captured draft graph, the runner's ``__init__`` calling
``bind_token_history``, the scheduler acting on the count, and verification on a GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import patchtrees

pytestmark = pytest.mark.patch

PROBE = Path(__file__).resolve().parent / "probes" / "lookup_wiring_probe.py"
MARKER = "QWEN3090-PROBE "
K = 15
DRAFTER = 7777
_CACHE: dict[tuple[str, str, str], dict[str, Any]] = {}


def _probe(tree: Path, mode: str, lookup: str = "1") -> dict[str, Any]:
    key = (str(tree), mode, lookup)
    if key not in _CACHE:
        proc = patchtrees.run_in_tree(tree, PROBE, env={"VLLM_DFLASH2_LOOKUP": lookup},
                                      args=[mode])
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        lines = [ln[len(MARKER):] for ln in proc.stdout.splitlines() if ln.startswith(MARKER)]
        assert len(lines) == 1, out
        _CACHE[key] = {**json.loads(lines[0]), "_output": out}
    return _CACHE[key]


def test_stock_dflash2_has_no_lookup(pristine_cpu_tree: Path) -> None:
    assert _probe(pristine_cpu_tree, "adaptive")["patched"] is False
    assert not (pristine_cpu_tree / "vllm/v1/worker/gpu/spec_decode/dflash2/lookup.py").exists()


def test_lookup_tokens_replace_drafted_ones_and_the_drafter_keeps_the_rest(
    patched_cpu_tree: Path,
) -> None:
    got = _probe(patched_cpu_tree, "adaptive")
    assert got["lookup"] and got["adaptive"]
    period, copying = got["copying"]["drafts"]
    # State 2 repeats every 10 tokens: 10 lookup tokens, then the drafter's (gotcha 26).
    assert period == [*range(500, 510), *[DRAFTER] * 5]
    # State 0 is 20 tokens into a copy of DOC (100..159): the next 15 of it.
    assert copying == list(range(120, 135))
    assert got["plain"]["drafts"] == [[DRAFTER] * K]
    # A prefill chunk's row (nothing sampled) and a dummy run are left alone.
    assert got["prefill_row"]["drafts"] == [[DRAFTER] * K] * 2
    assert got["dummy"]["drafts"] == [[DRAFTER] * K]


def test_the_runner_hands_the_scheduler_the_adaptive_count(patched_cpu_tree: Path) -> None:
    got = _probe(patched_cpu_tree, "adaptive")
    assert got["plain"]["scheduled"] == [7]
    assert got["copying"]["scheduled"] == [K, K]  # batch-wide: both rows get the long block
    assert got["plain_again"]["scheduled"] == [7]  # nothing held from the copying step
    assert got["prefill_row"]["scheduled"] == [7, 7]


def test_lookup_off_is_stock(patched_cpu_tree: Path) -> None:
    got = _probe(patched_cpu_tree, "off", lookup="0")
    assert not got["lookup"]
    for step in ("plain", "copying", "prefill_row"):
        assert all(row == [DRAFTER] * K for row in got[step]["drafts"]), step
        assert set(got[step]["scheduled"]) == {K}, step


def test_async_scheduling_keeps_the_lookup_and_drops_the_adaptive_block(
    patched_cpu_tree: Path,
) -> None:
    got = _probe(patched_cpu_tree, "async")
    assert got["lookup"] and not got["adaptive"]
    assert "--no-async-scheduling" in got["_output"]
    assert got["copying"]["drafts"][1] == list(range(120, 135))
    assert got["plain"]["scheduled"] == [K]


def test_probabilistic_draft_sampling_is_refused_naming_the_fix(patched_cpu_tree: Path) -> None:
    err = _probe(patched_cpu_tree, "probabilistic")["init_error"]
    assert "VLLM_DFLASH2_LOOKUP=1" in err and "probabilistic" in err and "LOOKUP=0" in err
