"""Fixtures of the pipeline tests: tiny fake vLLM trees and purpose-built patches.

The real-tree fixtures come from the ``plugins.vllm_trees`` plugin; it is imported here too
so these tests run even before tests/conftest.py registers it (importing twice is a no-op).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_TESTS_DIR = Path(__file__).resolve().parents[1]
if str(_TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(_TESTS_DIR))


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.import_plugin("plugins.vllm_trees")
