"""Probe for int8-layer-select: the Marlin input dtype vLLM decides for every linear layer of
a model, built on the meta device from ``argv[1]`` (a model directory whose config.json holds
a ``quantization_config``), under this process's VLLM_MARLIN_* environment.

Prints, per layer prefix whose quantization method carries an input dtype: the effective
method's class and the dtype it got (None = 16-bit activations); the answer of
``get_marlin_input_dtype()`` without a layer name; and the compile-cache hash vLLM keys its
compile and AOT caches on (``hash_factors(envs.compile_factors())``).
"""

from __future__ import annotations

import socket
import sys
from typing import Any

from _result import report


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    import torch
    from vllm import envs
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.config.utils import hash_factors
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.quantization.utils.marlin_utils import (
        get_marlin_input_dtype,
    )
    from vllm.model_executor.model_loader.utils import initialize_model

    model_dir = sys.argv[1]
    model_config = ModelConfig(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True,
                               dtype="bfloat16")
    vllm_config = VllmConfig(model_config=model_config, device_config=DeviceConfig("cpu"))
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo",
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
        initialize_model_parallel(1, 1)
    # The meta device: every layer is built (quant method chosen, weights declared), no memory.
    with torch.device("meta"):
        model = initialize_model(vllm_config)

    layers: dict[str, dict[str, Any]] = {}
    for name, module in model.named_modules():
        if not isinstance(module, LinearBase):
            continue
        method: Any = module.quant_method
        # auto-round (INC) wraps the GPTQ/AWQ Marlin method in a scheme.
        method = getattr(getattr(method, "scheme", method), "inner_method",
                         getattr(method, "scheme", method))
        if hasattr(method, "input_dtype"):
            dtype = method.input_dtype
            layers[name] = {"method": type(method).__name__,
                            "dtype": None if dtype is None else str(dtype)}
    unnamed = get_marlin_input_dtype()
    report({
        "quant_config": type(vllm_config.quant_config).__name__,
        "layers": layers,
        "unnamed": None if unnamed is None else str(unnamed),
        "compile_hash": str(hash_factors(envs.compile_factors())),
        "in_compile_factors": "VLLM_MARLIN_INT8_INCLUDE_RE" in envs.compile_factors(),
    })


if __name__ == "__main__":
    main()
