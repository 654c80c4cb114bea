"""How a probe reports: one marked JSON line on stdout (see ../conftest.py)."""

from __future__ import annotations

import json
import sys
from typing import Any

RESULT_MARKER = "QWEN3090-PROBE "


def report(result: dict[str, Any]) -> None:
    sys.stdout.write(RESULT_MARKER + json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()
