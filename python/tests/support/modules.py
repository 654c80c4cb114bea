"""A Python file loaded as a module under a name of the test's choosing.

The tests load overlay files and benchmark scripts by path rather than by import: the real
``vllm`` package stays out of the unit tier, and two versions of one script can sit side by
side under two names.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_module(path: Path, name: str) -> ModuleType:
    """``path`` executed as module ``name``, registered in ``sys.modules`` first (dataclasses
    look their module up there while decorating)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
