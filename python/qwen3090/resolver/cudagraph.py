"""CTX=huge rules for every speculator, and the CUDA-graph mode rules of Bug B (gotcha 33)."""

from __future__ import annotations

from qwen3090 import profiles as P
from qwen3090.resolver.builder import PlanBuilder
from qwen3090.settings import Ctx, Settings, Spec


def cudagraph_rules(s: Settings, b: PlanBuilder, spec: Spec, ctx: Ctx) -> None:
    if ctx == "huge":
        if b.prefix_cache:
            b.prefix_match_unit = P.PREFIX_MATCH_UNIT_HUGE
        if spec != "dflash2":
            # Bug B (gotcha 33, seeds/001): a correctness constraint, not a preference.
            b.cudagraph_mode = s.cudagraph_mode or "PIECEWISE"
            if s.cudagraph_mode not in (None, "PIECEWISE", "NONE"):
                b.warnings.append(
                    f"CUDAGRAPH_MODE={s.cudagraph_mode} at CTX=huge with SPEC={spec}: a captured "
                    "verify step after a prefix-cache hit corrupts output at one prompt length "
                    "in 128 (Bug B, gotcha 33); PIECEWISE is the correctness default"
                )
        elif s.cudagraph_mode is not None:
            b.cudagraph_mode = s.cudagraph_mode
        if spec == "mtp" and b.prefix_cache:
            b.warnings.append(
                "SPEC=mtp with PREFIX_CACHE=1 at CTX=huge: the original's KVarN returned wrong "
                "and sometimes NaN prompt_logprobs for co-scheduled requests in exactly this "
                "combination (gotcha 46), and this port's has not been checked for it; measure "
                "perplexity with PREFIX_CACHE=0 (generation is not implicated)"
            )
        if b.max_seqs > P.HUGE_MAX_SEQS_WARN:
            b.warnings.append(
                f"MAX_SEQS={b.max_seqs} > {P.HUGE_MAX_SEQS_WARN} at CTX=huge: the engine boots, "
                "answers /health, and dies on the first prompt with torch.OutOfMemoryError "
                "(gotcha 35); buy seats with a lower KV_MEM"
            )
    elif s.cudagraph_mode is not None:
        b.cudagraph_mode = s.cudagraph_mode
    elif spec == "mtp" and b.prefix_cache:
        # MTP on this architecture runs on vLLM 0.28.0's V1 runner, whose uniform-decode test
        # is shape-only at every CTX (tests/patch/test_bug_b_regression.py); the corruption
        # was measured at CTX=huge only, so this warns instead of forcing PIECEWISE.
        b.warnings.append(
            f"SPEC=mtp with PREFIX_CACHE=1 at CTX={ctx}: vLLM's V1 runner may replay a FULL "
            "decode graph for a verify step right after a prefix-cache hit (Bug B, measured at "
            "CTX=huge); sweep `qwen3090 bench residues` before trusting it, or set "
            "CUDAGRAPH_MODE=PIECEWISE"
        )
