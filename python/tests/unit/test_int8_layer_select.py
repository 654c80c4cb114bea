"""The resolver's rows for int8 activations on a layer subset (issue 23; gotchas 5, 16): the
batch default INT8_LAYERS=mlp on a build of this repository's series, the capability gate on a
build without int8-layer-select.patch, and the mixed set refused before boot."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen3090.errors import Qwen3090Error
from qwen3090.resolver.int8_layers import layer_prefixes, selected
from tests.support.planning import plan_for, series_caps

pytestmark = pytest.mark.unit

PATCH = "int8-layer-select.patch"
BATCH = {"PROFILE": "batch"}


def test_the_series_build_emits_the_batch_default(tmp_path: Path) -> None:
    plan = plan_for({}, cli=BATCH, caps=series_caps(), cwd=tmp_path)
    assert plan.env["VLLM_MARLIN_INPUT_DTYPE"] == "int8"
    assert plan.env["VLLM_MARLIN_INT8_INCLUDE_RE"] == "mlp"
    assert not [w for w in plan.warnings if "int8" in w]


def test_the_default_selects_the_27b_mlps_only() -> None:
    assert selected("mlp") == {"mlp": (128, 128), "linear_attn": (0, 144), "self_attn": (0, 32)}
    assert selected(".") == {kind: (len(n), len(n)) for kind, n in layer_prefixes().items()}


def test_without_the_patch_the_default_is_dropped_and_an_explicit_set_is_an_error(
    tmp_path: Path,
) -> None:
    caps = series_caps(without=PATCH)
    plan = plan_for({}, cli=BATCH, caps=caps, cwd=tmp_path)
    assert "VLLM_MARLIN_INPUT_DTYPE" not in plan.env
    assert "VLLM_MARLIN_INT8_INCLUDE_RE" not in plan.env
    assert [w for w in plan.warnings if "int8 activations are OFF" in w]
    with pytest.raises(Qwen3090Error) as err:
        plan_for({"INT8_LAYERS": "gate_up"}, cli=BATCH, caps=caps, cwd=tmp_path)
    assert err.value.message.startswith("INT8_LAYERS=gate_up ")
    assert f"patches/{PATCH}" in err.value.message
    assert err.value.fix and "--manifest" in err.value.fix


@pytest.mark.parametrize("layers", ["mlp|linear_attn", "linear_attn|mlp", "linear_attn",
                                    r"(mlp|linear_attn)\.", "layers\\.0\\."])
def test_int8_gdn_beside_16_bit_attention_is_refused(layers: str, tmp_path: Path) -> None:
    with pytest.raises(Qwen3090Error) as err:
        plan_for({"INT8_LAYERS": layers}, cli=BATCH, caps=series_caps(), cwd=tmp_path)
    message = err.value.message
    assert message.startswith(f"INT8_LAYERS={layers} (from the environment) ")
    assert "linear_attn" in message and "self_attn" in message and "gotcha 5" in message
    assert err.value.fix and "INT8_LAYERS=mlp" in err.value.fix


def test_the_refusal_holds_in_single_user_too(tmp_path: Path) -> None:
    with pytest.raises(Qwen3090Error, match="Gated DeltaNet"):
        plan_for({"INT8_ACT": "int8", "INT8_LAYERS": "mlp|linear_attn"}, caps=series_caps(),
                 cwd=tmp_path)


@pytest.mark.parametrize("layers", ["mlp", "gate_up", ".", "mlp|linear_attn|self_attn",
                                    "self_attn"])
def test_sets_without_the_mixed_gdn_are_planned(layers: str, tmp_path: Path) -> None:
    plan = plan_for({"INT8_LAYERS": layers, "GPU_UTIL": "0.95"}, cli=BATCH,
                    caps=series_caps(), cwd=tmp_path)
    assert plan.env["VLLM_MARLIN_INT8_INCLUDE_RE"] == layers
    assert plan.env["VLLM_MARLIN_INPUT_DTYPE"] == "int8"


def test_int8_off_skips_the_check(tmp_path: Path) -> None:
    plan = plan_for({"INT8_ACT": "", "INT8_LAYERS": "mlp|linear_attn"}, cli=BATCH,
                    caps=series_caps(), cwd=tmp_path)
    assert "VLLM_MARLIN_INPUT_DTYPE" not in plan.env


def test_a_set_selecting_no_layer_is_warned(tmp_path: Path) -> None:
    plan = plan_for({"INT8_LAYERS": "mpl"}, cli=BATCH, caps=series_caps(), cwd=tmp_path)
    assert [w for w in plan.warnings if w.startswith("INT8_LAYERS=mpl selects none")]

