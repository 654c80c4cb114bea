"""Fixtures of the gate/check tests: one generated model dir per session, copied per test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tinymodel import write_tiny_qwen3


@pytest.fixture(scope="session")
def tiny_model_master(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete three-shard Qwen3 dir; never modified (tests copy it)."""
    return write_tiny_qwen3(tmp_path_factory.mktemp("tiny-master") / "Qwen3-tiny")


@pytest.fixture
def tiny_model(tiny_model_master: Path, tmp_path: Path) -> Path:
    """A fresh copy of the generated model dir, for a test to damage."""
    dest = tmp_path / "models" / "Qwen3-tiny"
    shutil.copytree(tiny_model_master, dest)
    return dest
