"""register-envs (gotcha 5): the series' knobs are vLLM environment variables with typed
parsers, and each one that can change a traced graph is part of the compile cache key.
Issue 19: it registers only what a patch reads, and ``qwen3090.vllm_envs`` knows the names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from qwen3090.vllm_envs import SERIES_REGISTERED, STOCK_VLLM_ENV
from tests.support.patchprobe import Tree

pytestmark = pytest.mark.patch

PATCH = Path(__file__).resolve().parents[3] / "patches" / "register-envs.patch"

EXPECTED_VALUES = {
    "VLLM_SPEC_DECODE_ATTN": True,
    "VLLM_SPEC_DECODE_ATTN_QMAX": 8,
    "VLLM_V2_CUDAGRAPH_MEM_MIB": 1400,
    "VLLM_MARLIN_INT8_INCLUDE_RE": "mlp",
    "VLLM_MAMBA_ALIGN_KEEP_CHECKPOINTS": False,
    "VLLM_DFLASH2_LOOKUP": True,
    "VLLM_DFLASH2_LOOKUP_ADAPTIVE": False,
}
# Unset values. Kept checkpoints default on: on a multi-turn test they turned 0 cached tokens
# into ~3200 (issue 19).
EXPECTED_DEFAULTS = {
    "VLLM_SPEC_DECODE_ATTN": False,
    "VLLM_SPEC_DECODE_ATTN_QMAX": 16,
    "VLLM_V2_CUDAGRAPH_MEM_MIB": 0,
    "VLLM_MARLIN_INT8_INCLUDE_RE": None,
    "VLLM_MAMBA_ALIGN_KEEP_CHECKPOINTS": True,
    "VLLM_DFLASH2_LOOKUP": False,
    "VLLM_DFLASH2_LOOKUP_ADAPTIVE": True,
}
# Reserving memory beside the KV cache changes no traced graph, and the lookup runs as eager
# code after the draft graph; keying on them would only throw away warm compile caches when
# they are tuned.
OUT_OF_COMPILE_KEY = {"VLLM_V2_CUDAGRAPH_MEM_MIB", "VLLM_DFLASH2_LOOKUP",
                      "VLLM_DFLASH2_LOOKUP_ADAPTIVE"}


def _registry(envs_py: Path) -> set[str]:
    """The keys of ``environment_variables`` in a vllm/envs.py."""
    for node in ast.walk(ast.parse(envs_py.read_text())):
        if not isinstance(node, ast.Assign | ast.AnnAssign):
            continue
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        if (isinstance(target, ast.Name) and target.id == "environment_variables"
                and isinstance(node.value, ast.Dict)):
            return {k.value for k in node.value.keys
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    raise AssertionError(f"no environment_variables dict in {envs_py}")


def _readers(tree: Path, name: str) -> list[Path]:
    """Files of the tree outside vllm/envs.py (and the series' own copies) naming ``name``."""
    word = re.compile(rf"\b{re.escape(name)}\b")
    envs = tree / "vllm" / "envs.py"
    return [p for p in (tree / "vllm").rglob("*.py")
            if p != envs and "_qwen3090" not in p.parts and word.search(p.read_text())]


def test_spec_decode_attn_is_a_known_keyed_variable(tree: Tree) -> None:
    result = tree.probe("envs_probe")
    attn = result["knobs"]["VLLM_SPEC_DECODE_ATTN"]
    if tree.patched:
        assert result["validate_error"] is None
        assert attn["hash_changes"] is True
    else:
        assert "Unknown vLLM environment variable" in result["validate_error"]
        assert attn["hash_changes"] is False


def test_every_knob_parses_typed_and_keys_the_compile_cache(tree: Tree) -> None:
    knobs = tree.probe("envs_probe")["knobs"]
    for name, expected in EXPECTED_VALUES.items():
        knob = knobs[name]
        if not tree.patched:
            assert knob["value"] is None, f"stock vLLM 0.28.0 already knows {name}"
            assert knob["hash_changes"] is False
            continue
        assert knob["value"] == expected, name
        assert knob["type"] == type(expected).__name__, name
        assert knob["default"] == EXPECTED_DEFAULTS[name], name
        assert knob["hash_changes"] is (name not in OUT_OF_COMPILE_KEY), name


def test_every_registered_variable_is_read(
    pristine_cpu_tree: Path, patched_cpu_tree: Path
) -> None:
    added = (_registry(patched_cpu_tree / "vllm" / "envs.py")
             - _registry(pristine_cpu_tree / "vllm" / "envs.py"))
    unread = {name for name in added if not _readers(patched_cpu_tree, name)}
    assert unread == set(), "registered, but nothing reads them"
    assert added == set(EXPECTED_VALUES)


def test_the_serve_tables_match_the_trees(
    pristine_cpu_tree: Path, patched_cpu_tree: Path
) -> None:
    stock = _registry(pristine_cpu_tree / "vllm" / "envs.py")
    assert {n for n in stock if n.startswith(("VLLM_", "KVARN_"))} <= STOCK_VLLM_ENV
    # The rest of STOCK_VLLM_ENV: names stock code reads directly, each really read there.
    for name in STOCK_VLLM_ENV - stock:
        assert _readers(pristine_cpu_tree, name), name
    added = _registry(patched_cpu_tree / "vllm" / "envs.py") - stock
    assert added == SERIES_REGISTERED
    header = re.search(r"^# registers: (.*)$", PATCH.read_text(), re.MULTILINE)
    assert header is not None and set(header.group(1).split()) == SERIES_REGISTERED
