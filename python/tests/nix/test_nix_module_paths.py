"""services.qwen3090's directory options: what a relative path means, and the model default.

One rule, in the option descriptions: a relative modelDir names a directory under modelsDir
(where the fetch unit puts checkpoints); modelsDir and cacheDir, which the units write, must
be absolute and outside the read-only store. Needs NIXPKGS_LIB (see tests/support/nixeval.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from qwen3090.profiles import MODEL_NAMES
from tests.support.nixeval import REPO, eval_module, eval_module_error, exec_argv

pytestmark = pytest.mark.nix

MODELS = "/var/lib/qwen3090/models"


def _pins() -> dict[str, Any]:
    pins: dict[str, Any] = json.loads((REPO / "python" / "qwen3090" / "pins.json").read_text())
    return pins


def _served(summary: dict[str, Any]) -> str:
    """The model directory the unit serves, as the settings file and the check both say."""
    sc = summary["units"]["qwen3090"]["serviceConfig"]
    (check,) = [exec_argv(line) for line in sc["ExecStartPre"] if '"check"' in line]
    model: str = summary["configFile"]["value"]["model"]
    assert check[1:] == ["check", "model", model]
    return model


def test_a_relative_model_dir_is_taken_under_models_dir() -> None:
    summary = eval_module(
        '{ services.qwen3090 = { enable = true; modelsDir = "/srv/models"; '
        'modelDir = "Qwen3.8-27B-W4A16-AutoRound"; }; }'
    )
    assert _served(summary) == "/srv/models/Qwen3.8-27B-W4A16-AutoRound"
    absolute = eval_module(
        '{ services.qwen3090 = { enable = true; '
        'modelDir = "/data/Qwen3.8-27B-W4A16-AutoRound"; }; }'
    )
    assert _served(absolute) == "/data/Qwen3.8-27B-W4A16-AutoRound"


def test_an_empty_model_dir_is_refused() -> None:
    error = eval_module_error('{ services.qwen3090 = { enable = true; modelDir = ""; }; }')
    assert "services.qwen3090.modelDir" in error


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("modelsDir", "models"),
        ("cacheDir", "cache/qwen3090"),
        ("modelsDir", "/nix/store/0c4y4z8wklmnpqrsvwxyz0123456789a-models"),
    ],
)
def test_written_directories_must_be_absolute_and_outside_the_store(
    option: str, value: str
) -> None:
    error = eval_module_error(
        f'{{ services.qwen3090 = {{ enable = true; {option} = "{value}"; }}; }}'
    )
    assert f"services.qwen3090.{option}" in error
    assert "absolute path not in the Nix store" in error


def test_the_default_model_is_the_one_serve_would_pick_among_the_fetched() -> None:
    dirs = {name: model["dir"] for name, model in _pins()["models"].items()}
    # serve's own preference (profiles.MODEL_NAMES) is the module's: fast, then base.
    assert list(MODEL_NAMES) == [dirs["fast"], dirs["base"]]
    fetched = eval_module(
        "{ services.qwen3090 = { enable = true; fetchModel.enable = true; }; }"
    )
    assert _served(fetched) == f"{MODELS}/{dirs['fast']}"
    base_only = eval_module(
        '{ services.qwen3090 = { enable = true; fetchModel = { enable = true; '
        'targets = [ "base" ]; }; }; }'
    )
    assert _served(base_only) == f"{MODELS}/{dirs['base']}"
    # Without the fetch unit, the checkpoint every layout has.
    manual = eval_module("{ services.qwen3090.enable = true; }")
    assert _served(manual) == f"{MODELS}/{dirs['base']}"
