"""The planner's public names, for code that imports them from here: the resolver package
(``qwen3090.resolver``) holds them."""

from __future__ import annotations

from qwen3090.resolver import MemoryEstimate, PlatformFacts, ServePlan, describe, resolve

__all__ = ["MemoryEstimate", "PlatformFacts", "ServePlan", "describe", "resolve"]
