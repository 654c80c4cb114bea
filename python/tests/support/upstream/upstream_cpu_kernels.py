"""pytest plugin loaded into the runs of vLLM's own tests (``-p upstream_cpu_kernels``).

Some of vLLM's test modules import ``vllm.platforms.rocm`` (or ``vllm._C`` itself) while they
are collected, and that imports ``vllm._C``: the CPU wheel's AVX-512 BF16 build. On an x86 CPU
without AVX-512 BF16 loading it aborts the process, so under xdist a worker dies during
collection and the side records no test at all (a CI machine with AVX2 only: 0 ran on both
trees). vLLM's CpuPlatform loads ``_C_AVX2`` / ``_C_AVX512`` there instead; this plugin does
the same before anything is collected, on both sides alike. A CPU with AVX-512 BF16 keeps
vLLM's own path.

It runs inside vLLM's test environment, where our ``tests`` package is shadowed by vLLM's, so
it loads ``tests/support/cpu_kernels.py`` by its path.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SHARED = Path(__file__).resolve().parent.parent / "cpu_kernels.py"


def _load_cpu_kernels() -> None:
    spec = importlib.util.spec_from_file_location("qwen3090_cpu_kernels", _SHARED)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {_SHARED}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.load_cpu_kernels_for_this_cpu()


# At import, not in a hook: ``-p`` plugins are imported before vLLM's conftest.py and before
# xdist workers collect.
_load_cpu_kernels()
