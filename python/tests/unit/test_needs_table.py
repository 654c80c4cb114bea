"""The table of what each emitted variable and flag value needs (``capabilities.EMITTED``)
against the patch series: a ``provided_by`` names a patch of ``patches/`` whose header provides
it, and a capability no patch here provides says so in its error, with something to do
instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen3090.capabilities import EMITTED, NEEDS, NOT_IN_REPOSITORY, missing_error
from qwen3090.patchtool import Patch, load_series
from tests.support.planning import FULL, STOCK, plan_for

pytestmark = pytest.mark.unit

PATCHES = Path(__file__).resolve().parents[3] / "patches"


@pytest.fixture(scope="module")
def series() -> dict[str, Patch]:
    return {p.file: p for p in load_series(PATCHES).patches}


def _provides(patch: Patch, kind: str, name: str) -> bool:
    if kind == "env":
        return name in patch.header.env
    value = name.partition("=")[2]
    if name in patch.header.flags or value in patch.header.flags:
        return True
    # A flag value may be provided as a feature, as Capabilities.has reads a manifest.
    need = NEEDS.get(name)
    return need is not None and need.feature in patch.header.features


def test_every_provided_by_is_a_patch_whose_header_provides_it(series: dict[str, Patch]) -> None:
    named = [n for n in EMITTED if n.provided_by is not None]
    assert named, "the series provides some of what plans emit"
    for need in named:
        assert need.provided_by in series, f"{need.name}: no patches/{need.provided_by} in series"
        patch = series[need.provided_by]
        assert _provides(patch, need.kind, need.name), f"{patch.file} does not provide {need.name}"
        assert need.feature in patch.header.features, f"{patch.file} lacks {need.feature}"


def test_no_need_says_missing_that_a_patch_here_provides(series: dict[str, Patch]) -> None:
    for need in NEEDS.values():
        if need.provided_by is None:
            assert not [p.file for p in series.values() if _provides(p, need.kind, need.name)]


def test_stock_rows_name_no_patch() -> None:
    for need in EMITTED:
        if need.feature is None:
            assert need.provided_by is None and need.name not in NEEDS


@pytest.mark.parametrize("name", sorted(NEEDS))
def test_missing_capability_error_says_where_it_comes_from(name: str) -> None:
    need = NEEDS[name]
    err = missing_error(need, "KNOB", "value", STOCK)
    assert err.fix is not None
    assert err.message.startswith("KNOB=value ")
    assert "--knob" in err.fix
    if need.provided_by is None:
        assert NOT_IN_REPOSITORY in err.message
        assert need.instead and need.instead in err.fix
    else:
        assert f"patches/{need.provided_by}" in err.message
        assert need.provided_by in err.fix and "--manifest" in err.fix


@pytest.mark.parametrize("profile", ["single-user", "batch"])
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_every_variable_a_plan_sets_is_in_the_table(
    profile: str, device: str, tmp_path: Path
) -> None:
    names = {n.name for n in EMITTED if n.kind == "env"}
    combos = [{"SPEC": s, "CTX": c} for s in ("mtp", "off") for c in ("fast", "long", "huge")]
    combos += [{"SPEC": "dflash2", "CTX": c, "DFLASH_TOKENS": "15", "PREFIX_CACHE": "1"}
               for c in ("fast", "long", "huge")] if device == "cuda" else []
    combos += [{"KV": kv, "VISION": "1", "INT8_ACT": "int8"} for kv in ("fp8", "int4pth", "kvarn")]
    seen: set[str] = set()
    for env in combos:
        if profile == "batch":
            env = {k: v for k, v in env.items() if k not in {"SPEC", "CTX", "DFLASH_TOKENS"}}
        plan = plan_for(env, cli={"PROFILE": profile, "DEVICE": device}, caps=FULL, cwd=tmp_path)
        assert set(plan.env) <= names, set(plan.env) - names
        seen |= set(plan.env)
    if device == "cpu":
        assert not seen & {n.name for n in EMITTED if n.gpu_only}
