"""Which of vLLM's CPU kernel builds a worker process loads.

vLLM's CPU wheel builds ``vllm._C`` for x86 CPUs with AVX-512 BF16 and ships ``_C_AVX2`` and
``_C_AVX512`` beside it; ``CpuPlatform.import_kernels`` loads the one this CPU runs. A patch-tier
worker that runs with no device visible does not resolve to ``CpuPlatform``, and the platform
it gets imports ``vllm._C`` whatever the CPU: on an x86 CPU without AVX-512 BF16 the process
dies with SIGILL while loading it (seen on a development machine with AVX2 only).
"""

from __future__ import annotations

import functools
import subprocess
import sys
import types


def load_cpu_kernels_for_this_cpu() -> None:
    """Load the kernels CpuPlatform picks for this CPU (their ops register under the same
    name) and mark ``vllm._C`` imported, so no later import loads the AVX-512 BF16 build on a
    CPU that lacks it. A CPU that has it keeps vLLM's own path. The patched tree must be on
    sys.path."""
    import torch

    if torch.cpu._is_avx512_bf16_supported():
        return
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.import_kernels()
    sys.modules.setdefault("vllm._C", types.ModuleType("vllm._C"))


_SHOW_OP = """
import sys, torch
from vllm.platforms.cpu import CpuPlatform
CpuPlatform.import_kernels()
print(hasattr(torch.ops._C, sys.argv[1]))
"""


@functools.cache
def cpu_kernels_have(op: str) -> bool:
    """Whether the kernels CpuPlatform loads on this CPU register ``torch.ops._C.<op>``.
    Asked in a fresh process (it imports vLLM's CPU kernels); the installed vLLM is asked."""
    proc = subprocess.run([sys.executable, "-c", _SHOW_OP, op], capture_output=True, text=True,
                          timeout=300, check=False)
    answer = proc.stdout.strip().splitlines()[-1:] if proc.returncode == 0 else []
    if answer not in (["True"], ["False"]):
        raise RuntimeError(f"could not ask vLLM's CPU kernels for {op} (exit "
                           f"{proc.returncode}):\n{proc.stderr[-2000:]}")
    return answer == ["True"]
