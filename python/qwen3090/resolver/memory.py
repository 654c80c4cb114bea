"""The GPU memory rules every CUDA plan passes last (issue 19, items 3-5): the memory
fraction's bounds, the verify-cost stairs, other processes' memory taken out of a pinned pool,
and a pinned pool that must hold one max-length request (gotcha 25's model)."""

from __future__ import annotations

from qwen3090 import profiles as P
from qwen3090.errors import Qwen3090Error
from qwen3090.resolver.builder import PlanBuilder, PlatformFacts
from qwen3090.resolver.serveplan import MemoryEstimate
from qwen3090.settings import Settings

GIB = 1 << 30


def estimate(b: PlanBuilder) -> MemoryEstimate:
    """Gotcha 25: one request costs kv_bytes_per_token x context + 102 MiB x (k + 2)."""
    per_token = P.KV_BYTES_PER_TOKEN.get(b.kv_cache_dtype or "auto", 65536)
    fixed = P.REQUEST_FIXED_BYTES_PER_SLOT * (b.num_spec_tokens + 2)
    request = per_token * b.max_len + fixed
    fits = round(b.kv_mem / request, 2) if b.kv_mem is not None else None
    return MemoryEstimate(per_token, fixed, request, b.kv_mem, fits)


def pool_tokens_per_gib(kv_cache_dtype: str) -> int:
    """Tokens of context one GiB of KV pool holds across the model's attention layers, by
    ``--kv-cache-dtype`` (issue 24 compares kvarn_k4v2_g128 with fp8 and int8 this way)."""
    return GIB // P.KV_BYTES_PER_TOKEN[kv_cache_dtype]


def _spec_knob(b: PlanBuilder) -> str:
    method = (b.speculative or {}).get("method")
    return "DFLASH_TOKENS" if method == "dflash" else "DRAFT_TOKENS"


def _len_knob(s: Settings, b: PlanBuilder) -> str:
    dflash = b.speculative is not None and b.speculative.get("method") == "dflash"
    # Under dflash2 DFLASH_MAX_LEN wins over MAX_LEN; MAX_LEN is the one to name only when
    # it is what set the length.
    if dflash and (s.given("DFLASH_MAX_LEN") or not s.given("MAX_LEN")):
        return "DFLASH_MAX_LEN"
    return "MAX_LEN"


def gpu_util_rules(s: Settings, b: PlanBuilder) -> None:
    """GPU_UTIL >= 0.99 is refused (vLLM 0.28.0 refuses 1.0 at boot); above 0.93 under a
    speculator it is a warning (gotcha 4). Only where the fraction sizes the pool."""
    if b.kv_mem is not None:
        return
    where = f"from {s.source('GPU_UTIL')}"
    if b.gpu_util >= P.GPU_UTIL_REFUSE:
        raise Qwen3090Error(
            f"GPU_UTIL={b.gpu_util} ({where}) leaves the CUDA context, the activations and "
            f"the graphs no memory: vLLM 0.28.0 refuses 1.0 at boot, and at "
            f"{P.GPU_UTIL_REFUSE} or more the engine has nothing left for its first batch",
            fix=f"set GPU_UTIL (--gpu-util) below {P.GPU_UTIL_REFUSE}, or leave it unset for "
            "the profile default",
        )
    if b.speculative is not None and b.gpu_util > P.SPEC_GPU_UTIL_WARN:
        b.warnings.append(
            f"GPU_UTIL={b.gpu_util} ({where}) with the {b.speculative['method']} speculator: "
            "its workspace grows past what the start-up profile measured, and above "
            f"{P.SPEC_GPU_UTIL_WARN} the engine dies part-way through long generations while "
            f"short benchmarks pass (gotcha 4). Set GPU_UTIL={P.SPEC_GPU_UTIL_WARN} or lower"
        )


def verify_stairs(b: PlanBuilder) -> None:
    """Gotcha 24: verify cost rises at 17 and at 22 query tokens; warn between the stairs."""
    k = b.num_spec_tokens
    low, high = P.VERIFY_STAIRS
    query = k + 1
    if k == 0 or query in (low, high) or query < low:
        return
    if query < high:
        why = (f"past the stair at {low} (W4A16 Marlin tiles M in 16 rows) and short of the "
               f"next at {high}: each step costs about what {high} query tokens cost")
    else:
        why = (f"past the stair at {high} (the verify attention fits {high} query tokens in "
               "one 128-row tile): each step pays for another tile")
    b.warnings.append(
        f"{_spec_knob(b)}={k}: a verify block of k+1 = {query} query tokens is {why}; "
        f"k = {low - 1} or {high - 1} are the sensible block lengths (gotcha 24)"
    )


