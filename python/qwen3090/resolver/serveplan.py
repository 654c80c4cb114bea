"""The resolver's output: what ``serve`` runs, decided completely before anything starts."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Launcher = Literal["cli", "api_server"]
"""How vLLM is started: ``cli`` is ``python -m vllm.entrypoints.cli.main serve MODEL ...``;
``api_server`` the OpenAI server module, which ignores a positional model (``--model`` then)."""

CLI_MODULE = "vllm.entrypoints.cli.main"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


@dataclass(frozen=True)
class MemoryEstimate:
    """Gotcha 25's model of one request: 64 KiB x context + 102 MiB x (k + 2) at bf16."""

    kv_bytes_per_token: int
    """Whole-model KV bytes per token for the plan's KV dtype."""
    fixed_bytes_per_request: int
    """102 MiB x (k + 2): the aligned recurrent-state pages (k = 0 without a speculator)."""
    request_bytes_at_max_len: int
    """One request filling ``--max-model-len``."""
    pool_bytes: int | None
    """The pinned KV pool, or None when vLLM sizes it from the memory fraction."""
    full_length_requests: float | None
    """How many max-length requests the pinned pool holds."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "formula": "kv_bytes_per_token x context + 102 MiB x (k + 2)",
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "fixed_bytes_per_request": self.fixed_bytes_per_request,
            "request_bytes_at_max_len": self.request_bytes_at_max_len,
            "pool_bytes": self.pool_bytes,
            "full_length_requests": self.full_length_requests,
        }


@dataclass(frozen=True)
class ServePlan:
    """What ``serve`` runs, decided completely before anything starts."""

    profile: str
    device: str
    model: str
    """The target model directory (``vllm_args[0]``)."""
    draft: str | None
    """The DFlash2 drafter directory, when SPEC=dflash2."""
    vllm_args: tuple[str, ...]
    """Exactly what follows ``vllm serve``: the model first, then flags."""
    env: Mapping[str, str]
    """Variables ``serve`` sets for vLLM (on top of the inherited environment)."""
    warnings: tuple[str, ...]
    memory: MemoryEstimate
    port: int
    host: str
    api_key_file: str | None
    launcher: Launcher
    python: str
    """The interpreter that runs vLLM (the one running qwen3090, so a virtualenv or Nix
    wrapper cannot point it at a different vLLM)."""

    @property
    def argv(self) -> tuple[str, ...]:
        """The full command ``serve`` execs: follows ``vllm_args`` when they change."""
        if self.launcher == "cli":
            return (self.python, "-m", CLI_MODULE, "serve", *self.vllm_args)
        model, *rest = self.vllm_args
        return (self.python, "-m", API_SERVER_MODULE, "--model", model, *rest)

    def flag(self, name: str) -> str | None:
        """The value following ``name`` in vllm_args (last occurrence); None if absent."""
        args = list(self.vllm_args)
        for i in range(len(args) - 1, -1, -1):
            if args[i] == name:
                return args[i + 1] if i + 1 < len(args) else ""
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "device": self.device,
            "model": self.model,
            "draft": self.draft,
            "vllm_args": list(self.vllm_args),
            "env": dict(self.env),
            "warnings": list(self.warnings),
            "argv": list(self.argv),
            "memory": self.memory.to_dict(),
            "host": self.host,
            "port": self.port,
            "auth": "api-key-file" if self.api_key_file else "VLLM_API_KEY or none",
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def describe(plan: ServePlan) -> str:
    """The human form of a plan (``qwen3090 plan`` without ``--json``)."""
    lines = [f"profile: {plan.profile}   device: {plan.device}   model: {plan.model}"]
    if plan.draft:
        lines.append(f"draft: {plan.draft}")
    lines.append("env:")
    lines += [f"  {k}={v}" for k, v in plan.env.items()] or ["  (none)"]
    lines.append("command:")
    lines.append("  " + shlex.join(plan.argv))
    m = plan.memory
    lines.append(
        f"memory: {m.kv_bytes_per_token} B/token x context + {m.fixed_bytes_per_request >> 20} "
        f"MiB per request; one {plan.flag('--max-model-len')}-token request = "
        f"{m.request_bytes_at_max_len / (1 << 30):.2f} GiB"
        + (f"; the {m.pool_bytes / (1 << 30):.2f} GiB pool holds {m.full_length_requests} of them"
           if m.pool_bytes else "; pool sized by --gpu-memory-utilization")
    )
    if plan.warnings:
        lines.append("warnings:")
        lines += [f"  - {w}" for w in plan.warnings]
    return "\n".join(lines)
