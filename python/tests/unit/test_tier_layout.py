"""Each test module lives in the folder of its tier: ``tests/<marker>/``, marked with that marker.

The tiers are the markers python/pyproject.toml declares. A module's tier markers are read from
its source (``pytestmark`` and decorators), so the check sees every tier, whichever ``-m`` runs
it, and fails on a module outside a tier folder, on one with a marker of another tier, and on
one without its tier's marker.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]
PYPROJECT = TESTS.parent / "pyproject.toml"

# Modules that hold one test of another tier besides their own, each a single test that did not
# move with this layout because its module was being edited elsewhere at the time. A listed
# marker must still be present (a stale entry fails), so the list only shrinks.
SECOND_TIER = {
    # the split-KV kernel at full shapes on a GPU, beside its interpreter (patch) checks
    "patch/test_spec_decode_attn.py": {"gpu"},
    # promtool on the rule file's expressions, beside the pure-Python rule checks
    "unit/test_obs_rules.py": {"nix"},
}


def declared_tiers(pyproject: Path) -> set[str]:
    """The marker names python/pyproject.toml declares (``name: description`` lines)."""
    ini = tomllib.loads(pyproject.read_text())["tool"]["pytest"]["ini_options"]
    return {line.split(":", 1)[0].strip() for line in ini["markers"]}


def tier_marks(source: str, tiers: set[str]) -> set[str]:
    """Every ``pytest.mark.<tier>`` the module's source names (module mark or decorator)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in tiers
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "mark"
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "pytest"
        ):
            found.add(node.attr)
    return found


def layout_errors(
    tests: Path, tiers: set[str], second_tier: dict[str, set[str]]
) -> list[str]:
    """What is wrong with the layout under ``tests``: one line per module, empty when none."""
    errors = []
    seen = set()
    for module in sorted(tests.rglob("test_*.py")):
        rel = module.relative_to(tests).as_posix()
        seen.add(rel)
        folder = rel.split("/", 1)[0]
        if folder not in tiers:
            errors.append(f"{rel}: not in a tier folder (tests/<tier>/, tiers: {sorted(tiers)})")
            continue
        marks = tier_marks(module.read_text(), tiers)
        allowed = {folder} | second_tier.get(rel, set())
        if folder not in marks:
            errors.append(f"{rel}: lacks pytest.mark.{folder}, the marker of its folder")
        if marks - allowed:
            errors.append(f"{rel}: marked {sorted(marks - allowed)}, but lives in {folder}/")
        stale = second_tier.get(rel, set()) - marks
        if stale:
            errors.append(f"{rel}: SECOND_TIER lists {sorted(stale)}, no longer used")
    errors += [f"{rel}: listed in SECOND_TIER but absent" for rel in second_tier if rel not in seen]
    return errors


def test_every_tier_has_its_folder() -> None:
    tiers = declared_tiers(PYPROJECT)
    assert tiers == {"unit", "patch", "e2e_cpu", "nix", "nix_replay", "gpu", "upstream"}
    assert {p.name for p in TESTS.iterdir() if p.is_dir() and p.name in tiers} == tiers


def test_each_module_is_marked_with_its_folder_tier() -> None:
    assert layout_errors(TESTS, declared_tiers(PYPROJECT), SECOND_TIER) == []


def test_the_check_finds_each_kind_of_misplaced_module(tmp_path: Path) -> None:
    tiers = {"unit", "patch"}

    def put(rel: str, text: str) -> None:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("import pytest\n" + text)

    put("unit/test_ok.py", "pytestmark = pytest.mark.unit\n")
    put("unit/sub/test_nested_ok.py", "pytestmark = [pytest.mark.unit]\n")
    put("unit/test_other_tier.py", "@pytest.mark.patch\ndef test_x() -> None: ...\n")
    put("unit/test_mixed.py", "pytestmark = pytest.mark.unit\n@pytest.mark.patch\ndef t(): 0\n")
    put("patch/test_unmarked.py", "def test_x() -> None: ...\n")
    put("spine/test_history.py", "pytestmark = pytest.mark.unit\n")
    put("patch/test_allowed.py", "pytestmark = pytest.mark.patch\n@pytest.mark.unit\ndef t(): 0\n")
    errors = layout_errors(
        tmp_path, tiers, {"patch/test_allowed.py": {"unit"}, "unit/test_ok.py": {"patch"}}
    )
    assert errors == [
        "patch/test_unmarked.py: lacks pytest.mark.patch, the marker of its folder",
        "spine/test_history.py: not in a tier folder (tests/<tier>/, tiers: ['patch', 'unit'])",
        "unit/test_mixed.py: marked ['patch'], but lives in unit/",
        "unit/test_ok.py: SECOND_TIER lists ['patch'], no longer used",
        "unit/test_other_tier.py: lacks pytest.mark.unit, the marker of its folder",
        "unit/test_other_tier.py: marked ['patch'], but lives in unit/",
    ]
