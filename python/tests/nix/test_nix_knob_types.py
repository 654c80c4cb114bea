"""The NixOS module's option types agree with the knobs ``qwen3090 knobs --json`` exports.

The module declares typed options for some knobs (``settings.SPEC``, the top-level ``profile``,
``port``, ...); the CLI validates the same knobs from the Settings declarations. This holds the
two against each other: every typed settings option is a knob, an enum offers exactly the
knob's words, and a scalar type is the knob's type. Needs NIXPKGS_LIB (see nixeval.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from nixeval import REPO, eval_json

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
    "listOf": "args",
}

# For each option: its type's name and, down through nullOr, the enum's words.
OPTION_TYPES = """
let
  harness = import {harness} {{ inherit lib; configuration = {{ }}; }};
  opts = harness.evaluated.options.services.qwen3090;
  describe = t: {{
    inherit (t) name description;
    values = if t.name == "enum" then (t.functor.payload.values or t.functor.payload) else null;
    elem = if t.name == "nullOr" then describe t.nestedTypes.elemType else null;
  }};
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
    expr = OPTION_TYPES.format(harness=REPO / "checks" / "eval-module.nix", owned=owned)
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


def test_option_types_agree_with_the_export(
    module_types: dict[str, dict[str, Any]], exported: dict[str, dict[str, Any]]
) -> None:
    disagree: list[str] = []
    for name, raw in sorted(module_types.items()):
        t = _unwrap(raw)
        knob = exported[name]
        kind = NIX_KIND.get(t["name"])
        if kind is None:
            disagree.append(f"{name}: nix type {t['name']!r} has no mapping in NIX_KIND")
        elif kind != knob["type"]:
            disagree.append(f"{name}: nix {t['description']!r} vs knob type {knob['type']}")
        elif kind == "enum" and sorted(t["values"]) != sorted(knob["choices"]):
            disagree.append(f"{name}: nix {t['values']} vs knob choices {knob['choices']}")
    assert disagree == []


def test_the_export_describes_each_knob_once(exported: dict[str, dict[str, Any]]) -> None:
    from qwen3090.settings import NAMES, Settings

    assert list(exported) == list(NAMES)
    assert {n.lower() for n in NAMES} == set(Settings.__dataclass_fields__) - {"sources"}
