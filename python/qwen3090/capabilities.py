"""What the vLLM this plan will exec can read: stock 0.28.0 plus the patches of its manifest.

DESIGN.md "capability gating: nothing set that nothing reads". The resolver asks this module
before it emits any environment variable, flag or flag value a patch provides:

- the user set the knob EXPLICITLY and the build lacks the patch: an error naming the knob,
  the missing capability and the fix;
- the value came only from a profile DEFAULT: it is dropped with a warning in the plan, so
  the default plans stay usable on a build without the patch.

``STOCK_ENV`` and ``STOCK_FLAGS`` list every stock name the resolver emits; a test holds them
against the real ``vllm.envs`` and vLLM 0.28.0's own argument parser.
"""

from __future__ import annotations

from dataclasses import dataclass

from qwen3090.errors import Qwen3090Error

# vLLM 0.28.0's own environment variables that plans set (all registered in vllm.envs).
STOCK_ENV = frozenset(
    {
        "VLLM_USE_FLASHINFER_SAMPLER",
        "VLLM_MARLIN_INPUT_DTYPE",
        "VLLM_API_KEY",
    }
)
# Read by a library under vLLM, not by vLLM itself (torch's CUDA caching allocator).
EXTERNAL_ENV = frozenset({"PYTORCH_CUDA_ALLOC_CONF"})

# Stock flags plans emit -> the values they may carry (None: any value, or no value).
STOCK_FLAGS: dict[str, frozenset[str] | None] = {
    "--model": None,
    "--served-model-name": None,
    "--host": None,
    "--port": None,
    "--api-server-count": None,
    "--language-model-only": None,
    "--max-model-len": None,
    "--max-num-seqs": None,
    "--max-num-batched-tokens": None,
    "--kv-cache-memory-bytes": None,
    "--gpu-memory-utilization": None,
    "--attention-backend": frozenset({"FLASH_ATTN", "TRITON_ATTN"}),
    "--kv-cache-dtype": frozenset(
        {"bfloat16", "fp8", "int8_per_token_head", "int4_per_token_head"}
    ),
    "--block-size": None,
    "--mamba-ssm-cache-dtype": frozenset({"float16", "float32"}),
    "--enable-prefix-caching": None,
    "--no-enable-prefix-caching": None,
    "--mamba-cache-mode": frozenset({"align"}),
    "--prefix-match-unit": None,
    "--enable-prompt-tokens-details": None,
    "--speculative-config": None,
    "--async-scheduling": None,
    "--no-async-scheduling": None,
    "--compilation-config": None,
    "--reasoning-parser": frozenset({"qwen3"}),
    "--enable-auto-tool-choice": None,
    "--tool-call-parser": None,
}
# Speculative methods and compilation-config keys plans put inside the JSON values.
STOCK_SPEC_METHODS = frozenset({"mtp", "dflash"})
STOCK_SPEC_KEYS = frozenset({"method", "model", "num_speculative_tokens", "draft_sample_method"})
STOCK_COMPILATION_KEYS = frozenset({"max_cudagraph_capture_size", "custom_ops", "cudagraph_mode"})


@dataclass(frozen=True)
class PatchNeed:
    """Something only a patch provides, and the feature that names it for a human."""

    kind: str
    """``env`` or ``flag-value``."""
    name: str
    """The env var, or ``--flag=value``."""
    feature: str
    """The capability in words / the manifest's feature name."""
    what: str
    """What it does, for the messages."""


NEEDS: dict[str, PatchNeed] = {
    n.name: n
    for n in (
        PatchNeed("env", "VLLM_SPEC_DECODE_ATTN", "spec-decode-attn",
                  "split-KV verify attention (gotcha 12)"),
        PatchNeed("env", "VLLM_SPEC_DECODE_ATTN_QMAX", "spec-decode-attn",
                  "fixed verify-attention scratch size (gotcha 17)"),
        PatchNeed("env", "VLLM_V2_CUDAGRAPH_MEM_MIB", "v2-cudagraph-mem-estimate",
                  "V2 runner CUDA-graph memory reservation (gotchas 15, 25)"),
        PatchNeed("env", "VLLM_MARLIN_INT8_INCLUDE_RE", "int8-layer-select",
                  "int8 activations on a chosen set of layers (gotcha 16)"),
        PatchNeed("env", "VLLM_DFLASH2_LOOKUP", "dflash2-lookup",
                  "DFlash2 lookup drafting"),
        PatchNeed("env", "VLLM_DFLASH2_LOOKUP_ADAPTIVE", "dflash2-lookup",
                  "DFlash2 adaptive verify length"),
        PatchNeed("env", "VLLM_VISION_TOWER_CPU_OFFLOAD", "vision-tower-cpu-offload",
                  "vision tower weights in host RAM (gotcha 8)"),
        PatchNeed("env", "KVARN_POOL_MEM_FRAC", "kvarn", "the KVarN KV cache pool"),
        PatchNeed("flag-value", "--kv-cache-dtype=kvarn_k4v2_g128", "kvarn",
                  "the KVarN KV cache (gotcha 46)"),
    )
}


@dataclass(frozen=True)
class Capabilities:
    """What the target vLLM reads beyond stock 0.28.0 (from its manifest)."""

    env: frozenset[str] = frozenset()
    flags: frozenset[str] = frozenset()
    features: frozenset[str] = frozenset()
    patches: tuple[str, ...] = ()
    source: str = "stock vLLM 0.28.0 (no patch manifest found)"
    """Where these came from, for messages."""

    def has(self, need: PatchNeed) -> bool:
        if need.kind == "env":
            return need.name in self.env
        value = need.name.partition("=")[2]
        return need.name in self.flags or value in self.flags or need.feature in self.features

    def has_feature(self, feature: str) -> bool:
        return feature in self.features


STOCK = Capabilities()


def from_installed() -> Capabilities:
    """The capabilities of the vLLM that ``import vllm`` would load (stock when no manifest)."""
    try:
        from qwen3090.manifest import find_installed_manifest
    except ImportError:  # the manifest module ships with the patch pipeline
        return STOCK
    manifest = find_installed_manifest()
    if manifest is None:
        return STOCK
    where = f"the manifest {manifest.path}" if manifest.path else "the build manifest"
    return Capabilities(
        env=manifest.provided_env,
        flags=manifest.provided_flags,
        features=manifest.provided_features,
        patches=manifest.patch_names,
        source=f"{where} ({len(manifest.patches)} patches, series {manifest.series_digest})",
    )


def missing_error(need: PatchNeed, knob: str, value: str, caps: Capabilities) -> Qwen3090Error:
    """The error for a knob the user set whose value needs a patch this build lacks."""
    return Qwen3090Error(
        f"{knob}={value} needs {need.name} ({need.what}), which only a patch provides "
        f"(capability {need.feature!r}); this vLLM is {caps.source} and no patch in it "
        f"provides it",
        fix=f"unset {knob} (or choose a value stock vLLM supports), or serve a vLLM built with "
        f"the patch series that carries {need.feature!r} (the manifest must list "
        f"{need.name})",
    )
