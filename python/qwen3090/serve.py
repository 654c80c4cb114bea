"""From a ServePlan to a running vLLM: the exec command, the pre-flight checks, the exec.

``serve`` replaces its own process with vLLM (``os.execvpe``), so signals reach vLLM directly
and vLLM's exit code is the service's exit code; nothing of qwen3090 stays resident.

Which command: the plan's ``argv`` (``qwen3090.resolver.render`` picks the launcher: where the
``vllm`` distribution is installed, or the build's manifest says the ``cpu-dist-name`` patch
made its CLI work, ``python -m vllm.entrypoints.cli.main serve MODEL ...``; on the stock CPU
wheel, whose CLI dies asking for the ``vllm`` distribution, the OpenAI API server module).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from qwen3090.apikey import API_KEY_ENV, read_api_key
from qwen3090.capabilities import Capabilities
from qwen3090.errors import Qwen3090Error
from qwen3090.plan import ServePlan

if TYPE_CHECKING:
    from qwen3090.gate import GatePolicy


def check_models(plan: ServePlan, caps: Capabilities) -> None:
    """The model/tokenizer checks (``qwen3090.modelcheck``) on every directory vLLM will load,
    and that this vLLM can import the target's model class at all."""
    from qwen3090 import modelcheck

    dirs: list[tuple[Path, str]] = [(Path(plan.model), "target")]
    if plan.draft is not None:
        dirs.append((Path(plan.draft), "draft"))
    modelcheck.require_model_dirs(dirs, device=plan.device)
    check_qwen3_5_imports(Path(plan.model), caps)


def check_qwen3_5_imports(model: Path, caps: Capabilities) -> None:
    """Stock vLLM 0.28.0 imports transformers' torchvision-backed image processor for every
    Qwen3.5 class, text-only too; without torchvision the server dies ~15 s into its start
    with a bare ModuleNotFoundError. Say so before starting it."""
    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return  # the model check above owns that failure
    architectures = config.get("architectures") or []
    if not any(str(a).startswith("Qwen3_5") for a in architectures):
        return
    if caps.has_feature("qwen3_5-text-only") or importlib.util.find_spec("torchvision"):
        return
    raise Qwen3090Error(
        f"{model} is a {architectures[0]} model, which this vLLM imports only together with "
        "torchvision-backed image processing, and torchvision is not installed",
        fix="use a vLLM with the qwen3_5-text-only-imports patch (python/dev.sh applies the "
        "series), or install a torchvision that matches torch",
    )


# What the gate's own errors suggest names `qwen3090 gate`'s flags; under serve, only serve's
# flags may be suggested (the NixOS unit maps its gpuGate options onto these).
SERVE_GATE_FIX = (
    "stop those processes (or wait for them), or raise --gate-timeout / --gate-threshold-mib "
    "if what holds the card is meant to stay, or skip the gate with --no-gate"
)
SERVE_NO_GPU_FIX = (
    "check the driver (nvidia-smi must list the card), or serve on the CPU with --device cpu"
)
SERVE_PROBE_FIX = "check the driver (nvidia-smi), or skip the gate with --no-gate"
GATE_TIMEOUT_EXIT = 3  # qwen3090.gate.run_gate's exit status for a card that did not come free
_GATE_CPU_HINT = "; a CPU plan passes with --plan-device cpu"


def check_environment(
    plan: ServePlan, caps: Capabilities, environ: Mapping[str, str]
) -> None:
    """Refuse inherited ``VLLM_*`` / ``KVARN_*`` variables this build does not read, those a
    knob owns, and any variable whose value conflicts with the plan's (issue 19, items 1-2):
    serve never replaces a user's value silently, and never passes one that does nothing."""
    from qwen3090.vllm_envs import environment_problems

    problems = environment_problems(plan.env, environ, caps)
    if problems:
        raise Qwen3090Error(
            "the environment sets variables the plan cannot honour:\n  - "
            + "\n  - ".join(problems),
            fix="unset them before `qwen3090 serve` and use the knobs named above (flags, "
            "variables or --config keys; `qwen3090 knobs` lists them)",
        )


