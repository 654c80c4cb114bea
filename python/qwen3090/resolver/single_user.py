"""The single-user profile (PROFILES.md "Single-user mode"): the CTX row, the speculator, the
split-KV verify attention, then the CTX=huge / CUDA-graph rules."""

from __future__ import annotations

from qwen3090 import profiles as P
from qwen3090.capabilities import KVARN_DFLASH2_DRAFTER
from qwen3090.errors import Qwen3090Error
from qwen3090.resolver.builder import PlanBuilder, PlatformFacts, no_effect
from qwen3090.resolver.capgate import CapabilityGate
from qwen3090.resolver.common import (
    cache_row,
    int8,
    kv_mem_warnings,
    kvarn_cudagraph_check,
    kvarn_staging_warning,
)
from qwen3090.resolver.cudagraph import cudagraph_rules
from qwen3090.resolver.dflash2 import dflash2
from qwen3090.resolver.int8_layers import check_int8_layers
from qwen3090.settings import Ctx, Settings, Spec


def single_user(
    settings: Settings, facts: PlatformFacts, b: PlanBuilder, gate: CapabilityGate
) -> None:
    s = settings
    ctx = s.ctx or P.DEFAULT_CTX
    spec = s.spec or P.DEFAULT_SPEC[b.device]
    cache = P.SINGLE_USER_CACHE[(spec, ctx)]
    b.gpu_util = s.gpu_util if s.gpu_util is not None else P.SINGLE_USER_GPU_UTIL
    cache_row(cache, b, gate, knob="CTX", explicit=s.given("CTX"), setting=ctx)
    if spec == "dflash2" and cache.kv_cache_dtype == "kvarn_k4v2_g128":
        gate.admit(KVARN_DFLASH2_DRAFTER, ctx, knob="CTX", explicit=True)
    b.warnings += no_effect(s, ("KV",), "KV chooses the batch profile's cache; single-user "
                            "takes it from CTX")
    if cache.spec_attn == "off":  # before the speculator: its warning comes first
        gate.restate_stock("VLLM_SPEC_DECODE_ATTN", "0")
        b.warnings += no_effect(s, ("SPEC_ATTN",), f"CTX={ctx} under {spec} sets "
                                "VLLM_SPEC_DECODE_ATTN=0")
    pinned_default: int | None = None
    if spec == "dflash2":
        pinned_default = dflash2(s, facts, b, gate, ctx)
    else:
        _mtp_or_off(s, b, spec, ctx)
    _spec_attn(s, b, gate, cache, ctx)
    cudagraph_rules(s, b, spec, ctx)
    kvarn_cudagraph_check(s, b)
    kv_mem_warnings(s, facts, b, pinned_default or P.KV_MEM_DEFAULT)
    if s.kv_mem is not None and s.kv_mem != "" and s.gpu_util is not None:
        b.warnings.append(
            f"GPU_UTIL={s.gpu_util} has no effect: KV_MEM pins the pool in bytes (set KV_MEM= "
            "empty to size it from GPU_UTIL)"
        )
    int8(s, b, gate, default_on=False)
    check_int8_layers(s, b)
    kvarn_staging_warning(b)


def _mtp_or_off(s: Settings, b: PlanBuilder, spec: Spec, ctx: Ctx) -> None:
    """SPEC=mtp (the MTP head drafts) or SPEC=off: the CTX row's sizes."""
    row = P.CTX_TABLE[ctx]
    k = 0
    if spec == "mtp":
        k = s.draft_tokens or row.mtp_draft_tokens
        b.speculative = {
            "method": "mtp",
            "num_speculative_tokens": k,
            "draft_sample_method": s.draft_sample or P.DEFAULT_DRAFT_SAMPLE,
        }
    else:
        b.warnings += no_effect(s, ("DRAFT_TOKENS", "DRAFT_SAMPLE"), "SPEC=off")
    b.num_spec_tokens = k
    b.max_seqs = s.max_seqs or P.MTP_MAX_SEQS
    b.max_len = s.max_len or row.max_len
    b.cg = s.cg or P.MTP_CG
    b.kv_mem = s.kv_mem or None
    if s.async_sched is not None:
        b.async_scheduling = s.async_sched
    b.warnings += no_effect(
        s, ("DFLASH_TOKENS", "DFLASH_MAX_LEN", "DRAFT", "LOOKUP", "LOOKUP_ADAPTIVE",
            "GRAPH_MEM_MIB"),
        f"they set the dflash2 speculator; SPEC={spec}",
    )


def _spec_attn(
    s: Settings, b: PlanBuilder, gate: CapabilityGate, cache: P.CacheRow, ctx: Ctx
) -> None:
    """VLLM_SPEC_DECODE_ATTN=${SPEC_ATTN:-1} where the row uses it (gotcha 12)."""
    if cache.spec_attn == "knob" and cache.kv_cache_dtype not in P.SPEC_ATTN_KV_DTYPES:
        _spec_attn_declined(s, b, gate, cache, ctx)
    elif cache.spec_attn == "knob":
        if s.spec_attn is not False:  # default on
            gate.admit_env("VLLM_SPEC_DECODE_ATTN", "1", knob="SPEC_ATTN",
                           explicit=s.given("SPEC_ATTN"))
        else:
            gate.restate_stock("VLLM_SPEC_DECODE_ATTN", "0")
    elif cache.spec_attn == "unused":
        b.warnings += no_effect(s, ("SPEC_ATTN",), f"CTX={ctx} does not use the split-KV "
                                "verify attention")


def _spec_attn_declined(
    s: Settings, b: PlanBuilder, gate: CapabilityGate, cache: P.CacheRow, ctx: Ctx
) -> None:
    """A row that wants the split-KV path on a cache its kernels cannot read: say so, never
    emit a VLLM_SPEC_DECODE_ATTN=1 that the kernel would decline layer by layer."""
    dtype = cache.kv_cache_dtype
    readable = "/".join(d for d in P.SPEC_ATTN_KV_DTYPES if d != "auto")
    if s.spec_attn:
        raise Qwen3090Error(
            f"SPEC_ATTN=1 (from {s.source('SPEC_ATTN')}) with CTX={ctx}: the split-KV verify "
            f"attention of this build reads only {readable} KV caches, and this row's cache "
            f"is {dtype}",
            fix="unset SPEC_ATTN (verify batches then take vLLM's stock attention), or choose "
            "CTX=fast, whose KV cache is bfloat16",
        )
    gate.restate_stock("VLLM_SPEC_DECODE_ATTN", "0")
    # The scratch size is read only when the split path is on.
    b.env.pop("VLLM_SPEC_DECODE_ATTN_QMAX", None)
    b.warnings.append(
        f"split-KV verify attention off for CTX={ctx}: this build's kernels read only "
        f"{readable} KV caches and this row's is {dtype}, so verify batches take vLLM's "
        "stock attention (slower at long context, gotcha 12)"
    )
