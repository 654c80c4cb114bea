"""Probe for hybrid-kv-groups-v2-cudagraph.

1. The V2 model runner's ``profile_cudagraph_memory`` (the real method; ``self`` carries only
   the compilation config it reads) with VLLM_V2_CUDAGRAPH_MEM_MIB set, graphs on and off.
2. The real ``Worker.determine_available_memory`` fed that runner: 22 GiB requested, 15 GiB
   of non-KV memory. What a CPU machine cannot run is stood in for: the CUDA platform check
   and the GPU memory profiler (``memory_profiling`` yields the 15 GiB result).
3. ``_get_kv_cache_groups_uniform_page_size`` on the deployment's 69 layers: 48 recurrent
   (mamba), 16 full attention, 5 drafter sliding-window layers, pages already unified.
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Iterator
from typing import Any

from _result import report

GIB = 1 << 30
ESTIMATE_MIB = 1229


def runner_estimates() -> dict[str, int]:
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    out = {}
    for mode in (CUDAGraphMode.FULL_AND_PIECEWISE, CUDAGraphMode.NONE):
        runner = types.SimpleNamespace(
            compilation_config=types.SimpleNamespace(cudagraph_mode=mode))
        out[mode.name] = int(GPUModelRunner.profile_cudagraph_memory(runner))  # type: ignore[arg-type]
    return out


def worker_available_kv_bytes() -> int:
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker import gpu_worker
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    @contextlib.contextmanager
    def profiled(init_snapshot: Any, weights_memory: int) -> Iterator[Any]:
        after = types.SimpleNamespace(free_memory=init_snapshot.free_memory - 15 * GIB)
        yield types.SimpleNamespace(total_consumed=15 * GIB, transient_peak_headroom=0,
                                    non_kv_cache_memory=15 * GIB, after_profile=after)

    compilation = types.SimpleNamespace(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE)

    class Runner:
        model_memory_usage = 0
        compilation_config = compilation
        profile_cudagraph_memory = GPUModelRunner.profile_cudagraph_memory

        def profile_run(self) -> None:
            pass

    # The module's globals, which determine_available_memory reads at call time.
    vars(gpu_worker).update(
        memory_profiling=profiled,
        current_platform=types.SimpleNamespace(is_cuda_alike=lambda: True),
    )
    worker = types.SimpleNamespace(
        cache_config=types.SimpleNamespace(kv_cache_memory_bytes=None,
                                           gpu_memory_utilization=0.93),
        init_snapshot=types.SimpleNamespace(free_memory=23 * GIB, total_memory=24 * GIB),
        requested_memory=22 * GIB,
        model_runner=Runner(),
        vllm_config=types.SimpleNamespace(compilation_config=compilation),
        model_config=types.SimpleNamespace(multimodal_config=None),
        parallel_config=None,
    )
    return int(gpu_worker.Worker.determine_available_memory(worker))  # type: ignore[arg-type]


def groups() -> list[dict[str, Any]]:
    import torch
    from vllm.v1.core.kv_cache_utils import _get_kv_cache_groups_uniform_page_size
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

    page = 864 * 4 * 520
    full = FullAttentionSpec(block_size=864, num_kv_heads=4, head_size=256, dtype=torch.int8,
                             state_content_bytes=520, indexes_kv_by_block_stride=True)
    mamba = MambaSpec(block_size=864, shapes=((16, 1024),), dtypes=(torch.float16,),
                      page_size_padded=page, mamba_cache_mode="align")
    draft = SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=torch.int8,
                              state_content_bytes=264, sliding_window=2048,
                              indexes_kv_by_block_stride=True, page_size_padded=page)
    specs: dict[str, Any] = {}
    for i in range(64):
        if i % 4 == 3:
            specs[f"model.layers.{i}.self_attn.attn"] = full
        else:
            specs[f"model.layers.{i}.linear_attn"] = mamba
    for i in range(64, 69):
        specs[f"model.layers.{i}.self_attn.attn"] = draft
    return [{"kind": type(g.kv_cache_spec).__name__, "layers": len(g.layer_names)}
            for g in _get_kv_cache_groups_uniform_page_size(specs)]


def main() -> None:
    os.environ["VLLM_V2_CUDAGRAPH_MEM_MIB"] = str(ESTIMATE_MIB)
    report({
        "runner_estimate": runner_estimates(),
        "available_kv_bytes": worker_available_kv_bytes(),
        "groups": groups(),
    })


if __name__ == "__main__":
    main()
