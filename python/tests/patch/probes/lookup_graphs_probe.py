"""Probe for dflash2-lookup.patch's decode graphs (gotcha 23), run inside a vLLM tree (stock or
patched) on the CPU.

It computes the CUDA graphs the V2 runner's target-model graph manager would capture for a
DFlash2 server with K draft tokens, and where a short and a long uniform-decode step dispatch,
from the real code path: the patched DFlash2Speculator's ``__init__`` (reading the registered
VLLM_DFLASH2_* variables from the caller's environment), the runner's own
``lookup_decode_query_lens`` and the real ``ModelCudaGraphManager`` on a real ``VllmConfig``.
Stood in for: the base DFlashSpeculator's ``__init__`` (it loads the drafter and allocates GPU
buffers; the stand-in sets what DFlash2 reads), the runner's ``__init__`` (it allocates pinned
and GPU memory; the two attributes the method reads are set here) and the capture itself (it
needs a GPU), so the platform's graph pool is a placeholder and ``_graphs_captured`` is set
by hand before dispatching. On the stock tree,
which has no lookup, the manager is built exactly as stock ``load_model`` builds it.

argv[1]: sync | async (the scheduler's async_scheduling).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from _dflash_stand_in import stand_in_init

K = 15
MAX_REQS = 4
CAPTURE_SIZES = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]


def report(result: dict[str, Any]) -> None:
    sys.stdout.write("QWEN3090-PROBE " + json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()


def init_single_process_groups(config: Any, scratch: Path) -> None:
    """World size 1 on gloo through a file, no port: the manager asks for its PP rank."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
    )

    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{scratch / 'dist'}")
        initialize_model_parallel(1, 1)


def extra_lens(config: Any) -> tuple[int, ...] | None:
    """What the patched runner hands its graph manager; None on a tree without the lookup."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
    from vllm.v1.worker.gpu.spec_decode.dflash2.speculator import DFlash2Speculator

    if not hasattr(GPUModelRunner, "lookup_decode_query_lens"):
        return None

    DFlashSpeculator.__init__ = stand_in_init(  # type: ignore[method-assign,assignment]
        K, MAX_REQS)
    runner: Any = object.__new__(GPUModelRunner)
    runner.speculator = DFlash2Speculator(config, torch.device("cpu"))
    runner.num_speculative_steps = K
    runner.decode_query_len = K + 1  # DFlash2 samples one new token a step
    lens: tuple[int, ...] = runner.lookup_decode_query_lens()
    return lens


def describe(desc: Any) -> dict[str, Any]:
    return {"mode": desc.cg_mode.name, "num_tokens": desc.num_tokens,
            "num_reqs": desc.num_reqs, "uniform": desc.uniform_token_count}


def main() -> None:
    from vllm.config import SchedulerConfig, VllmConfig
    from vllm.config.compilation import CUDAGraphMode
    from vllm.platforms import current_platform
    from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager

    config = VllmConfig(scheduler_config=SchedulerConfig(
        max_num_seqs=MAX_REQS, max_num_batched_tokens=2048, max_model_len=2048,
        is_encoder_decoder=False))
    # A VllmConfig without a model or an executor turns graphs and async scheduling off; set
    # what the runner would see on a served DFlash2 configuration.
    config.scheduler_config.async_scheduling = sys.argv[1] == "async"
    config.compilation_config.cudagraph_capture_sizes = CAPTURE_SIZES
    config.compilation_config.max_cudagraph_capture_size = CAPTURE_SIZES[-1]
    with tempfile.TemporaryDirectory() as scratch:
        init_single_process_groups(config, Path(scratch))
        extra = extra_lens(config)
        # The CPU platform has no graph pool; the manager only hands it to the capture.
        type(current_platform)._global_graph_pool = object()
        kwargs: dict[str, Any] = {} if extra is None else {"extra_decode_query_lens": extra}
        manager = ModelCudaGraphManager(config, torch.device("cpu"),
                                        CUDAGraphMode.FULL_AND_PIECEWISE,
                                        decode_query_len=K + 1, **kwargs)
    manager._graphs_captured = True  # capture itself needs a GPU

    def step(num_reqs: int, query_len: int) -> dict[str, Any]:
        desc = manager.dispatch(num_reqs, num_reqs * query_len, query_len, 0,
                                max_query_len=query_len)
        return describe(desc)

    full = manager._capture_descs.get(CUDAGraphMode.FULL, [])
    report({
        "patched": extra is not None,
        "extra": None if extra is None else list(extra),
        "full_uniform_lens": sorted({d.uniform_token_count for d in full}),
        "full_graphs": sorted((d.uniform_token_count, d.num_reqs) for d in full),
        "num_piecewise": len(manager._capture_descs.get(CUDAGraphMode.PIECEWISE, [])),
        "short": [step(n, 8) for n in range(1, MAX_REQS + 1)],
        "long": [step(n, K + 1) for n in range(1, MAX_REQS + 1)],
    })


if __name__ == "__main__":
    main()
