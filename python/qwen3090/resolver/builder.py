"""The plan while the stages build it, and the facts about the machine they read.

Every stage (``common``, ``single_user``, ``dflash2``, ``cudagraph``, ``batch``, ``cpu``)
reads :class:`~qwen3090.settings.Settings` and writes a :class:`PlanBuilder`; ``render`` turns
the finished builder into a :class:`~qwen3090.resolver.serveplan.ServePlan`.
"""

from __future__ import annotations

import importlib.metadata
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwen3090 import profiles as P
from qwen3090.pins import models_dir
from qwen3090.settings import CudagraphMode, Device, Profile, Settings


def _vllm_distribution_installed() -> bool:
    try:
        importlib.metadata.distribution("vllm")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@dataclass(frozen=True)
class PlatformFacts:
    """What the plan needs to know about the machine (injected, so plans are testable)."""

    wsl2: bool = False
    """Running under WSL2 (gotchas 3, 35, 53)."""
    foreign_gpu_mib: int | None = None
    """MiB in use on the server's card before it starts (the gate's reading, the driver's own
    share included; ``serve`` fills it); None when unknown (gotcha 31)."""
    api_key_env: bool = False
    """``$VLLM_API_KEY`` is set (authentication without a key file)."""
    cwd: Path = field(default_factory=Path.cwd)
    """Where a relative models directory is looked up."""
    models_dir: Path = field(default_factory=models_dir)
    """Where the default model and drafter directories are (``$QWEN3090_MODELS_DIR``)."""
    vllm_distribution: bool = field(default_factory=_vllm_distribution_installed)
    """The ``vllm`` distribution is installed (the CUDA wheel): its ``vllm serve`` CLI runs."""
    python: str = sys.executable
    """The interpreter that will run vLLM."""


@dataclass
class PlanBuilder:
    """The plan while the stages still change it."""

    profile: Profile
    device: Device
    model: str
    drafter: str | None = None
    """The DFlash2 drafter directory (SPEC=dflash2)."""
    host: str = P.DEFAULT_HOST
    port: int = P.DEFAULT_PORT
    api_servers: int = 1
    language_model_only: bool = True
    max_len: int = 0
    max_seqs: int = 0
    kv_mem: int | None = None
    gpu_util: float = 0.0
    attention_backend: str | None = None
    kv_cache_dtype: str | None = None
    block_size: int | None = None
    mamba_ssm_cache_dtype: str = P.MAMBA_SSM_CACHE_DTYPE
    prefix_cache: bool = False
    prefix_match_unit: int | None = None
    speculative: dict[str, Any] | None = None
    num_spec_tokens: int = 0
    async_scheduling: bool | None = None
    cg: int = 0
    """max_cudagraph_capture_size; 0 leaves it out (the CPU build captures no graphs)."""
    cudagraph_mode: CudagraphMode | None = None
    tool_parser: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    warnings: list[str] = field(default_factory=list)
    api_key_file: str | None = None
    dropped: dict[str, list[str]] = field(default_factory=dict)
    """Capability -> the ``NAME=value`` items dropped for its lack (one warning each)."""


def no_effect(settings: Settings, knobs: tuple[str, ...], why: str) -> list[str]:
    """One warning per knob the user gave that the plan does not read."""
    return [
        f"{k} (from {settings.source(k)}) has no effect: {why}" for k in knobs if settings.given(k)
    ]
