"""The kvarn kernel tests load the overlay module itself, with its Triton kernels built for
the CPU interpreter (TRITON_INTERPRET=1 is read when a kernel is decorated, so it is set
only while the module loads): no patched vLLM tree, no GPU."""

from __future__ import annotations

from types import ModuleType

import pytest
from kvarn_ref import load_kvarn


@pytest.fixture(scope="session")
def kvarn() -> ModuleType:
    return load_kvarn()


@pytest.fixture(autouse=True)
def _interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton also reads TRITON_INTERPRET while launching an interpreted kernel; it is set
    per test so that tests outside this folder never see it."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
