"""The batch profile (PROFILES.md "Batch mode"): the KV row, no speculator, int8 by default."""

from __future__ import annotations

from qwen3090 import profiles as P
from qwen3090.resolver.builder import PlanBuilder, PlatformFacts, no_effect
from qwen3090.resolver.capgate import CapabilityGate
from qwen3090.resolver.common import (
    cache_row,
    int8,
    kv_mem_warnings,
    kvarn_cudagraph_check,
    kvarn_staging_warning,
)
from qwen3090.resolver.int8_layers import check_int8_layers
from qwen3090.settings import Settings

SINGLE_USER_KNOBS = ("SPEC", "CTX", "DFLASH_TOKENS", "DRAFT_TOKENS", "DFLASH_MAX_LEN", "DRAFT",
                     "LOOKUP", "LOOKUP_ADAPTIVE", "SPEC_ATTN", "DRAFT_SAMPLE", "GRAPH_MEM_MIB")


def batch(settings: Settings, facts: PlatformFacts, b: PlanBuilder, gate: CapabilityGate) -> None:
    s = settings
    kv = s.kv or P.DEFAULT_KV
    row = P.KV_TABLE[kv]
    b.max_seqs = s.max_seqs or P.BATCH_MAX_SEQS
    b.max_len = s.max_len or row.max_len
    b.gpu_util = s.gpu_util if s.gpu_util is not None else row.gpu_util
    b.kv_mem = s.kv_mem or None
    b.cg = s.cg or P.BATCH_CG
    b.async_scheduling = True if s.async_sched is None else s.async_sched
    b.cudagraph_mode = s.cudagraph_mode
    # KV has a default (fp8) that needs no patch, so a patched row is always the user's choice.
    cache_row(row.cache, b, gate, knob="KV", explicit=True, setting=kv)
    kvarn_staging_warning(b)
    kvarn_cudagraph_check(s, b)
    b.warnings += no_effect(s, SINGLE_USER_KNOBS, "the batch profile runs no speculator")
    kv_mem_warnings(s, facts, b, P.KV_MEM_DEFAULT)
    int8(s, b, gate, default_on=True)
    check_int8_layers(s, b)
