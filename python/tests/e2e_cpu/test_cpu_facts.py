"""The facts behind the CPU rule set (unit/test_cpu_rules.py), checked against the installed
CPU build of vLLM: which KV dtypes it stores and which attention backend it picks."""

from __future__ import annotations

import pytest

from qwen3090.profiles import CPU_KV_DTYPES


@pytest.mark.e2e_cpu
def test_cpu_attention_backend_facts() -> None:
    """The CPU build stores only these KV dtypes, and ignores a requested backend."""
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    native = set(CPUAttentionBackend.supported_kv_cache_dtypes)
    assert native <= CPU_KV_DTYPES
    assert CPU_KV_DTYPES - native == {"bfloat16"}  # measured separately: it serves
    for dtype in ("int8_per_token_head", "int4_per_token_head"):
        assert dtype not in native

    class Selector:  # the two fields CpuPlatform.get_attn_backend_cls reads
        use_sparse = False
        use_mla = False

    chosen = CpuPlatform.get_attn_backend_cls(
        AttentionBackendEnum.FLASH_ATTN, Selector()  # type: ignore[arg-type]
    )
    assert chosen == AttentionBackendEnum.CPU_ATTN.get_path()
