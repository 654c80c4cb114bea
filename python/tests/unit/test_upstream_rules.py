"""The upstream tier's rules on small inputs: selection, declared changes, comparison, and the
outcome plugin run inside a real pytest process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.upstream.upstream_compare import (
    SideOutcomes,
    compare,
    confirm,
    report,
    rerun_on_patched,
)
from tests.support.upstream.upstream_select import (
    INFRASTRUCTURE_IMPORTERS,
    AcceptedChange,
    Module,
    accepted_changes,
    imported_modules,
    patched_modules,
    sdist_test_files,
    select,
)

pytestmark = pytest.mark.unit

REPO_PATCHES = Path(__file__).resolve().parents[3] / "patches"
# The outcome plugin is loaded by its bare name from its own directory (as upstream_run does).
PLUGIN_DIR = Path(__file__).resolve().parents[1] / "support" / "upstream"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_modules_come_from_the_series_diffs_and_overlay() -> None:
    paths = {m.path: m.patches for m in patched_modules(REPO_PATCHES)}
    assert paths["vllm/v1/core/kv_cache_utils.py"][0] == "hybrid-sw-block-promote.patch"
    assert "vllm/v1/attention/ops/spec_decode_attention.py" in paths  # added via the overlay
    assert all(p.startswith("vllm/") and p.endswith(".py") for p in paths)


def test_import_forms_that_name_a_module() -> None:
    source = ("import vllm.a.b\nfrom vllm.c import d\nfrom vllm.e.f import g as h\n"
              "from . import local\n")
    names = imported_modules(source)
    assert {"vllm.a.b", "vllm.c.d", "vllm.e.f", "vllm.e.f.g"} <= names
    assert not any("local" in n for n in names)
    assert imported_modules("def broken(:\n") == set()


def test_selection_by_name_by_import_and_infrastructure(tmp_path: Path) -> None:
    write(tmp_path / "tests/core/test_cache_utils.py", "x = 1\n")
    write(tmp_path / "tests/core/test_cache_utils_extra.py", "x = 1\n")
    write(tmp_path / "tests/core/test_prefix.py", "from vllm.core import cache_utils\n")
    write(tmp_path / "tests/core/test_other.py", "import vllm.core.cache_utilsx\n")
    write(tmp_path / "tests/core/helpers.py", "import vllm.core.cache_utils\n")
    write(tmp_path / "tests/test_envs.py", "import vllm.envs\n")
    for i in range(INFRASTRUCTURE_IMPORTERS + 1):
        write(tmp_path / f"tests/many/test_m{i}.py", "from vllm import envs\n")
    cache = Module("vllm/core/cache_utils.py", ("p.patch",))
    envs = Module("vllm/envs.py", ("e.patch",))
    by_module = {s.module: s for s in select((cache, envs), sdist_test_files(tmp_path))}

    assert by_module[cache].files == ("tests/core/test_cache_utils.py",
                                      "tests/core/test_cache_utils_extra.py",
                                      "tests/core/test_prefix.py")
    assert not by_module[cache].infrastructure
    assert by_module[envs].infrastructure
    assert len(by_module[envs].by_import) == INFRASTRUCTURE_IMPORTERS + 2
    assert by_module[envs].files == ("tests/test_envs.py",)


def test_a_name_selects_only_up_to_a_word_boundary(tmp_path: Path) -> None:
    # kvarn-backend patches vllm/platforms/cuda.py: vLLM's CUDA-graph tests are not named for
    # it, and a bare prefix match ran them both sides (the tier then outran its bound).
    write(tmp_path / "tests/cuda/test_cuda.py", "x = 1\n")
    write(tmp_path / "tests/cuda/test_cuda_compat.py", "x = 1\n")
    write(tmp_path / "tests/v1/cudagraph/test_cudagraph_mode.py", "x = 1\n")
    cuda = Module("vllm/platforms/cuda.py", ("k.patch",))
    (selection,) = select((cuda,), sdist_test_files(tmp_path))
    assert selection.files == ("tests/cuda/test_cuda.py", "tests/cuda/test_cuda_compat.py")


def _series_with(tmp_path: Path, header_line: str) -> Path:
    patches = tmp_path / "patches"
    write(patches / "series", "# vllm-version: 0.28.0\nfix-x.patch\n")
    write(patches / "fix-x.patch",
          "# qwen3090-patch: fix-x\n# summary: s\n# why: w\n" + header_line +
          "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,1 +1,1 @@\n-a\n+b\n")
    return patches


def test_upstream_changes_header_lines(tmp_path: Path) -> None:
    line = "# upstream-changes: tests/t/test_a.py::test_b[1] — pins the old page size\n"
    (change,) = accepted_changes(_series_with(tmp_path, line))
    assert change == AcceptedChange("tests/t/test_a.py::test_b[1]", "fix-x.patch",
                                    "pins the old page size")


@pytest.mark.parametrize("line", ["# upstream-changes: tests/t/test_a.py::test_b\n",
                                  "# upstream-changes: test_b — no file\n"])
def test_upstream_changes_without_id_or_reason_is_refused(tmp_path: Path, line: str) -> None:
    with pytest.raises(ValueError, match="upstream-changes"):
        accepted_changes(_series_with(tmp_path, line))


def test_compare_counts_and_verdict() -> None:
    pristine = SideOutcomes({"a": "passed", "b": "passed", "c": "failed", "d": "passed",
                             "e": "skipped", "f": "failed", "g": "passed", "h": "passed",
                             "i": "capped"},
                            {"tests/x.py": "ImportError: no ray"})
    patched = SideOutcomes({"a": "passed", "b": "failed", "d": "failed", "e": "skipped",
                            "f": "passed", "h": "passed"},
                           {"tests/x.py": "ImportError: no ray"})
    declared = [AcceptedChange("d", "p.patch", "why"), AcceptedChange("h", "q.patch", "old")]
    c = compare(pristine, patched, declared)
    assert (c.ran, c.passed_both, c.failed_pristine, c.not_run) == (9, ("a", "h"), ("c",),
                                                                   ("e", "i"))
    assert c.regressed == ("b", "g")  # g: passed pristine, not run patched
    assert [test_id for test_id, _ in c.accepted] == ["d"]
    assert [a.test_id for a in c.stale] == ["h"]
    assert c.fixed == ("f",)
    assert not c.ok
    text = report(c, pristine, patched)
    assert "9 ran, 2 passed on both, 1 failed on pristine" in text
    assert "REGRESSED g (pristine passed, patched not collected)" in text
    assert "STALE     h" in text
    assert rerun_on_patched(pristine) == {"a", "b", "d", "e", "g", "h"}


def test_compare_passes_clean_runs_and_flags_broken_collection() -> None:
    same = SideOutcomes({"a": "passed", "b": "failed"})
    assert compare(same, same).ok
    broken = SideOutcomes({"b": "failed"}, {"tests/t.py": "ImportError: x"})
    c = compare(SideOutcomes({"b": "failed"}), broken)
    assert c.broken_collection == ("tests/t.py",)
    assert not c.ok


def test_only_regressions_that_reproduce_alone_count() -> None:
    pristine = SideOutcomes({"slow": "passed", "real": "passed", "both": "passed",
                             "gone": "passed"})
    patched = SideOutcomes({"slow": "failed", "real": "failed", "both": "failed"})
    c = compare(pristine, patched)
    assert c.regressed == ("both", "gone", "real", "slow")
    # Run again alone: "slow" passes on both, "both" fails on both, "real" and "gone" (not
    # collected on the patched tree) still regress.
    again = confirm(c, SideOutcomes({"slow": "passed", "real": "passed", "both": "failed",
                                     "gone": "passed"}),
                    SideOutcomes({"slow": "passed", "real": "failed", "both": "failed"}))
    assert again.regressed == ("gone", "real")
    assert again.not_reproduced == ("both", "slow")
    assert not again.ok
    text = report(again, pristine, patched)
    assert "REGRESSED real" in text and "REGRESSED slow" not in text
    assert "not reproduced slow (did not pass patched in the parallel run" in text
    cleared = confirm(compare(pristine, SideOutcomes({**patched.tests, "real": "passed",
                                                      "gone": "passed", "both": "passed"})),
                      pristine, SideOutcomes({"slow": "passed"}))
    assert cleared.ok and cleared.not_reproduced == ("slow",)


def _run_plugin(tmp_path: Path, **env_extra: str) -> dict[str, dict[str, str]]:
    out = tmp_path / "outcomes.json"
    # PLUGIN_DIR first, keeping the caller's path: under Nix's python-tests check pytest itself
    # comes from PYTHONPATH (the test tools' site-packages).
    path = os.pathsep.join(p for p in (str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "UPSTREAM_OUTCOMES": str(out), "PYTHONPATH": path, **env_extra}
    env.pop("PYTEST_ADDOPTS", None)
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
                    "upstream_outcomes", "-q", "--continue-on-collection-errors", "-p",
                    "no:xdist", "."], cwd=tmp_path, env=env, capture_output=True,
                   timeout=120, check=False)
    data: dict[str, dict[str, str]] = json.loads(out.read_text(encoding="utf-8"))
    return data


def test_outcome_plugin_records_each_phase(tmp_path: Path) -> None:
    write(tmp_path / "test_sample.py", (
        "import pytest\n"
        "@pytest.fixture\n"
        "def broken_teardown():\n"
        "    yield\n"
        "    raise RuntimeError('teardown')\n"
        "def test_ok(): pass\n"
        "def test_bad(): assert False\n"
        "def test_teardown(broken_teardown): pass\n"
        "@pytest.mark.skip(reason='r')\n"
        "def test_skip(): pass\n"))
    write(tmp_path / "test_broken.py", "import no_such_module_here\n")
    data = _run_plugin(tmp_path)
    assert data["tests"] == {"test_sample.py::test_ok": "passed",
                             "test_sample.py::test_bad": "failed",
                             "test_sample.py::test_teardown": "failed",
                             "test_sample.py::test_skip": "skipped"}
    assert list(data["collect_errors"]) == ["test_broken.py"]


def test_outcome_plugin_caps_failing_functions_and_keeps_only(tmp_path: Path) -> None:
    write(tmp_path / "test_params.py", (
        "import pytest\n"
        "@pytest.mark.parametrize('n', range(6))\n"
        "def test_fails(n): assert False\n"
        "@pytest.mark.parametrize('n', range(6))\n"
        "def test_mixed(n): assert n != 0\n"
        "def test_other(): pass\n"))
    data = _run_plugin(tmp_path, UPSTREAM_FAIL_CAP="2")
    fails = [data["tests"][f"test_params.py::test_fails[{n}]"] for n in range(6)]
    assert fails == ["failed", "failed", "capped", "capped", "capped", "capped"]
    mixed = [data["tests"][f"test_params.py::test_mixed[{n}]"] for n in range(6)]
    assert mixed == ["failed", "passed", "passed", "passed", "passed", "passed"]

    only = tmp_path / "only.json"
    only.write_text(json.dumps(["test_params.py::test_other", "test_params.py::test_mixed[2]"]),
                    encoding="utf-8")
    data = _run_plugin(tmp_path, UPSTREAM_ONLY=str(only))
    assert data["tests"] == {"test_params.py::test_other": "passed",
                             "test_params.py::test_mixed[2]": "passed"}
