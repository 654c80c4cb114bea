"""What the vLLM this plan will exec can read: stock 0.28.0 plus the patches of its manifest.

DESIGN.md "capability gating: nothing set that nothing reads". The resolver asks this module
before it emits any environment variable, flag or flag value a patch provides:

- the user set the knob EXPLICITLY and the build lacks the patch: an error naming the knob,
  the missing capability and the fix;
- the value came only from a profile DEFAULT: it is dropped with a warning in the plan, so
  the default plans stay usable on a build without the patch.

``EMITTED`` is the one table of every environment variable a plan (or ``serve``) sets and every
patch-only flag value: what reads it, the patch file of ``patches/`` that provides it (or that
no patch here does, and what to set instead), and whether it is GPU-only. ``NEEDS``,
``STOCK_ENV``, ``EXTERNAL_ENV`` and the CPU rule set's GPU-only lists are derived from it.
``STOCK_ENV`` and ``STOCK_FLAGS`` list every stock name the resolver emits; a test holds them
against the real ``vllm.envs`` and vLLM 0.28.0's own argument parser.
"""

from __future__ import annotations

from dataclasses import dataclass

from qwen3090.errors import Qwen3090Error

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


NOT_IN_REPOSITORY = "not in this repository"
# Not a flag the plan emits: what SPEC=dflash2 at CTX=huge needs of the build (its drafter's
# layers on the KVarN cache); only the capability decides it.
KVARN_DFLASH2_DRAFTER = "the DFlash2 drafter's layers on kvarn_k4v2_g128"


@dataclass(frozen=True)
class Emitted:
    """An environment variable or flag value plans emit: what reads it, and where it runs."""

    kind: str
    """``env`` or ``flag-value``."""
    name: str
    """The env var, or ``--flag=value``."""
    feature: str | None
    """The capability (the manifest's feature name) a patch provides; None: stock vLLM 0.28.0
    (or a library under it) reads it."""
    what: str
    """What it does, for the messages."""
    provided_by: str | None = None
    """The patch file in this repository's ``patches/`` that provides it; None when no patch
    here does (the capability comes from a vLLM built elsewhere)."""
    instead: str = ""
    """What a user can set instead when the capability is missing (knob settings)."""
    gpu_only: bool = False
    """Nothing on vLLM's CPU build reads it (the CPU rule set leaves it out)."""
    library: str | None = None
    """The library under vLLM that reads it (None: vLLM itself)."""


# Every environment variable a plan can set, and every patch-only flag value, in one table.
# The order of the env rows is the order the CPU rule set names them in its warning.
EMITTED: tuple[Emitted, ...] = (
    Emitted("env", "PYTORCH_CUDA_ALLOC_CONF", None,
            "torch's CUDA caching allocator settings (gotcha 3)", gpu_only=True, library="torch"),
    Emitted("env", "VLLM_USE_FLASHINFER_SAMPLER", None, "FlashInfer's sampler off",
            gpu_only=True),
    Emitted("env", "VLLM_SPEC_DECODE_ATTN", "spec-decode-attn",
            "split-KV verify attention (gotcha 12)", "spec-decode-attn.patch",
            "SPEC_ATTN=0", gpu_only=True),
    Emitted("env", "VLLM_SPEC_DECODE_ATTN_QMAX", "spec-decode-attn",
            "fixed verify-attention scratch size (gotcha 17)", "spec-decode-attn.patch",
            "SPEC_ATTN=0", gpu_only=True),
    Emitted("env", "VLLM_V2_CUDAGRAPH_MEM_MIB", "v2-cudagraph-mem-estimate",
            "V2 runner CUDA-graph memory reservation (gotchas 15, 25)",
            "hybrid-kv-groups-v2-cudagraph.patch", gpu_only=True),
    Emitted("env", "VLLM_MARLIN_INPUT_DTYPE", None, "Marlin int8/fp8 activations",
            gpu_only=True),
    Emitted("env", "VLLM_MARLIN_INT8_INCLUDE_RE", "int8-layer-select",
            "int8 activations on a chosen set of layers (gotcha 16)", "int8-layer-select.patch",
            "INT8_LAYERS=. (every layer, what stock vLLM does for GPTQ/AWQ checkpoints, though "
            "it gives an auto-round one none; GPU_UTIL at most 0.95) or INT8_ACT= (empty: int8 "
            "activations off)", gpu_only=True),
    Emitted("env", "VLLM_DFLASH2_LOOKUP", "dflash2-lookup",
            "DFlash2 lookup drafting (issue 22)", "dflash2-lookup.patch", "LOOKUP=0",
            gpu_only=True),
    Emitted("env", "VLLM_DFLASH2_LOOKUP_ADAPTIVE", "dflash2-lookup",
            "DFlash2 adaptive verify length (gotchas 18, 27)", "dflash2-lookup.patch",
            "LOOKUP_ADAPTIVE=0", gpu_only=True),
    Emitted("env", "VLLM_VISION_TOWER_CPU_OFFLOAD", "vision-tower-cpu-offload",
            "vision tower weights in host RAM (gotcha 8)", None,
            "VISION_OFFLOAD=0 (the tower stays in GPU memory; lower KV_MEM by 1 GiB)",
            gpu_only=True),
    Emitted("env", "VLLM_API_KEY", None, "the API key (serve sets it from API_KEY_FILE)"),
    # The KVARN attention backend (issue 24). The original's KVARN_POOL_MEM_FRAC has no row:
    # it budgeted that port's fp16 pool of open tiles, which here is the backend's staging,
    # sized from max_num_seqs at model construction and charged by vLLM's memory profiler
    # (python/docs/kvarn.md), so nothing in this build reads it.
    Emitted("flag-value", "--kv-cache-dtype=kvarn_k4v2_g128", "kvarn-backend",
            "the KVarN KV cache (4-bit keys, 2-bit values, 128-token tiles)",
            "kvarn-backend.patch", "CTX=long (single-user) or KV=int4pth (batch)",
            gpu_only=True),
    # DFlash2's drafter has sliding-window layers and stores its context K/V outside its
    # forward; on CTX=huge they would share the kvarn cache, whose backend serves full causal
    # attention only, refuses windows at start-up and has no such store (docs/kvarn.md).
    Emitted("flag-value", KVARN_DFLASH2_DRAFTER, "kvarn-dflash2-drafter",
            "sliding windows, and the context K/V the drafter stores outside its forward, on "
            "the KVarN cache", None,
            "SPEC=mtp with CTX=huge, or CTX=long with SPEC=dflash2", gpu_only=True),
)