def foreign_memory(facts: PlatformFacts, b: PlanBuilder) -> int:
    """Lower a pinned pool by the GPU memory other processes hold beyond the baseline
    (gotcha 31); returns the bytes taken off (0 when nothing was)."""
    used = facts.foreign_gpu_mib
    if b.kv_mem is None or used is None or used <= P.FOREIGN_BASELINE_MIB:
        return 0
    excess = (used - P.FOREIGN_BASELINE_MIB) * P.MIB
    was = b.kv_mem
    b.kv_mem = max(0, was - excess)
    b.warnings.append(
        f"the GPU already has {used} MiB in use (a headless card reads at most "
        f"{P.FOREIGN_BASELINE_MIB}): the pinned pool assumes a headless card, so it is lowered "
        f"by {used - P.FOREIGN_BASELINE_MIB} MiB, from {was} to {b.kv_mem} bytes (gotcha 31)"
    )
    return excess


def _shipped_row(s: Settings, b: PlanBuilder) -> bool:
    """A dflash2 table row exactly as shipped: its pool and length, at the block length the
    rows were measured at (7, the default, and 15, the long block)."""
    return (
        b.speculative is not None and b.speculative.get("method") == "dflash"
        and b.num_spec_tokens in P.DFLASH_SHIPPED_TOKENS
        and not any(s.given(k) for k in ("KV_MEM", "MAX_LEN", "DFLASH_MAX_LEN"))
    )


def one_request(s: Settings, b: PlanBuilder, lowered_by: int) -> None:
    """Refuse a pinned pool that cannot hold one request of --max-model-len tokens."""
    m = estimate(b)
    if b.kv_mem is None or m.full_length_requests is None or m.full_length_requests >= 1:
        return
    numbers = (
        f"the pinned KV pool of {b.kv_mem} bytes ({b.kv_mem / GIB:.2f} GiB) holds "
        f"{m.full_length_requests} requests of {b.max_len} tokens; one needs "
        f"{m.request_bytes_at_max_len} bytes ({m.request_bytes_at_max_len / GIB:.2f} GiB: "
        f"{m.kv_bytes_per_token} B/token x {b.max_len} + 102 MiB x (k + 2) at "
        f"k = {b.num_spec_tokens}, gotcha 25)"
    )
    if lowered_by == 0 and _shipped_row(s, b):
        # The original system ran this row at this block length (PROFILES.md's dflash2 table);
        # the model is an upper bound (a request rarely fills the whole length), so a shipped
        # row is kept servable and the shortfall said, not refused.
        b.warnings.append(
            f"{numbers}: a request that fills the whole length can run the pool dry; lower "
            f"{_len_knob(s, b)} or {_spec_knob(b)} if you need full-length requests"
        )
        return
    changes = [_named(s, _len_knob(s, b), b.max_len)]
    if b.num_spec_tokens:
        changes.append(_named(s, _spec_knob(b), b.num_spec_tokens))
    others = " after other processes' GPU memory was taken out of it" if lowered_by else ""
    raise Qwen3090Error(
        f"{numbers}{others}; the server would boot and fail the first long request",
        fix=f"lower {' or '.join(changes)}, or raise {_named(s, 'KV_MEM', s.kv_mem or b.kv_mem)}"
        + (", or free the GPU memory other processes hold" if lowered_by else ""),
    )


def _named(s: Settings, knob: str, value: object) -> str:
    """``KNOB=value (from SOURCE, --flag)``, for a fix that says what to change and where."""
    flag = "--" + knob.lower().replace("_", "-")
    return f"{knob}={value} (from {s.source(knob)}, {flag})"


def memory_rules(s: Settings, facts: PlatformFacts, b: PlanBuilder) -> None:
    """Every CUDA plan's memory checks, after the profile stages set the pool."""
    gpu_util_rules(s, b)
    verify_stairs(b)
    lowered_by = foreign_memory(facts, b)
    one_request(s, b, lowered_by)
