"""Every single-user row with a speculator either takes the split-KV verify path or the plan
says why not: VLLM_SPEC_DECODE_ATTN=1 is emitted only for a KV cache the series' kernels read
(issue 21; the kernel's own list is read from the overlay file the series adds to vLLM)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from qwen3090 import profiles as P
from qwen3090.errors import Qwen3090Error
from tests.support.planning import arg_map, plan_for

pytestmark = pytest.mark.unit

OVERLAY = (Path(__file__).resolve().parents[3] / "patches" / "overlay" / "vllm" / "v1"
           / "attention" / "ops" / "spec_decode_attention.py")
# The backends whose impls the spec-decode-attn patch hooks.
HOOKED_BACKENDS = {"FLASH_ATTN", "TRITON_ATTN"}


def kernel_kv_dtypes() -> tuple[str, ...]:
    """SUPPORTED_KV_CACHE_DTYPES as the overlay file declares it."""
    for node in ast.parse(OVERLAY.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "SUPPORTED_KV_CACHE_DTYPES"
            for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            assert isinstance(value, tuple)
            return tuple(str(v) for v in value)
    raise AssertionError(f"{OVERLAY.name} declares no SUPPORTED_KV_CACHE_DTYPES")


def test_planner_and_kernel_agree_on_the_kv_dtypes() -> None:
    assert set(P.SPEC_ATTN_KV_DTYPES) == set(kernel_kv_dtypes())


SPECULATOR_ROWS = [(spec, ctx) for (spec, ctx) in P.SINGLE_USER_CACHE if spec != "off"]


@pytest.mark.parametrize(("spec", "ctx"), SPECULATOR_ROWS, ids=lambda v: str(v))
def test_split_path_taken_or_declined_aloud(spec: str, ctx: str, tmp_path: Path) -> None:
    row = P.SINGLE_USER_CACHE[(spec, ctx)]  # type: ignore[index]
    plan = plan_for({"SPEC": spec, "CTX": ctx}, cwd=tmp_path)
    on = plan.env.get("VLLM_SPEC_DECODE_ATTN") == "1"
    dtype = arg_map(plan.vllm_args).get("--kv-cache-dtype") or "auto"
    backend = arg_map(plan.vllm_args).get("--attention-backend")
    declined = [w for w in plan.warnings if "split-KV verify attention off" in w]
    if on:
        assert dtype in kernel_kv_dtypes(), (spec, ctx, dtype)
        assert backend in HOOKED_BACKENDS, (spec, ctx, backend)
        assert "VLLM_SPEC_DECODE_ATTN_QMAX" in plan.env or spec == "mtp"
    elif row.spec_attn == "knob":
        # The row wants the path; the only reason to go without is a cache it cannot read.
        assert dtype not in kernel_kv_dtypes(), (spec, ctx, dtype)
        assert declined and dtype in declined[0], plan.warnings
        assert "VLLM_SPEC_DECODE_ATTN_QMAX" not in plan.env


def test_the_int8_long_context_row_takes_the_split_path(tmp_path: Path) -> None:
    plan = plan_for({"SPEC": "dflash2", "CTX": "long"}, cwd=tmp_path)
    assert arg_map(plan.vllm_args).get("--kv-cache-dtype") == "int8_per_token_head"
    assert plan.env.get("VLLM_SPEC_DECODE_ATTN") == "1", plan.env
    assert "VLLM_SPEC_DECODE_ATTN_QMAX" in plan.env


def test_an_explicit_request_on_an_unreadable_cache_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A build whose kernels read only 16-bit caches (this series before issue 21): the
    # int8 row is the one left without the split path.
    monkeypatch.setattr(P, "SPEC_ATTN_KV_DTYPES", ("auto", "bfloat16", "float16"))
    with pytest.raises(Qwen3090Error) as err:
        plan_for({"SPEC": "dflash2", "CTX": "long", "SPEC_ATTN": "1"}, cwd=tmp_path)
    assert "int8_per_token_head" in str(err.value)
    assert "unset SPEC_ATTN" in (err.value.fix or "")
