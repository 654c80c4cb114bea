"""Probe for register-envs: is each series knob known to vllm.envs, typed, and in the key?

Prints, for VLLM_SPEC_DECODE_ATTN=1: whether ``validate_environ(True)`` raises, and whether
``hash_factors(compile_factors())`` changes when the value flips; then, per knob, the parsed
value of a sample setting (or None where vLLM does not know it) and whether flipping it
changes the compile hash.
"""

from __future__ import annotations

import os
from typing import Any

from _result import report

# knob -> (a non-default value, another non-default value)
SAMPLES = {
    "VLLM_SPEC_DECODE_ATTN": ("1", "0"),
    "VLLM_SPEC_DECODE_ATTN_QMAX": ("8", "16"),
    "VLLM_V2_CUDAGRAPH_MEM_MIB": ("1400", "1900"),
    "VLLM_MARLIN_INT8_INCLUDE_RE": ("mlp", "gate_up"),
    "VLLM_MAMBA_ALIGN_KEEP_CHECKPOINTS": ("0", "1"),
    "VLLM_DFLASH2_LOOKUP": ("1", "0"),
    "VLLM_DFLASH2_LOOKUP_ADAPTIVE": ("0", "1"),
}


def main() -> None:
    from vllm import envs
    from vllm.config.utils import hash_factors

    def compile_hash() -> str:
        return str(hash_factors(envs.compile_factors()))

    for name in SAMPLES:
        os.environ.pop(name, None)
    os.environ["VLLM_SPEC_DECODE_ATTN"] = "1"
    try:
        envs.validate_environ(True)
        validate_error = None
    except ValueError as exc:
        validate_error = str(exc)
    os.environ.pop("VLLM_SPEC_DECODE_ATTN")

    knobs: dict[str, dict[str, Any]] = {}
    for name, (first, second) in SAMPLES.items():
        os.environ[name] = first
        value = getattr(envs, name, None)
        first_hash = compile_hash()
        os.environ[name] = second
        second_hash = compile_hash()
        os.environ.pop(name)
        default = getattr(envs, name, None)
        knobs[name] = {
            "value": value,
            "type": type(value).__name__,
            "default": default,
            "hash_changes": first_hash != second_hash,
        }
    report({"validate_error": validate_error, "knobs": knobs})


if __name__ == "__main__":
    main()