def gate_gpu(
    plan: ServePlan, policy: GatePolicy | None = None
) -> tuple[list[str], int | None]:
    """The GPU-free gate (``qwen3090.gate``) before vLLM profiles memory (gotcha 2), with
    ``policy`` (serve's --gate-* flags; the gate's defaults when None).

    Returns the gate's warnings and the MiB the card had in use when it passed (None when
    nothing was read); raises when the card does not come free, with a fix that names serve's
    flags."""
    if plan.device != "cuda":
        return [], None
    from qwen3090 import gate
    from qwen3090.gpuprobe import NoNvidiaGpu

    try:
        report = gate.run_gate(
            policy or gate.default_policy(),
            kv_mem_pinned=plan.flag("--kv-cache-memory-bytes") is not None,
            plan_device=plan.device,
        )
    except NoNvidiaGpu as err:
        raise Qwen3090Error(
            err.message.removesuffix(_GATE_CPU_HINT), fix=SERVE_NO_GPU_FIX,
            exit_code=err.exit_code,
        ) from None
    except Qwen3090Error as err:
        fix = SERVE_GATE_FIX if err.exit_code == GATE_TIMEOUT_EXIT else SERVE_PROBE_FIX
        raise Qwen3090Error(err.message, fix=fix, exit_code=err.exit_code) from None
    print(f"qwen3090: {report.summary}", file=sys.stderr)
    last = report.outcome.last if report.outcome is not None else None
    return list(report.warnings), (last.used_mib if last is not None else None)


def with_loader(
    plan: ServePlan, caps: Capabilities, mode: str = "auto"
) -> tuple[ServePlan, str | None]:
    """Add the Run:ai streamer arguments when this host's RAM cannot hold the checkpoint
    beside the engine (gotcha 41), or when ``mode`` is "on"; returns the plan and the reason.

    A runtime fact (available RAM now), so ``serve`` decides it, not ``plan``; a
    ``--load-format`` the user passed in EXTRA_ARGS always wins."""
    from qwen3090 import loading

    if mode == "off" or plan.flag("--load-format") is not None:
        return plan, None
    total, largest = loading.checkpoint_size(Path(plan.model))
    args, reason = loading.load_format_args(
        total,
        loading.available_ram_bytes(),
        True if mode == "on" else None,
        largest_tensor_bytes=largest or None,
    )
    if not args:
        return plan, None
    problem = loading.streamer_problem()
    if problem:
        raise Qwen3090Error(f"{reason}, but {problem}", fix="pip install runai-model-streamer")
    # argv follows vllm_args: the launcher was decided with the plan.
    return replace(plan, vllm_args=(*plan.vllm_args, *args)), reason


def child_env(plan: ServePlan, base: Mapping[str, str]) -> dict[str, str]:
    """The environment vLLM runs with: the inherited one, the cache directories of this build
    (``qwen3090.caches``; a variable the caller already set wins), the plan's, and the API
    key."""
    from qwen3090 import caches
    from qwen3090.manifest import find_installed_manifest

    env = dict(base)
    for name, value in caches.cache_env(None, find_installed_manifest(), env).items():
        env.setdefault(name, value)
    env.update(plan.env)
    if plan.api_key_file:
        env[API_KEY_ENV] = read_api_key(plan.api_key_file, "API_KEY_FILE (--api-key-file)")
    return env


def exec_plan(
    plan: ServePlan,
    caps: Capabilities,
    *,
    gate: GatePolicy | None,
    loader: str = "auto",
    replan: Callable[[int], ServePlan] | None = None,
) -> None:
    """Run the pre-flight checks, gate with ``gate`` (None: no gate), print the plan's
    warnings, then become vLLM.

    ``replan`` re-resolves the plan with the MiB the gate measured in use (gotcha 31: a
    pinned pool is lowered by other processes' memory, or refused when it then cannot hold
    one request); without it the plan stays as resolved."""
    check_environment(plan, caps, os.environ)
    check_models(plan, caps)
    if gate is not None:
        gate_warnings, used_mib = gate_gpu(plan, gate)
        if replan is not None and used_mib is not None:
            plan = replan(used_mib)
        warnings = [*plan.warnings, *gate_warnings]
    else:
        warnings = list(plan.warnings)
    plan, reason = with_loader(plan, caps, loader)
    if reason:
        warnings.append(reason)
    for w in warnings:
        print(f"qwen3090: warning: {w}", file=sys.stderr)
    env = child_env(plan, os.environ)
    print("qwen3090: exec " + " ".join(plan.argv), file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.execvpe(plan.argv[0], list(plan.argv), env)
