"""One reader per input: the build manifest's lookup rule and the API key file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwen3090 import apikey, manifest
from qwen3090.errors import Qwen3090Error
from qwen3090.exporter import build_labels

pytestmark = pytest.mark.unit


def _write_manifest(path: Path, digest_hex: str) -> Path:
    m = manifest.Manifest(
        schema=manifest.SCHEMA,
        vllm_version="0.28.0",
        series_digest=f"sha256:{digest_hex}",
        patches=(
            manifest.PatchRecord(
                name="demo", file="demo.patch", sha256="0" * 64, files=("vllm/x.py",),
                creates=(), provides=manifest.Provides(env=("VLLM_DEMO",)),
            ),
        ),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(m.to_dict()), encoding="utf-8")
    return path


def test_an_explicit_path_beats_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from_env = _write_manifest(tmp_path / "env.json", "a" * 64)
    explicit = _write_manifest(tmp_path / "flag.json", "b" * 64)
    monkeypatch.setenv(manifest.MANIFEST_ENV, str(from_env))
    got = manifest.read_manifest()
    assert got is not None and got.series_digest == f"sha256:{'a' * 64}"
    got = manifest.read_manifest(explicit)
    assert got is not None and got.series_digest == f"sha256:{'b' * 64}"
    assert got.source.startswith(f"the manifest {explicit} (1 patches")
    # The exporter's --manifest goes through the same rule.
    assert build_labels(explicit)["series_digest"] == f"sha256:{'b' * 64}"
    assert build_labels(None)["series_digest"] == f"sha256:{'a' * 64}"


def test_a_named_manifest_must_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(manifest.MANIFEST_ENV, raising=False)
    with pytest.raises(Qwen3090Error, match="cannot read the build manifest") as err:
        manifest.read_manifest(tmp_path / "absent.json")
    assert err.value.fix and manifest.MANIFEST_ENV in err.value.fix
    assert build_labels(tmp_path / "absent.json")["manifest"] == "invalid"


def test_a_tree_without_a_manifest_is_stock(tmp_path: Path) -> None:
    assert manifest.manifest_in_tree(tmp_path) is None
    _write_manifest(tmp_path / manifest.MANIFEST_RELPATH, "c" * 64)
    got = manifest.manifest_in_tree(tmp_path)
    assert got is not None and got.provided_env == frozenset({"VLLM_DEMO"})


def test_the_api_key_file_is_stripped_and_must_hold_a_key(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("s3cret\n", encoding="utf-8")
    assert apikey.read_api_key(key_file, "--api-key-file") == "s3cret"
    key_file.write_text("  \n", encoding="utf-8")
    with pytest.raises(Qwen3090Error, match="is empty") as err:
        apikey.read_api_key(key_file, "--api-key-file")
    assert err.value.fix and "--api-key-file" in err.value.fix
    with pytest.raises(Qwen3090Error, match="cannot read the API key file") as err:
        apikey.read_api_key(tmp_path / "absent", "API_KEY_FILE")
    assert err.value.fix and "API_KEY_FILE" in err.value.fix


def test_without_a_file_the_key_comes_from_the_environment(tmp_path: Path) -> None:
    assert apikey.api_key(None, "--api-key-file", {apikey.API_KEY_ENV: "k"}) == "k"
    assert apikey.api_key(None, "--api-key-file", {apikey.API_KEY_ENV: ""}) is None
    key_file = tmp_path / "key"
    key_file.write_text("from-file", encoding="utf-8")
    assert apikey.api_key(key_file, "--api-key-file", {apikey.API_KEY_ENV: "k"}) == "from-file"

