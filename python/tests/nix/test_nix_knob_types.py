"""The NixOS module's option types agree with the knobs ``qwen3090 knobs --json`` exports.

The module declares typed options for some knobs (``settings.SPEC``, the top-level ``profile``,
``port``, ...); the CLI validates the same knobs from the Settings declarations. This holds the
two against each other: every typed settings option is a knob, an enum offers exactly the
knob's words, and a scalar type is the knob's type. Needs NIXPKGS_LIB (see
tests/support/nixeval.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.nixeval import REPO, eval_json

pytestmark = pytest.mark.nix

# Options of services.qwen3090 itself that the module renders as knobs into the settings file.
OWNED = {"profile": "PROFILE", "host": "HOST", "port": "PORT", "modelDir": "MODEL"}

# nixpkgs lib type name -> the export's value type.
NIX_KIND = {
    "str": "str",
    "nonEmptyStr": "str",
    "singleLineStr": "str",
    "path": "str",
    "pathWith": "str",
    "enum": "enum",
    "bool": "bool",
    "float": "float",
    "number": "float",
    "int": "int",
    "intBetween": "int",
    "positiveInt": "int",
    "unsignedInt": "int",
    "unsignedInt16": "int",
    "strMatching": "str",
    "numberBetween": "float",
    "listOf": "args",
}

# A type as data: its name and, down through nullOr and either, the enum's words.
DESCRIBE = """
  describe = t: {
    inherit (t) name description;
    values = if t.name == "enum" then (t.functor.payload.values or t.functor.payload) else null;
    elem = if t.name == "nullOr" then describe t.nestedTypes.elemType else null;
    alternatives =
      if t.name == "either" then
        [ (describe t.nestedTypes.left) (describe t.nestedTypes.right) ]
      else
        null;
  };
"""

OPTION_TYPES = """
let
  harness = import {harness} {{ inherit lib; configuration = {{ }}; }};
  opts = harness.evaluated.options.services.qwen3090;
  {describe}
  settings = lib.filterAttrs (_: lib.isOption) (opts.settings.type.getSubOptions [ ]);
in {{
  settings = builtins.mapAttrs (_: o: describe o.type) settings;
  owned = builtins.mapAttrs (name: _: describe opts.${{name}}.type) {{ {owned} }};
}}
"""


@pytest.fixture(scope="module")
def exported() -> dict[str, dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "qwen3090", "knobs", "--json"],
        capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2],
    )
    return {k["name"]: k for k in json.loads(proc.stdout)}


@pytest.fixture(scope="module")
def module_types() -> dict[str, dict[str, Any]]:
    owned = " ".join(f"{name} = null;" for name in OWNED)
    expr = OPTION_TYPES.format(
        harness=REPO / "checks" / "eval-module.nix", owned=owned, describe=DESCRIBE
    )
    result: dict[str, Any] = eval_json(expr)
    types = dict(result["settings"])
    types.update({OWNED[name]: t for name, t in result["owned"].items()})
    return types


def _unwrap(t: dict[str, Any]) -> dict[str, Any]:
    while t["name"] == "nullOr":
        t = t["elem"]
    return t


def test_the_module_types_some_knobs(module_types: dict[str, dict[str, Any]]) -> None:
    # SPEC, CTX and KV are typed in the module today; the comparison below must see them.
    assert {"SPEC", "CTX", "KV", "PROFILE", "PORT"} <= module_types.keys()


def test_every_typed_settings_option_is_a_knob(
    module_types: dict[str, dict[str, Any]], exported: dict[str, dict[str, Any]]
) -> None:
    assert sorted(set(module_types) - set(exported)) == []


def _alternatives(t: dict[str, Any]) -> list[dict[str, Any]]:
    """The leaf types of ``t``: through nullOr, and each side of an either."""
    t = _unwrap(t)
    if t["name"] == "either":
        return [leaf for alt in t["alternatives"] for leaf in _alternatives(alt)]
    return [t]


def _disagreement(name: str, t: dict[str, Any], knob: dict[str, Any]) -> str | None:
    kind = NIX_KIND.get(t["name"])
    if kind is None:
        return f"{name}: nix type {t['name']!r} has no mapping in NIX_KIND"
    if kind == "enum" and t["values"] == [""] and knob["empty_is_value"]:
        return None  # the knob's own empty value (KV_MEM=, INT8_ACT=)
    if kind == "str" and knob["type"] == "args":
        return None  # EXTRA_ARGS as one shell-quoted string
    if kind != knob["type"]:
        return f"{name}: nix {t['description']!r} vs knob type {knob['type']}"
    if kind == "enum" and sorted(t["values"]) != sorted(knob["choices"]):
        return f"{name}: nix {t['values']} vs knob choices {knob['choices']}"
    return None


def test_option_types_agree_with_the_export(
    module_types: dict[str, dict[str, Any]], exported: dict[str, dict[str, Any]]
) -> None:
    disagree = [
        problem
        for name, raw in sorted(module_types.items())
        for leaf in _alternatives(raw)
        if (problem := _disagreement(name, leaf, exported[name])) is not None
    ]
    assert disagree == []


def test_the_export_describes_each_knob_once(exported: dict[str, dict[str, Any]]) -> None:
    from qwen3090.settings import NAMES, Settings

    assert list(exported) == list(NAMES)
    assert {n.lower() for n in NAMES} == set(Settings.__dataclass_fields__) - {"sources"}


def test_the_comparison_reads_unions_and_finds_a_mismatch(
    exported: dict[str, dict[str, Any]],
) -> None:
    # A KV_MEM-like option: bytes or the empty string; then one whose enum lacks a knob word.
    union = eval_json(
        f"let {DESCRIBE} in describe (lib.types.nullOr (lib.types.either "
        'lib.types.ints.positive (lib.types.enum [ "" ])))'
    )
    assert [_disagreement("KV_MEM", t, exported["KV_MEM"]) for t in _alternatives(union)] == [
        None, None]
    short = eval_json(f'let {DESCRIBE} in describe (lib.types.enum [ "fp8" "kvarn" ])')
    assert _disagreement("KV", short, exported["KV"]) is not None
    assert _disagreement("PORT", short, exported["PORT"]) is not None
