"""Issue 19, items 1-2: every inherited ``VLLM_*`` / ``KVARN_*`` variable either acts or is
refused, and the plan never replaces a user's value silently (serve's environment check)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen3090.capabilities import Capabilities
from qwen3090.errors import Qwen3090Error
from qwen3090.serve import check_environment
from qwen3090.vllm_envs import SERIES_REGISTERED, STOCK_VLLM_ENV, environment_problems
from tests.support.planning import FULL, STOCK, plan_for

pytestmark = pytest.mark.unit

DFLASH = {"SPEC": "dflash2"}


def _refused(knobs: dict[str, str], environ: dict[str, str], tmp_path: Path,
             caps: Capabilities = FULL) -> str:
    plan = plan_for(knobs, caps=caps, cwd=tmp_path)
    with pytest.raises(Qwen3090Error) as info:
        check_environment(plan, caps, environ)
    return info.value.message


def test_a_user_graph_reservation_is_refused_not_replaced(tmp_path: Path) -> None:
    text = _refused(DFLASH, {"VLLM_V2_CUDAGRAPH_MEM_MIB": "2600"}, tmp_path)
    assert "VLLM_V2_CUDAGRAPH_MEM_MIB='2600' from the environment conflicts" in text
    assert "'1400'" in text and "GRAPH_MEM_MIB" in text


def test_the_same_value_through_the_knob_passes(tmp_path: Path) -> None:
    plan = plan_for({**DFLASH, "GRAPH_MEM_MIB": "2600"}, cwd=tmp_path)
    check_environment(plan, FULL, {"VLLM_V2_CUDAGRAPH_MEM_MIB": "2600"})


@pytest.mark.parametrize(
    ("name", "knob"),
    [("VLLM_DFLASH2_LOOKUP", "LOOKUP"), ("VLLM_MARLIN_INPUT_DTYPE", "INT8_ACT"),
     ("VLLM_MARLIN_INT8_INCLUDE_RE", "INT8_LAYERS"), ("VLLM_SPEC_DECODE_ATTN", "SPEC_ATTN")],
)
def test_a_variable_a_knob_owns_names_the_knob(name: str, knob: str, tmp_path: Path) -> None:
    # CTX=long under mtp sets none of these, so each one would act behind the plan's back.
    text = _refused({"CTX": "long"}, {name: "1"}, tmp_path)
    assert f"{name}='1' from the environment" in text and f"through {knob}" in text


@pytest.mark.parametrize("name", ["VLLM_DFLASH2_LOOKUP_STICKY", "VLLM_DFLASH2_LOOKUP_CHEAP_CTX",
                                  "VLLM_NO_SUCH_KNOB", "KVARN_SOMETHING",
                                  "KVARN_POOL_MEM_FRAC"])
def test_a_variable_nothing_reads_is_refused(name: str, tmp_path: Path) -> None:
    text = _refused({}, {name: "1"}, tmp_path)
    assert f"does not read {name}" in text


def test_a_series_variable_needs_its_patch(tmp_path: Path) -> None:
    # Registered by register-envs, but read only where its patch is applied.
    environ = {"VLLM_MAMBA_ALIGN_KEEP_CHECKPOINTS": "0"}
    text = _refused({}, environ, tmp_path, caps=STOCK)
    assert "does not read VLLM_MAMBA_ALIGN_KEEP_CHECKPOINTS" in text
    reader = Capabilities(env=frozenset({"VLLM_MAMBA_ALIGN_KEEP_CHECKPOINTS"}))
    assert environment_problems({}, environ, reader) == []


def test_stock_variables_and_others_pass(tmp_path: Path) -> None:
    plan = plan_for({}, cwd=tmp_path)
    environ = {"VLLM_LOGGING_LEVEL": "DEBUG", "VLLM_API_KEY": "k", "VLLM_CACHE_ROOT": "/c",
               "HOME": "/h", "CUDA_VISIBLE_DEVICES": "1",
               "VLLM_USE_FLASHINFER_SAMPLER": plan.env["VLLM_USE_FLASHINFER_SAMPLER"]}
    check_environment(plan, FULL, environ)


def test_a_conflicting_allocator_setting_is_refused(tmp_path: Path) -> None:
    text = _refused({}, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}, tmp_path)
    assert "PYTORCH_CUDA_ALLOC_CONF" in text and "conflicts" in text


def test_every_problem_is_listed_at_once(tmp_path: Path) -> None:
    text = _refused(DFLASH, {"VLLM_V2_CUDAGRAPH_MEM_MIB": "2600", "VLLM_DFLASH2_LOOKUP": "0",
                             "VLLM_NOPE": "1"}, tmp_path)
    assert text.count("\n  - ") == 3


def test_the_tables_know_the_series_and_stock_names() -> None:
    assert "VLLM_LOGGING_LEVEL" in STOCK_VLLM_ENV
    assert not SERIES_REGISTERED & STOCK_VLLM_ENV
    # Registered for dflash2-lookup.patch, which reads it (issue 22).
    assert "VLLM_DFLASH2_LOOKUP" in SERIES_REGISTERED


def test_a_variable_the_plan_alone_decides_is_refused_where_it_leaves_it_out(
    tmp_path: Path,
) -> None:
    plan = plan_for(cli={"DEVICE": "cpu"}, cwd=tmp_path)
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in plan.env
    with pytest.raises(Qwen3090Error) as info:
        check_environment(plan, FULL, {"VLLM_USE_FLASHINFER_SAMPLER": "1"})
    assert "the plan alone decides it" in info.value.message
