"""SPEC=dflash2: the DFlash2 drafter, its table row, lookup drafting and the graph capture cap."""

from __future__ import annotations

from itertools import pairwise

from qwen3090 import profiles as P
from qwen3090.resolver.builder import PlanBuilder, PlatformFacts, no_effect
from qwen3090.resolver.capgate import CapabilityGate
from qwen3090.resolver.common import default_draft
from qwen3090.settings import Ctx, Settings


def dflash2(
    s: Settings, facts: PlatformFacts, b: PlanBuilder, gate: CapabilityGate, ctx: Ctx
) -> int:
    """Apply the dflash2 row for (CTX, k); returns the row's pinned pool (the KV_MEM default)."""
    k = s.dflash_tokens or P.DFLASH_DEFAULT_TOKENS
    row = P.DFLASH_TABLE[(ctx, k > P.DFLASH_LONG_BLOCK)]
    b.drafter = s.draft if s.draft is not None else default_draft(facts)
    b.num_spec_tokens = k
    b.speculative = {"method": "dflash", "model": b.drafter, "num_speculative_tokens": k}
    # gotcha 17: the verify scratch is sized once, at startup, for k+1 query rows.
    gate.admit_env("VLLM_SPEC_DECODE_ATTN_QMAX", str(k + 1), knob=None, explicit=False)
    adaptive = _lookup(s, b, gate, k, ctx)
    b.max_seqs = s.max_seqs or row.max_seqs
    b.max_len = s.dflash_max_len or s.max_len or row.max_len
    b.kv_mem = row.kv_mem if s.kv_mem is None else (s.kv_mem or None)
    graph_mem = graph_mem_mib(k, row)
    if s.graph_mem_mib is not None:
        graph_mem = s.graph_mem_mib
        need = graphs_need_mib(k, row, adaptive)
        if s.graph_mem_mib < need:
            short_steps = (" (the adaptive block's short-step graphs included, gotcha 23)"
                           if adaptive else "")
            b.warnings.append(
                f"GRAPH_MEM_MIB={s.graph_mem_mib} (from {s.source('GRAPH_MEM_MIB')}) is below "
                f"the {need} MiB the graphs of DFLASH_TOKENS={k} need{short_steps}: the "
                "server starts, reports a healthy pool and dies on the first prefill "
                "(gotcha 25)"
            )
    gate.admit_env("VLLM_V2_CUDAGRAPH_MEM_MIB", str(graph_mem), knob="GRAPH_MEM_MIB",
                   explicit=s.given("GRAPH_MEM_MIB"))
    if s.cg is not None:
        b.cg = s.cg
        if s.cg > P.DFLASH_CG_CAP and not s.given("GRAPH_MEM_MIB"):
            b.warnings.append(
                f"CG={s.cg} > {P.DFLASH_CG_CAP}: VLLM_V2_CUDAGRAPH_MEM_MIB reserves graph "
                "memory for 64 query tokens; a larger capture boots, answers /health and "
                "dies on the first concurrent batch (gotcha 34). Raise GRAPH_MEM_MIB "
                "(--graph-mem-mib) with it"
            )
    else:
        b.cg = min(b.max_seqs * (k + 1), P.DFLASH_CG_CAP)
    b.warnings += no_effect(s, ("DRAFT_TOKENS", "DRAFT_SAMPLE"), "they set the mtp "
                            "speculator; SPEC=dflash2")
    return row.kv_mem


def graph_mem_mib(k: int, row: P.DflashRow) -> int:
    """The default GRAPH_MEM_MIB for block length ``k``: the row's figure up to k = 15, then
    the measured growth (gotcha 25) plus the margin the row keeps at 15, rounded up."""
    points = P.V2_GRAPH_MEM_MEASURED_MIB
    first_k, first_mib = points[0]
    if k <= first_k:
        return row.v2_cudagraph_mem_mib
    margin = max(0, P.V2_CUDAGRAPH_MEM_MIB_LONG - first_mib)
    lower, upper = points[-2], points[-1]
    for a, c in pairwise(points):
        if k <= c[0]:
            lower, upper = a, c
            break
    slope = (upper[1] - lower[1]) / (upper[0] - lower[0])
    measured = lower[1] + slope * (k - lower[0])
    step = P.V2_GRAPH_MEM_ROUND_MIB
    return int(-(-(measured + margin) // step) * step)


def graphs_need_mib(k: int, row: P.DflashRow, adaptive: bool) -> int:
    """The graph memory the plan must reserve: the default, which holds the adaptive block's
    short-step graphs past k = 7 (gotcha 23), less those when the plan leaves the block off."""
    default = graph_mem_mib(k, row)
    if k > P.DFLASH_LONG_BLOCK and not adaptive:
        return default - P.V2_GRAPH_MEM_SHORT_BLOCK_MIB
    return default


def _lookup(s: Settings, b: PlanBuilder, gate: CapabilityGate, k: int, ctx: Ctx) -> bool:
    """Lookup drafting, its adaptive verify length, and async scheduling (gotchas 18, 19);
    True when the plan runs the adaptive block (the patch then captures the short steps'
    graphs too, gotcha 23)."""
    lookup = False
    if s.lookup is not False:  # default on
        lookup = gate.admit_env("VLLM_DFLASH2_LOOKUP", "1", knob="LOOKUP",
                                explicit=s.given("LOOKUP"))
    else:
        gate.restate_stock("VLLM_DFLASH2_LOOKUP", "0")
    # Async scheduling pins the verify length the adaptive lookup varies.
    adaptive_block = lookup and k > P.DFLASH_LONG_BLOCK
    if s.async_sched is not None:
        b.async_scheduling = s.async_sched
        if s.async_sched and adaptive_block:
            b.warnings.append(
                f"ASYNC_SCHED=1 with lookup on and DFLASH_TOKENS={k} > 7: async scheduling "
                "pads every step to num_speculative_tokens, so the adaptive block length "
                "is silently ignored (gotchas 18, 19)"
            )
    else:
        b.async_scheduling = not adaptive_block
    if s.lookup_adaptive is not None:
        if s.lookup_adaptive:
            gate.admit_env("VLLM_DFLASH2_LOOKUP_ADAPTIVE", "1", knob="LOOKUP_ADAPTIVE",
                           explicit=True)
        else:
            gate.restate_stock("VLLM_DFLASH2_LOOKUP_ADAPTIVE", "0")
        if not lookup:
            b.warnings += no_effect(s, ("LOOKUP_ADAPTIVE",), "lookup drafting is off")
    elif (
        adaptive_block and ctx == "huge" and b.prefix_cache and not s.given("LOOKUP")
    ) and gate.admit_env("VLLM_DFLASH2_LOOKUP_ADAPTIVE", "0", knob=None, explicit=False):
        b.warnings.append(
            "VLLM_DFLASH2_LOOKUP_ADAPTIVE=0: at CTX=huge with PREFIX_CACHE=1 and "
            f"DFLASH_TOKENS={k} > 7 the adaptive verify length corrupts turn 2 on a "
            "shared prefix; set LOOKUP=1 explicitly to keep the adaptive length anyway"
        )
    # The patch's own rule: lookup on, k > 7, synchronous scheduling, ADAPTIVE not 0 (its
    # default is 1, so an unset variable is on).
    return (adaptive_block and not b.async_scheduling
            and b.env.get("VLLM_DFLASH2_LOOKUP_ADAPTIVE", "1") != "0")
