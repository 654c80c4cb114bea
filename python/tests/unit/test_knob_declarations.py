"""One declaration per knob: the Settings fields drive the flags, the YAML keys, the parse
rules and ``qwen3090 knobs --json``; and the default model directories follow
``$QWEN3090_MODELS_DIR`` (what ``fetch`` writes)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Literal, Union, get_args, get_origin, get_type_hints

import pytest

from qwen3090 import profiles as P
from qwen3090.errors import Qwen3090Error
from qwen3090.knobs import add_knob_arguments, cli_values, export, load_settings
from qwen3090.settings import KNOBS, Settings

pytestmark = pytest.mark.unit

# The checkout's package, whatever the working directory of a subprocess.
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"MODEL", "DRAFT", "SPEC"}}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    return {**env, **extra}


def _literal_words(annotation: object) -> set[str]:
    """The strings of every Literal inside ``annotation`` (through ``X | None`` unions)."""
    if get_origin(annotation) is Literal:
        return {a for a in get_args(annotation) if isinstance(a, str)}
    if get_origin(annotation) in (Union, type(int | None)):
        return set().union(*(_literal_words(a) for a in get_args(annotation)))
    return set()


def test_every_settings_field_is_a_knob() -> None:
    names = [f.name for f in fields(Settings) if f.name != "sources"]
    assert [k.attr for k in KNOBS] == names


def test_choices_are_the_literal_types_words() -> None:
    hints = get_type_hints(Settings)
    for knob in KNOBS:
        if knob.rule.type == "enum":
            assert set(knob.choices) == _literal_words(hints[knob.attr]), knob.name


@pytest.mark.parametrize("knob", [k for k in KNOBS if k.rule.type == "enum"], ids=lambda k: k.name)
def test_an_enum_knob_takes_its_words_in_any_case_and_nothing_else(knob: object) -> None:
    from qwen3090.settings import Knob

    assert isinstance(knob, Knob)
    cli = {"PROFILE": None, "DEVICE": None}
    for word in knob.choices:
        if word:
            s = load_settings(environ={}, cli={**cli, knob.name: word.upper()})
            assert getattr(s, knob.attr) == word
    with pytest.raises(Qwen3090Error) as err:
        load_settings(environ={}, cli={**cli, knob.name: "no-such-word"})
    assert err.value.fix is not None and knob.flag in err.value.fix


@pytest.mark.parametrize("knob", [k for k in KNOBS if k.rule.type == "int"], ids=lambda k: k.name)
def test_an_int_knob_keeps_to_its_bounds(knob: object) -> None:
    from qwen3090.settings import Knob

    assert isinstance(knob, Knob)
    low, high = knob.rule.minimum, knob.rule.maximum
    assert isinstance(low, int)
    assert getattr(load_settings(environ={}, cli={knob.name: str(low)}), knob.attr) == low
    with pytest.raises(Qwen3090Error):
        load_settings(environ={}, cli={knob.name: str(low - 1)})
    if high is not None:
        with pytest.raises(Qwen3090Error):
            load_settings(environ={}, cli={knob.name: str(int(high) + 1)})


def test_flags_and_export_come_from_the_same_declarations() -> None:
    parser = argparse.ArgumentParser()
    add_knob_arguments(parser)
    flags = {a.option_strings[0] for a in parser._actions if a.dest.startswith("knob_")}
    assert flags == {k["flag"] for k in export()}
    args = parser.parse_args(["--dflash-tokens", "15", "--spec", "dflash2"])
    assert load_settings(environ={}, cli=cli_values(args)).dflash_tokens == 15


def test_knobs_json_command_prints_the_export(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "qwen3090", "knobs", "--json"],
                         env=_env(), cwd=tmp_path, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == export()
    spec = next(k for k in export() if k["name"] == "SPEC")
    assert (spec["flag"], spec["type"], spec["choices"]) == ("--spec", "enum",
                                                              ["mtp", "dflash2", "off"])


def test_default_model_dirs_follow_qwen3090_models_dir(tmp_path: Path) -> None:
    models = tmp_path / "fetched"
    (models / P.MODEL_NAMES[-1]).mkdir(parents=True)
    drafter = models / P.DRAFT_NAMES[-1]
    drafter.mkdir()
    (drafter / P.DRAFT_WEIGHTS_FILE).write_bytes(b"")
    # Run elsewhere than the models directory's parent: the variable, not the cwd, finds them.
    out = subprocess.run(
        [sys.executable, "-m", "qwen3090", "plan", "--json", "--spec", "dflash2"],
        env=_env(QWEN3090_MODELS_DIR=str(models)), cwd=models, capture_output=True, text=True,
        check=True,
    )
    plan = json.loads(out.stdout)
    assert plan["model"] == str(models / P.MODEL_NAMES[-1])
    assert plan["draft"] == str(drafter)


def _shown(value: str | int | bool) -> str:
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


def test_exported_defaults_are_the_ones_the_help_states_and_the_plan_uses(
    tmp_path: Path,
) -> None:
    from qwen3090.plan import resolve

    exported = {k["name"]: k for k in export()}
    for name, value in P.KNOB_DEFAULTS.items():
        knob = exported[name]
        assert knob["default"] == value
        shown = _shown(value)
        assert f"{shown} (default" in knob["help"] or f"default {shown}" in knob["help"], name
    plan = resolve(load_settings(environ={}, cli={"PROFILE": None, "DEVICE": None}))
    assert (plan.profile, plan.device, plan.port, plan.host) == (
        P.KNOB_DEFAULTS["PROFILE"], P.KNOB_DEFAULTS["DEVICE"], P.KNOB_DEFAULTS["PORT"],
        P.KNOB_DEFAULTS["HOST"])
    assert plan.flag("--tool-call-parser") == P.KNOB_DEFAULTS["TOOL_PARSER"]
    assert plan.flag("--api-server-count") == _shown(P.KNOB_DEFAULTS["API_SERVERS"])
