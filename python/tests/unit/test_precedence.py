"""One precedence rule (issue 19, item 2): flag > environment > settings file > profile
default, held from both sides: what ``qwen3090.knobs`` does, and what the docs and the NixOS
module's descriptions say it does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from qwen3090.knobs import load_settings

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]


def _tokens(tmp_path: Path, env: dict[str, str], cli: dict[str, str | None]) -> int | None:
    config = tmp_path / "settings.yaml"
    config.write_text("DFLASH_TOKENS: 15\n")
    return load_settings(config=config, environ=env, cli=cli).dflash_tokens


def test_the_code_environment_beats_the_file_and_the_flag_beats_both(tmp_path: Path) -> None:
    assert _tokens(tmp_path, {}, {}) == 15
    assert _tokens(tmp_path, {"DFLASH_TOKENS": "9"}, {}) == 9
    assert _tokens(tmp_path, {"DFLASH_TOKENS": "9"}, {"DFLASH_TOKENS": "5"}) == 5
    assert load_settings(environ={}, cli={}).dflash_tokens is None  # the profile default


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_profiles_md_states_the_same_order() -> None:
    text = _flat((REPO / "python" / "docs" / "PROFILES.md").read_text())
    order = ["the profile's default", "a YAML settings file", "the environment",
             "a command-line flag"]
    sentence = text[text.index("Where a knob comes from"):][:600]
    positions = [sentence.index(o) for o in order]
    assert positions == sorted(positions), sentence
    assert "a later source wins" in sentence


def test_the_nixos_module_does_not_say_the_file_beats_the_environment() -> None:
    text = _flat((REPO / "modules" / "qwen3090" / "default.nix").read_text())
    assert not re.search(r"settings file wins? over the environment", text)
    env_file = text[text.index("environmentFile = mkOption"):][:800]
    assert "win over the same knobs in the settings file" in env_file
    assert "flag > environment > settings file > profile default" in env_file
