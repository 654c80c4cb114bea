"""The CPU rule set: the same resolver, plus only what vLLM's CPU build cannot do, each a
warning. The facts behind the rules are checked against the installed CPU build in
e2e_cpu/test_cpu_facts.py; the whole CPU plan is served for real in e2e_cpu/test_e2e_cpu.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen3090.errors import Qwen3090Error
from qwen3090.profiles import CPU_POOL_BYTES, CPU_SSM_DTYPE
from tests.support.planning import FULL, STOCK, arg_map, json_flag, plan_for

CPU = {"DEVICE": "cpu"}


def _cpu_warnings(warnings: tuple[str, ...]) -> list[str]:
    return [w for w in warnings if w.startswith("CPU build: ")]


@pytest.mark.unit
@pytest.mark.parametrize("caps", [FULL, STOCK], ids=["patched", "stock"])
def test_cpu_plan_is_the_gpu_plan_minus_a_listed_set(caps: object, tmp_path: Path) -> None:
    knobs = {"PREFIX_CACHE": "1", "MODEL": "demo"}
    gpu = arg_map(plan_for(knobs, caps=FULL, cwd=tmp_path).vllm_args)
    cpu_plan = plan_for(knobs, cli=CPU, caps=caps, cwd=tmp_path)  # type: ignore[arg-type]
    cpu = arg_map(cpu_plan.vllm_args)
    changed = {f for f in set(gpu) | set(cpu) if gpu.get(f, "-") != cpu.get(f, "-")}
    assert changed == {
        "--speculative-config", "--attention-backend", "--mamba-ssm-cache-dtype",
        "--gpu-memory-utilization", "--kv-cache-memory-bytes", "--compilation-config",
    }
    assert cpu["--mamba-ssm-cache-dtype"] == CPU_SSM_DTYPE
    assert cpu["--kv-cache-memory-bytes"] == str(CPU_POOL_BYTES)
    assert cpu["--kv-cache-dtype"] == "bfloat16"
    assert json_flag(cpu_plan, "--compilation-config") == {
        "custom_ops": ["+rms_norm", "+silu_and_mul"]}
    assert cpu_plan.env == {}
    warnings = _cpu_warnings(cpu_plan.warnings)
    for topic in ("speculative decoding off", "--attention-backend FLASH_ATTN",
                  "--mamba-ssm-cache-dtype float32", "KV pool pinned", "CUDA-graph",
                  "CUDA-only environment"):
        assert any(topic in w for w in warnings), topic
    # A GPU kernel's missing patch is not news on the CPU: no capability warnings.
    assert not [w for w in cpu_plan.warnings if "capability" in w]


@pytest.mark.unit
def test_cpu_rules_for_batch_and_long(tmp_path: Path) -> None:
    batch = plan_for({"KV": "int4pth"}, cli={**CPU, "PROFILE": "batch"}, cwd=tmp_path)
    flags = arg_map(batch.vllm_args)
    assert "--kv-cache-dtype" not in flags and "--attention-backend" not in flags
    assert "--async-scheduling" not in flags
    assert any("int4_per_token_head dropped" in w for w in batch.warnings)
    assert any("async scheduling" in w for w in batch.warnings)
    long = plan_for({"CTX": "long"}, cli=CPU, cwd=tmp_path)
    assert arg_map(long.vllm_args)["--kv-cache-dtype"] == "fp8"


@pytest.mark.unit
def test_cpu_keeps_what_the_user_pinned(tmp_path: Path) -> None:
    plan = plan_for({"KV_MEM": "2147483648"}, cli=CPU, cwd=tmp_path)
    assert arg_map(plan.vllm_args)["--kv-cache-memory-bytes"] == "2147483648"
    assert not any("KV pool pinned" in w for w in plan.warnings)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("knobs", "knob"),
    [({"SPEC": "dflash2"}, "SPEC=dflash2"), ({"SPEC": "mtp", "PREFIX_CACHE": "1"}, "SPEC=mtp")],
)
def test_cpu_refuses_a_speculator_it_cannot_run(
    knobs: dict[str, str], knob: str, tmp_path: Path
) -> None:
    with pytest.raises(Qwen3090Error) as err:
        plan_for(knobs, cli=CPU, cwd=tmp_path)
    assert err.value.message.startswith(knob) and err.value.fix


@pytest.mark.unit
def test_cpu_keeps_an_explicit_mtp_without_prefix_cache(tmp_path: Path) -> None:
    plan = plan_for({"SPEC": "mtp", "PREFIX_CACHE": "0"}, cli=CPU, cwd=tmp_path)
    assert json_flag(plan, "--speculative-config")["method"] == "mtp"
