"""register-envs (gotcha 5): the series' knobs are vLLM environment variables with typed
parsers, and each one that can change a traced graph is part of the compile cache key."""

from __future__ import annotations

import pytest
from patchprobe import Tree

pytestmark = pytest.mark.patch

EXPECTED_VALUES = {
    "VLLM_SPEC_DECODE_ATTN": True,
    "VLLM_SPEC_DECODE_ATTN_QMAX": 8,
    "VLLM_V2_CUDAGRAPH_MEM_MIB": 1400,
    "VLLM_MARLIN_INT8_INCLUDE_RE": "mlp",
    "VLLM_DFLASH2_LOOKUP": True,
    "VLLM_DFLASH2_LOOKUP_ADAPTIVE": False,
    "VLLM_DFLASH2_LOOKUP_STICKY": True,
    "VLLM_DFLASH2_LOOKUP_CHEAP_CTX": 4096,
    "VLLM_MAMBA_ALIGN_KEEP_CHECKPOINTS": True,
}
# Reserving memory beside the KV cache changes no traced graph; keying on it would only
# throw away warm compile caches when the reservation is tuned.
OUT_OF_COMPILE_KEY = {"VLLM_V2_CUDAGRAPH_MEM_MIB"}


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
        assert knob["hash_changes"] is (name not in OUT_OF_COMPILE_KEY), name
