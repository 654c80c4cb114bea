"""benchmarks/int8_ws_timeline.py (issue 21): the copy of the int8 candidate it times carries
a timer read in every slot it names, parses as Python, and leaves the candidate's file alone;
a candidate reshaped so that an edit no longer fits is refused by name, not timed at the
wrong places. Compiling the copy for sm_90a is the patch tier's."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.modules import load_module

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "int8_ws_timeline.py"


@pytest.fixture(scope="module")
def timeline() -> ModuleType:
    return load_module(SCRIPT, "int8_ws_timeline_unit")


def test_every_slot_gets_one_timer_read(timeline: ModuleType) -> None:
    before = timeline.CANDIDATE.read_text()
    text = timeline.instrumented_source(before)
    ast.parse(text)
    assert timeline.CANDIDATE.read_text() == before
    slots = sorted(int(m or 0) for m in re.findall(r"gl\.store\(tlb(?: \+ (\d))?, _now\(\)\)",
                                                    text))
    assert slots == list(range(len(timeline.SLOTS))) == list(range(8))
    # Each partition that stores a slot is handed the program's slot base.
    for fn in ("_loader8", "_widener8", "_consume8"):
        assert f"def {fn}(tlb, " in text
        assert f"({fn}, (tlb, " in text


def test_a_reshaped_candidate_is_refused_by_name(timeline: ModuleType) -> None:
    text = timeline.CANDIDATE.read_text()
    reshaped = text.replace("    seq = pid\n    tile_q0 = 0\n", "    seq = pid + 0\n")
    assert reshaped != text
    with pytest.raises(ValueError, match="seq = pid"):
        timeline.instrumented_source(reshaped)


def test_series_flags_are_candidate_globals_and_only_for_one_warpgroup(
        timeline: ModuleType) -> None:
    # --series sets these as the candidate's module globals before it compiles: a name the
    # candidate no longer declares would be set and read by nothing.
    text = timeline.CANDIDATE.read_text()
    flags = timeline.series_globals(8)
    assert flags
    for name in flags:
        assert re.search(rf"^{name} = gl\.constexpr\(", text, re.M), name
    assert timeline.series_globals(10) == flags
    # Two consumer warpgroups (q x G > 64) keep the candidate's defaults, as the series does.
    assert timeline.series_globals(11) == timeline.series_globals(16) == {}
