"""The Qwen3.5 tests use the real vLLM trees of ``plugins.vllm_trees``; it is imported here too
so they run before tests/conftest.py registers it (importing twice is a no-op)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_TESTS_DIR = Path(__file__).resolve().parents[1]
if str(_TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(_TESTS_DIR))


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.import_plugin("plugins.vllm_trees")
