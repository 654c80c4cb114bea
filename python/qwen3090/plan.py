"""The planner: Settings + build capabilities -> a complete ServePlan (argv included).

``resolve`` is the single entry point. Every rule and warning of PROFILES.md lives in
``qwen3090.resolver``, one stage per module, each the only owner of its rules; the numbers
come from ``qwen3090.profiles``. The stages run in this order over one
:class:`~qwen3090.resolver.builder.PlanBuilder`:

``common`` (model, server, tools) -> ``cpu.cpu_speculator`` (``--device cpu``) ->
``single_user`` (with ``dflash2`` and ``cudagraph``) or ``batch`` -> ``common.vision`` ->
``cpu.cpu_build`` (``--device cpu``; else ``memory.memory_rules``) -> ``render.finish``.

Choices PROFILES.md leaves open, made here:

- ``PREFIX_CACHE=0`` passes ``--no-enable-prefix-caching`` (vLLM would otherwise pick its own
  default per model); ``--enable-prompt-tokens-details`` is passed either way (gotcha 39).
- ``SPEC=off`` uses the mtp seat count and capture size (MAX_SEQS 8, CG 32).
- int8 activations default on only in ``batch`` (the table's section); in ``single-user`` they
  are off unless ``INT8_ACT`` is given, with ``INT8_LAYERS`` then defaulting to ``mlp``.
- The pool is pinned (``--kv-cache-memory-bytes``) where the table pins it (dflash2) or where
  ``KV_MEM`` is given; otherwise ``--gpu-memory-utilization``. Never both: vLLM ignores the
  fraction once the bytes are pinned, and a flag nothing reads is noise.
- A patch variable whose value only restates stock behaviour (``VLLM_SPEC_DECODE_ATTN=0``,
  ``LOOKUP=0``) is left out without a warning on a build that lacks the patch.

The API key never enters the plan: ``serve`` puts it into the child's environment.
"""

from __future__ import annotations

from qwen3090 import profiles as P
from qwen3090.capabilities import STOCK, Capabilities
from qwen3090.resolver.batch import batch
from qwen3090.resolver.builder import PlatformFacts
from qwen3090.resolver.capgate import CapabilityGate
from qwen3090.resolver.common import common, vision
from qwen3090.resolver.cpu import cpu_build, cpu_speculator
from qwen3090.resolver.memory import memory_rules
from qwen3090.resolver.render import finish
from qwen3090.resolver.serveplan import MemoryEstimate, ServePlan, describe
from qwen3090.resolver.single_user import single_user
from qwen3090.settings import Settings

__all__ = ["MemoryEstimate", "PlatformFacts", "ServePlan", "describe", "resolve"]


def resolve(
    settings: Settings,
    caps: Capabilities = STOCK,
    facts: PlatformFacts | None = None,
) -> ServePlan:
    """The ServePlan for ``settings`` on a vLLM with ``caps``; raises Qwen3090Error on a bad
    combination (nothing has been started or touched at that point)."""
    facts = facts or PlatformFacts()
    profile = settings.profile or P.DEFAULT_PROFILE
    device = settings.device or P.DEFAULT_DEVICE
    b = common(settings, facts, profile, device)
    gate = CapabilityGate(caps, b)
    if device == "cpu":
        cpu_speculator(settings, b)
    if profile == "single-user":
        single_user(settings, facts, b, gate)
    else:
        batch(settings, facts, b, gate)
    vision(settings, b, gate)
    if device == "cpu":
        cpu_build(settings, b)
    else:
        memory_rules(settings, facts, b)
    return finish(b, caps, facts)
