"""Run a probe script (``probes/``) in a vLLM tree and read its result (see conftest.py)."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import patchtrees

PROBES_DIR = Path(__file__).resolve().parents[1] / "patch" / "probes"
# A probe prints its findings as one JSON object on a line starting with this marker; vLLM's
# own logging shares stdout, so the marker is what tells the two apart.
RESULT_MARKER = "QWEN3090-PROBE "
# Probes are deterministic; one run per (tree, probe, env, args) serves every test that asks.
_RESULTS: dict[tuple[str, str, tuple[tuple[str, str], ...], tuple[str, ...]], dict[str, Any]] = {}


@dataclass(frozen=True)
class Tree:
    """One vLLM tree under test: ``kind`` is "stock" (pristine) or "patched"."""

    kind: str
    path: Path

    @property
    def patched(self) -> bool:
        return self.kind == "patched"

    def probe(
        self, name: str, env: Mapping[str, str] | None = None, args: Sequence[str] = ()
    ) -> dict[str, Any]:
        """Run ``probes/<name>.py`` with this tree's vllm first on the path; its result."""
        key = (str(self.path), name, tuple(sorted((env or {}).items())), tuple(args))
        if key in _RESULTS:
            return copy.deepcopy(_RESULTS[key])
        proc = patchtrees.run_in_tree(self.path, PROBES_DIR / f"{name}.py", env=env, args=args)
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"probe {name} failed on the {self.kind} tree:\n{output}"
        results = [line[len(RESULT_MARKER):] for line in proc.stdout.splitlines()
                   if line.startswith(RESULT_MARKER)]
        assert len(results) == 1, f"probe {name} printed no single result:\n{output}"
        result: dict[str, Any] = json.loads(results[0])
        result["_output"] = output
        _RESULTS[key] = result
        return copy.deepcopy(result)


