"""What an INT8_LAYERS regex selects on the deployment's model, and the selection refused before
boot (gotchas 5 and 16; ``patches/int8-layer-select.patch`` applies the regex in vLLM)."""

from __future__ import annotations

import re

from qwen3090.errors import Qwen3090Error
from qwen3090.resolver.builder import PlanBuilder
from qwen3090.settings import Settings

# Qwen3.8-27B as vLLM 0.28.0 builds it: Qwen3_5ForConditionalGeneration puts the text model
# under "language_model."; 64 decoder layers, every 4th one full attention, the rest Gated
# DeltaNet. tests/patch/test_patch_int8_layer_select.py holds these names against the layers
# vLLM itself builds from a config of that shape.
NUM_LAYERS = 64
FULL_ATTENTION_INTERVAL = 4
LAYER_PREFIX = "language_model.model.layers"
PROJECTIONS: dict[str, tuple[str, ...]] = {
    "mlp": ("gate_up_proj", "down_proj"),
    "linear_attn": ("in_proj_qkvz", "in_proj_ba", "out_proj"),
    "self_attn": ("qkv_proj", "o_proj"),
}


def layer_prefixes() -> dict[str, tuple[str, ...]]:
    """Every Marlin linear layer prefix of the 27B's decoder, by kind (mlp, linear_attn, ...)."""
    out: dict[str, list[str]] = {kind: [] for kind in PROJECTIONS}
    for i in range(NUM_LAYERS):
        mixer = "self_attn" if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else "linear_attn"
        for kind in (mixer, "mlp"):
            out[kind] += [f"{LAYER_PREFIX}.{i}.{kind}.{proj}" for proj in PROJECTIONS[kind]]
    return {kind: tuple(names) for kind, names in out.items()}


def selected(regex: str) -> dict[str, tuple[int, int]]:
    """Per kind: (layers the regex selects, layers there are), matched as the patch matches."""
    pattern = re.compile(regex)
    return {kind: (sum(1 for n in names if pattern.search(n)), len(names))
            for kind, names in layer_prefixes().items()}


def check_int8_layers(settings: Settings, b: PlanBuilder) -> None:
    """Refuse the int8 set known to crash; warn on one that selects no layer of the 27B."""
    regex = b.env.get("VLLM_MARLIN_INT8_INCLUDE_RE")
    if regex is None or "VLLM_MARLIN_INPUT_DTYPE" not in b.env:
        return
    counts = selected(regex)
    gdn, gdn_total = counts["linear_attn"]
    attn, attn_total = counts["self_attn"]
    if gdn and attn < attn_total:
        # Observed with mlp|linear_attn: inductor crashed compiling the mixed graph even from
        # a clean cache, on 0.28.0's torch pin. The rule is the cause as recorded (int8 Gated
        # DeltaNet beside 16-bit attention), so other spellings of that set are refused too.
        raise Qwen3090Error(
            f"INT8_LAYERS={regex} (from {settings.source('INT8_LAYERS')}) gives int8 "
            f"activations to {gdn} of {gdn_total} Gated DeltaNet projections (linear_attn) "
            f"while {attn_total - attn} of {attn_total} attention projections (self_attn) stay "
            "16-bit: that mixed set (mlp|linear_attn) crashed inductor while compiling, even "
            "from a clean compile cache, on vLLM 0.28.0's torch (gotcha 5)",
            fix="set INT8_LAYERS=mlp (the batch default), or INT8_LAYERS=. (every layer, with "
            "GPU_UTIL at most 0.95, gotcha 16), or INT8_LAYERS= (empty: int8 activations off)",
        )
    if not any(n for n, _ in counts.values()):
        dtype = b.env["VLLM_MARLIN_INPUT_DTYPE"]
        b.warnings.append(
            f"INT8_LAYERS={regex} selects none of the 27B's Marlin layers (names like "
            f"{LAYER_PREFIX}.0.mlp.gate_up_proj): VLLM_MARLIN_INPUT_DTYPE={dtype} changes "
            "nothing on that model"
        )
