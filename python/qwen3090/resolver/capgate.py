"""Capability checks before the plan emits anything a patch provides (DESIGN.md "capability
gating"). Named apart from ``qwen3090.gate``, which waits for a free GPU."""

from __future__ import annotations

from qwen3090.capabilities import NEEDS, Capabilities, missing_error
from qwen3090.resolver.builder import PlanBuilder


class CapabilityGate:
    """The explicit/default semantics of ``qwen3090.capabilities`` over one plan builder."""

    def __init__(self, caps: Capabilities, plan: PlanBuilder) -> None:
        self.caps = caps
        self.plan = plan

    def reads(self, need_name: str) -> bool:
        """The build reads ``need_name`` (its patch is applied)."""
        return self.caps.has(NEEDS[need_name])

    def admit(
        self, need_name: str, value: str, *, knob: str | None, explicit: bool,
        setting: str | None = None,
    ) -> bool:
        """True: emit it. False: dropped (recorded). Raises when an explicit knob needs it.

        ``value`` is what the plan would emit; ``setting`` is the knob's own value when the two
        differ (CTX=huge selects the KVarN dtype), so the error names what the user typed."""
        need = NEEDS[need_name]
        if self.caps.has(need):
            return True
        if explicit and knob is not None:
            raise missing_error(need, knob, value if setting is None else setting, self.caps)
        assert need.feature is not None  # NEEDS holds patch rows only
        self.plan.dropped.setdefault(need.feature, []).append(f"{need.name}={value}")
        return False

    def admit_env(
        self, name: str, value: str, *, knob: str | None, explicit: bool,
        setting: str | None = None,
    ) -> bool:
        """Set ``name=value`` in the plan's environment when allowed; True when set."""
        if self.admit(name, value, knob=knob, explicit=explicit, setting=setting):
            self.plan.env[name] = value
            return True
        return False

    def restate_stock(self, name: str, value: str) -> None:
        """A patch variable set to its stock-equivalent value: emit only if readable."""
        if self.reads(name):
            self.plan.env[name] = value