NEEDS: dict[str, Emitted] = {n.name: n for n in EMITTED if n.feature is not None}
"""What only a patch provides, by env var / ``--flag=value``."""
# vLLM 0.28.0's own environment variables that plans and serve set (all registered in vllm.envs).
STOCK_ENV = frozenset(
    n.name for n in EMITTED if n.kind == "env" and n.feature is None and n.library is None
)
# Read by a library under vLLM, not by vLLM itself.
EXTERNAL_ENV = frozenset(n.name for n in EMITTED if n.library is not None)
GPU_ONLY_ENV: tuple[str, ...] = tuple(n.name for n in EMITTED if n.kind == "env" and n.gpu_only)
GPU_ONLY_FEATURES: frozenset[str] = frozenset(
    n.feature for n in EMITTED if n.gpu_only and n.feature is not None
)


@dataclass(frozen=True)
class Capabilities:
    """What the target vLLM reads beyond stock 0.28.0 (from its manifest)."""

    env: frozenset[str] = frozenset()
    flags: frozenset[str] = frozenset()
    features: frozenset[str] = frozenset()
    patches: tuple[str, ...] = ()
    source: str = "stock vLLM 0.28.0 (no patch manifest found)"
    """Where these came from, for messages."""

    def has(self, need: Emitted) -> bool:
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


def missing_error(need: Emitted, knob: str, value: str, caps: Capabilities) -> Qwen3090Error:
    """The error for a knob the user set whose value needs a patch this build lacks.

    The fix names knobs (flags, variables, --config keys of ``plan``/``serve``) and, where this
    repository carries the patch, ``--manifest`` of a build that applied it."""
    flag = "--" + knob.lower().replace("_", "-")
    unset = f"leave {knob} unset (no {flag}, no {knob} variable or --config key)"
    alternative = f", or set {need.instead}" if need.instead else ""
    if need.provided_by is not None:
        return Qwen3090Error(
            f"{knob}={value} needs {need.name} ({need.what}), which patches/{need.provided_by} "
            f"provides (capability {need.feature!r}); this vLLM is {caps.source} and lacks it",
            fix=f"{unset}{alternative}; or serve a vLLM built with this repository's patch "
            f"series, which applies {need.provided_by} (the Nix package does; `--manifest "
            "FILE` plans against such a build's manifest)",
        )
    return Qwen3090Error(
        f"{knob}={value} needs {need.name} ({need.what}), capability {need.feature!r}, which is "
        f"{NOT_IN_REPOSITORY}: no patch here provides it, and this vLLM is {caps.source}",
        fix=f"{unset}{alternative}; a vLLM built elsewhere whose manifest lists {need.name} "
        "can serve it (`--manifest FILE` plans against that manifest)",
    )
