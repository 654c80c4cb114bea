"""Golden plans: every row of PROFILES.md's tables, asserted flag by flag.

The expected values below are transcribed from PROFILES.md independently of
``qwen3090.profiles``; a plan must match them exactly (no flag more, none less).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.planning import arg_map, plan_for

pytestmark = pytest.mark.unit

COMMON_FLAGS: dict[str, str | None] = {
    "--served-model-name": "qwen3.8-27b",
    "--host": "127.0.0.1",
    "--port": "18020",
    "--api-server-count": "1",
    "--language-model-only": None,
    "--max-num-batched-tokens": "2048",
    "--mamba-ssm-cache-dtype": "float16",
    "--enable-prompt-tokens-details": None,
    "--reasoning-parser": "qwen3",
    "--enable-auto-tool-choice": None,
    "--tool-call-parser": "qwen3_coder",
}
COMMON_ENV = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
}
CUSTOM_OPS = ["+rms_norm", "+silu_and_mul"]
DEFAULT_DRAFT = "models/Qwen3.8-27B-DFlash2-W4A16"


def _prefix(flags: dict[str, str | None], on: bool, huge: bool) -> None:
    if on:
        flags["--enable-prefix-caching"] = None
        flags["--mamba-cache-mode"] = "align"
        if huge:
            flags["--prefix-match-unit"] = "128"
    else:
        flags["--no-enable-prefix-caching"] = None


def expected_single_user(
    ctx: str, spec: str, k: int | None, prefix: bool
) -> tuple[dict[str, str | None], dict[str, str]]:
    """PROFILES.md "Single-user mode", by hand."""
    flags = dict(COMMON_FLAGS)
    env = dict(COMMON_ENV)
    ctx_len = {"fast": 65536, "long": 150000, "huge": 200000}[ctx]
    mtp_k = {"fast": 4, "long": 3, "huge": 3}[ctx]
    if ctx == "fast":
        flags["--attention-backend"] = "FLASH_ATTN"
        flags["--kv-cache-dtype"] = "bfloat16"
        env["VLLM_SPEC_DECODE_ATTN"] = "1"
    elif ctx == "long":
        flags["--kv-cache-dtype"] = "fp8"
    else:
        flags["--kv-cache-dtype"] = "kvarn_k4v2_g128"
        flags["--block-size"] = "128"
    _prefix(flags, prefix, ctx == "huge")
    compilation: dict[str, object]
    if spec == "dflash2":
        assert k is not None
        long_block = k > 7
        seqs, max_len, kv_mem = {
            "fast": (4 if long_block else 8, 57344 if long_block else 65536, 5583457484),
            "long": (4, 131072, 5583457484),
            "huge": (2, 221184 if long_block else 245760, 5261334938),
        }[ctx]
        flags["--max-num-seqs"] = str(seqs)
        flags["--max-model-len"] = str(max_len)
        flags["--kv-cache-memory-bytes"] = str(kv_mem)
        flags["--speculative-config"] = json.dumps(
            {"method": "dflash", "model": DEFAULT_DRAFT, "num_speculative_tokens": k},
            separators=(",", ":"),
        )
        env["VLLM_SPEC_DECODE_ATTN_QMAX"] = str(k + 1)
        env["VLLM_DFLASH2_LOOKUP"] = "1"
        env["VLLM_V2_CUDAGRAPH_MEM_MIB"] = "1900" if long_block else "1400"
        if ctx == "long":
            flags["--attention-backend"] = "TRITON_ATTN"
            flags["--kv-cache-dtype"] = "int8_per_token_head"
            # The split-KV verify path: its Triton split pass reads int8 per-token-head
            # caches (issue 21), so the row keeps the original launcher's 1 and its QMAX.
            env["VLLM_SPEC_DECODE_ATTN"] = "1"
        if ctx == "huge":
            env["VLLM_SPEC_DECODE_ATTN"] = "0"
            if long_block and prefix:
                env["VLLM_DFLASH2_LOOKUP_ADAPTIVE"] = "0"
        if long_block:
            flags["--no-async-scheduling"] = None
        else:
            flags["--async-scheduling"] = None
        compilation = {"max_cudagraph_capture_size": min(seqs * (k + 1), 64),
                       "custom_ops": CUSTOM_OPS}
    else:
        flags["--max-num-seqs"] = "8"
        flags["--max-model-len"] = str(ctx_len)
        flags["--gpu-memory-utilization"] = "0.93"
        if spec == "mtp":
            flags["--speculative-config"] = json.dumps(
                {"method": "mtp", "num_speculative_tokens": mtp_k,
                 "draft_sample_method": "probabilistic"},
                separators=(",", ":"),
            )
        compilation = {"max_cudagraph_capture_size": 32, "custom_ops": CUSTOM_OPS}
        if ctx == "huge":
            compilation["cudagraph_mode"] = "PIECEWISE"
    flags["--compilation-config"] = json.dumps(compilation, separators=(",", ":"))
    return flags, env


SINGLE_USER_ROWS = [
    (ctx, spec, k, prefix)
    for ctx in ("fast", "long", "huge")
    for spec, k in (("mtp", None), ("off", None), ("dflash2", 7), ("dflash2", 15))
    for prefix in (False, True)
]


@pytest.mark.parametrize(("ctx", "spec", "k", "prefix"), SINGLE_USER_ROWS)
def test_single_user_rows(
    ctx: str, spec: str, k: int | None, prefix: bool, tmp_path: Path
) -> None:
    env = {"CTX": ctx, "SPEC": spec, "PREFIX_CACHE": "1" if prefix else "0"}
    if k is not None:
        env["DFLASH_TOKENS"] = str(k)
    plan = plan_for(env, cwd=tmp_path)
    flags, want_env = expected_single_user(ctx, spec, k, prefix)
    got = arg_map(plan.vllm_args)
    assert plan.vllm_args[0] == "models/Qwen3.8-27B-W4A16-AutoRound"
    for flag in sorted(set(got) | set(flags)):
        assert got.get(flag, "<absent>") == flags.get(flag, "<absent>"), flag
    assert dict(plan.env) == want_env
    assert plan.profile == "single-user"


def expected_batch(kv: str, int8: bool) -> tuple[dict[str, str | None], dict[str, str]]:
    """PROFILES.md "Batch mode", by hand."""
    flags = dict(COMMON_FLAGS)
    env = dict(COMMON_ENV)
    flags["--max-num-seqs"] = "64"
    flags["--async-scheduling"] = None
    flags["--no-enable-prefix-caching"] = None
    flags["--compilation-config"] = json.dumps(
        {"max_cudagraph_capture_size": 64, "custom_ops": CUSTOM_OPS}, separators=(",", ":")
    )
    if kv == "fp8":
        flags.update({"--max-model-len": "150000", "--gpu-memory-utilization": "0.972",
                      "--kv-cache-dtype": "fp8"})
    elif kv == "int4pth":
        flags.update({"--max-model-len": "262144", "--gpu-memory-utilization": "0.93",
                      "--kv-cache-dtype": "int4_per_token_head",
                      "--attention-backend": "TRITON_ATTN"})
    else:
        flags.update({"--max-model-len": "262144", "--gpu-memory-utilization": "0.93",
                      "--kv-cache-dtype": "kvarn_k4v2_g128", "--block-size": "128"})
    if int8:
        env["VLLM_MARLIN_INPUT_DTYPE"] = "int8"
        env["VLLM_MARLIN_INT8_INCLUDE_RE"] = "mlp"
    return flags, env


@pytest.mark.parametrize("kv", ["fp8", "int4pth", "kvarn"])
@pytest.mark.parametrize("int8", [True, False])
def test_batch_rows(kv: str, int8: bool, tmp_path: Path) -> None:
    env = {"KV": kv}
    if not int8:
        env["INT8_ACT"] = ""  # empty means off (and the variable is not exported)
    plan = plan_for(env, cli={"PROFILE": "batch"}, cwd=tmp_path)
    assert plan.profile == "batch"
    flags, want_env = expected_batch(kv, int8)
    got = arg_map(plan.vllm_args)
    for flag in sorted(set(got) | set(flags)):
        assert got.get(flag, "<absent>") == flags.get(flag, "<absent>"), flag
    assert dict(plan.env) == want_env


def test_default_plan_literally(tmp_path: Path) -> None:
    """The plan a bare `qwen3090 plan` prints on a fully patched build, as one literal list."""
    plan = plan_for({}, cwd=tmp_path)
    assert list(plan.vllm_args) == [
        "models/Qwen3.8-27B-W4A16-AutoRound",
        "--served-model-name", "qwen3.8-27b",
        "--host", "127.0.0.1",
        "--port", "18020",
        "--api-server-count", "1",
        "--language-model-only",
        "--max-model-len", "65536",
        "--max-num-seqs", "8",
        "--max-num-batched-tokens", "2048",
        "--gpu-memory-utilization", "0.93",
        "--attention-backend", "FLASH_ATTN",
        "--kv-cache-dtype", "bfloat16",
        "--mamba-ssm-cache-dtype", "float16",
        "--no-enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--speculative-config",
        '{"method":"mtp","num_speculative_tokens":4,"draft_sample_method":"probabilistic"}',
        "--compilation-config",
        '{"max_cudagraph_capture_size":32,"custom_ops":["+rms_norm","+silu_and_mul"]}',
        "--reasoning-parser", "qwen3",
        "--enable-auto-tool-choice",
        "--tool-call-parser", "qwen3_coder",
    ]
    assert dict(plan.env) == {**COMMON_ENV, "VLLM_SPEC_DECODE_ATTN": "1"}
    assert plan.warnings == ()
