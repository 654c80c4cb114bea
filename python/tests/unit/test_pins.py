"""One reader of pins.json: the override reaches every table, the models dir reaches fetch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from qwen3090 import pins
from qwen3090.errors import Qwen3090Error
from tests.support import artifacts

pytestmark = pytest.mark.unit


def _copy_pins(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    path = tmp_path / "pins.json"
    shutil.copy(pins.pins_path(), path)
    data: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
    return path, data


def test_packaged_pins_parse_into_both_tables() -> None:
    table = pins.load_artifacts()
    assert "vllm-sdist" in table
    sdist = table["vllm-sdist"]
    assert len(sdist.sha256) == 64 and sdist.sha256 == sdist.sha256.lower()
    targets = pins.load_targets()
    assert any(t.default for t in targets.values())
    assert all(t.role in pins.ROLES for t in targets.values())


def test_the_override_applies_to_artifacts_as_well_as_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, data = _copy_pins(tmp_path)
    table = data["artifacts"]
    assert isinstance(table, dict)
    source = tmp_path / "vllm-0.28.0.tar.gz"
    source.write_bytes(b"a stand-in for the sdist")
    digest = artifacts.sha256_of(source)
    table["vllm-sdist"] = dict(
        table["vllm-sdist"], url=source.as_uri(), sha256=digest.upper(), size=None
    )
    path.write_text(json.dumps(data), encoding="utf-8")
    monkeypatch.setenv(pins.PINS_ENV, str(path))
    assert pins.pinned_artifact("vllm-sdist").sha256 == digest
    # artifacts.py has no reader of its own: its download follows the overridden pin.
    got = artifacts.fetch_artifact("vllm-sdist", tmp_path / "cache")
    assert got.read_bytes() == source.read_bytes()


def test_missing_override_file_is_an_error_with_a_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(pins.PINS_ENV, str(tmp_path / "absent.json"))
    for read in (pins.load_artifacts, pins.load_targets):
        with pytest.raises(Qwen3090Error, match="no pins file") as err:
            read()
        assert err.value.fix and pins.PINS_ENV in err.value.fix


def test_malformed_artifact_names_the_key(tmp_path: Path) -> None:
    path, data = _copy_pins(tmp_path)
    table = data["artifacts"]
    assert isinstance(table, dict)
    del table["vllm-sdist"]["sha256"]
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(Qwen3090Error, match=r"artifacts\.vllm-sdist is malformed") as err:
        pins.load_artifacts(path)
    assert err.value.fix


def test_unknown_artifact_lists_the_known_ones() -> None:
    with pytest.raises(Qwen3090Error, match="no pinned artifact") as err:
        pins.pinned_artifact("nope")
    assert err.value.fix and "vllm-sdist" in err.value.fix


def test_models_dir_honours_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(pins.MODELS_DIR_ENV, raising=False)
    assert pins.models_dir() == Path("models")
    monkeypatch.setenv(pins.MODELS_DIR_ENV, str(tmp_path))
    assert pins.models_dir() == tmp_path
    fast = pins.load_targets()["fast"]
    assert pins.model_dir("fast") == tmp_path / fast.dir
    with pytest.raises(Qwen3090Error, match="no model target") as err:
        pins.model_dir("nope")
    assert err.value.fix and "fast" in err.value.fix


def test_fetch_dest_defaults_to_the_models_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qwen3090.cli import build_parser

    monkeypatch.setenv(pins.MODELS_DIR_ENV, str(tmp_path))
    args = build_parser().parse_args(["fetch"])
    assert args.dest == tmp_path
