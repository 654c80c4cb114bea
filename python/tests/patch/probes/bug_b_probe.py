"""Probe for the Bug B regression test (no patch): how 0.28.0 classifies a batch for CUDA
graph dispatch, on the V2 runner (which knows about prefills) and the V1 runner (shape only),
and which runner a Qwen3.5-architecture target gets with MTP and with DFlash2.

The Bug B batch: a prefix-cache hit leaves the last 4 prompt tokens to compute, the same
shape as a k=3 MTP verify step (1 request, 4 tokens).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import types
from pathlib import Path
from typing import Any

import numpy as np
from _result import report

PROMPT_LEN = 25084
CACHED = 25080
QUERY_LEN = 4


def v2_dispatch() -> dict[str, Any]:
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor, _is_compatible
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.utils import get_uniform_decode_token_count

    def gather(computed: int) -> tuple[bool | None, int | None]:
        runner = types.SimpleNamespace(
            decode_query_len=QUERY_LEN,
            adaptive_verification=None,
            req_states=types.SimpleNamespace(
                req_id_to_index={"r": 0},
                prefill_len=types.SimpleNamespace(np=np.array([PROMPT_LEN], dtype=np.int32)),
                num_computed_prefill_tokens=np.array([computed], dtype=np.int32),
            ),
        )
        scheduler_output = types.SimpleNamespace(
            num_scheduled_tokens={"r": QUERY_LEN},
            total_num_scheduled_tokens=QUERY_LEN,
            scheduled_spec_decode_tokens={} if computed < PROMPT_LEN else {"r": [1, 2, 3]},
        )
        state, uniform = GPUModelRunner.gather_batch_req_state(
            runner, scheduler_output, False)  # type: ignore[arg-type]
        return (None if state is None else bool(state.has_prefill)), uniform

    full = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.FULL, num_tokens=QUERY_LEN,
                                    num_reqs=1, uniform_token_count=QUERY_LEN)
    piecewise = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.PIECEWISE,
                                         num_tokens=QUERY_LEN, num_reqs=None)
    prefill_state, prefill_uniform = gather(CACHED)
    decode_state, decode_uniform = gather(PROMPT_LEN)
    return {
        "uniform_with_prefill": get_uniform_decode_token_count(1, QUERY_LEN, QUERY_LEN, True),
        "uniform_without_prefill": get_uniform_decode_token_count(1, QUERY_LEN, QUERY_LEN,
                                                                  False),
        "gather_prefill": [prefill_state, prefill_uniform],
        "gather_decode": [decode_state, decode_uniform],
        "full_graph_takes_prefill": _is_compatible(full, 1, QUERY_LEN, prefill_uniform, 0,
                                                   QUERY_LEN),
        "full_graph_takes_decode": _is_compatible(full, 1, QUERY_LEN, decode_uniform, 0,
                                                  QUERY_LEN),
        "piecewise_takes_prefill": _is_compatible(piecewise, 1, QUERY_LEN, prefill_uniform, 0,
                                                  QUERY_LEN),
    }


def v1_uniform_decode() -> bool:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    # The V1 runner's classifier sees only the shape; a 4-token prompt chunk passes.
    return bool(GPUModelRunner._is_uniform_decode(
        max_num_scheduled_tokens=QUERY_LEN, uniform_decode_query_len=QUERY_LEN,
        num_tokens=QUERY_LEN, num_reqs=1))


def runner_choice() -> dict[str, Any]:
    from vllm.config import VllmConfig
    from vllm.config.vllm import DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES

    # Read the Qwen3.5 classes' bases from the source: importing the module pulls in the
    # vision stack (torchvision), which this CPU environment lacks.
    spec = importlib.util.find_spec("vllm.model_executor.models.qwen3_5")
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    bases = {node.name: [ast.unparse(b) for b in node.bases]
             for node in tree.body if isinstance(node, ast.ClassDef)}
    hybrid = {name: "IsHybrid" in bases[name] or "IsHybrid" in bases.get(bases[name][0], [])
              for name in ("Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM")}

    def use_v2(architecture: str, method: str, draft_architecture: str | None) -> bool:
        config = object.__new__(VllmConfig)
        model = types.SimpleNamespace(runner_type="generate", architectures=[architecture],
                                      is_hybrid=True, is_attention_free=False, is_moe=False,
                                      is_diffusion=False)
        draft = None if draft_architecture is None else types.SimpleNamespace(
            architectures=[draft_architecture],
            hf_config=types.SimpleNamespace(layer_types=None))
        values = {
            "model_config": model,
            "parallel_config": types.SimpleNamespace(prefill_context_parallel_size=1),
            "speculative_config": types.SimpleNamespace(method=method,
                                                        draft_model_config=draft),
        }
        for key, value in values.items():
            object.__setattr__(config, key, value)
        return bool(config.use_v2_model_runner)

    arch = "Qwen3_5ForConditionalGeneration"
    choice = {
        "hybrid": hybrid,
        "default_v2_architectures": sorted(DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES),
        "mtp": use_v2(arch, "mtp", None),
        "dflash2": use_v2(arch, "dflash", "DFlash2DraftModel"),
    }
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    choice["mtp_forced_v2"] = use_v2(arch, "mtp", None)
    os.environ.pop("VLLM_USE_V2_MODEL_RUNNER")
    return choice


def main() -> None:
    os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    report({"v2": v2_dispatch(), "v1_shape_only_uniform": v1_uniform_decode(),
            "runner": runner_choice()})


if __name__ == "__main__":
    main()
