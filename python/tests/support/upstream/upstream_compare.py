"""Compare the outcomes of vLLM's own tests on the pristine and the patched tree.

A regression is a test that passed on the pristine tree and did not pass on the patched one
(failed, or was not collected there), unless a patch header accepts exactly that test id
(``# upstream-changes:``, see upstream_select). Tests that fail on the pristine tree (no GPU,
no network, a missing optional dependency) are counted in the report, not against the series;
the patched side does not rerun them (``rerun_on_patched``): they cannot regress.

A regression must reproduce (``confirm``): the regressed ids run again, alone and without
xdist, on both trees, and only those that pass pristine and fail patched there count. A test
that timed out while the machine was loaded (one that starts vLLM three times in a subprocess,
say) is listed as not reproduced instead, never dropped silently.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from tests.support.upstream.upstream_select import AcceptedChange

PASSED = "passed"
SKIPPED = "skipped"
FAILED = "failed"
CAPPED = "capped"
"""Not run: the first cases of its test function failed (upstream_outcomes' failure cap)."""
NOT_RUN = frozenset({SKIPPED, CAPPED})


@dataclass(frozen=True)
class SideOutcomes:
    """One side's run: test id -> passed/skipped/failed, and the files that failed to collect."""

    tests: Mapping[str, str]
    collect_errors: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> SideOutcomes:
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(dict(data["tests"]), dict(data["collect_errors"]))


@dataclass(frozen=True)
class Comparison:
    ran: int
    """Test ids with an outcome on either side."""
    passed_both: tuple[str, ...]
    failed_pristine: tuple[str, ...]
    """Failed on the pristine tree (no GPU, no network, a missing optional dependency), so
    they cannot regress; not passed on the patched tree either, where it ran them."""
    not_run: tuple[str, ...]
    """Skipped or capped on the pristine tree, and not passed on the patched one."""
    regressed: tuple[str, ...]
    """Passed pristine, did not pass patched, not accepted by a patch header."""
    accepted: tuple[tuple[str, AcceptedChange], ...]
    """Passed pristine, failed patched, and a patch header says why."""
    stale: tuple[AcceptedChange, ...]
    """Header lines naming a test that passed on both trees: the patch no longer changes it."""
    fixed: tuple[str, ...]
    """Did not pass pristine, passed patched."""
    collect_errors: Mapping[str, tuple[str | None, str | None]]
    not_reproduced: tuple[str, ...] = ()
    """Regressed in the parallel run, not when both trees ran them again alone (confirm)."""
    """Collection error messages per file/node: (pristine, patched)."""

    @property
    def broken_collection(self) -> tuple[str, ...]:
        """Files or nodes that collect on the pristine tree and fail to on the patched one."""
        return tuple(node for node, (before, after) in self.collect_errors.items()
                     if after and not before)

    @property
    def ok(self) -> bool:
        return not self.regressed and not self.stale and not self.broken_collection


def rerun_on_patched(pristine: SideOutcomes) -> set[str]:
    """The test ids the patched side runs: all that did not fail or get capped pristine."""
    return {test_id for test_id, outcome in pristine.tests.items()
            if outcome in (PASSED, SKIPPED)}


def compare(pristine: SideOutcomes, patched: SideOutcomes,
            accepted: Iterable[AcceptedChange] = ()) -> Comparison:
    accepted_by_id = {a.test_id: a for a in accepted}
    passed_both: list[str] = []
    failed_pristine: list[str] = []
    not_run: list[str] = []
    regressed: list[str] = []
    accepted_hits: list[tuple[str, AcceptedChange]] = []
    fixed: list[str] = []
    ids = sorted({*pristine.tests, *patched.tests})
    for test_id in ids:
        before = pristine.tests.get(test_id)
        after = patched.tests.get(test_id)
        if before == PASSED and after == PASSED:
            passed_both.append(test_id)
        elif before == PASSED:
            if test_id in accepted_by_id and after == FAILED:
                accepted_hits.append((test_id, accepted_by_id[test_id]))
            else:
                regressed.append(test_id)
        elif after == PASSED:
            fixed.append(test_id)
        elif before == FAILED:
            failed_pristine.append(test_id)
        else:
            not_run.append(test_id)
    passed_set = set(passed_both)
    stale = tuple(a for a in accepted_by_id.values() if a.test_id in passed_set)
    errors = {
        node: (pristine.collect_errors.get(node), patched.collect_errors.get(node))
        for node in sorted({*pristine.collect_errors, *patched.collect_errors})
    }
    return Comparison(len(ids), tuple(passed_both), tuple(failed_pristine), tuple(not_run),
                      tuple(regressed), tuple(accepted_hits), stale, tuple(fixed), errors)


def confirm(comparison: Comparison, pristine_again: SideOutcomes,
            patched_again: SideOutcomes) -> Comparison:
    """``comparison`` with only the regressions that reproduce: a regressed id stays one if,
    run again on both trees, it passed pristine and did not pass patched; the others move to
    ``not_reproduced``."""
    kept: list[str] = []
    gone: list[str] = []
    for test_id in comparison.regressed:
        again = (pristine_again.tests.get(test_id) == PASSED
                 and patched_again.tests.get(test_id) != PASSED)
        (kept if again else gone).append(test_id)
    return replace(comparison, regressed=tuple(kept),
                   not_reproduced=comparison.not_reproduced + tuple(gone))


def report(comparison: Comparison, pristine: SideOutcomes, patched: SideOutcomes) -> str:
    """The tier's report: counts first, then every id that needs a reader's attention."""
    c = comparison
    lines = [
        f"upstream tests: {c.ran} ran, {len(c.passed_both)} passed on both, "
        f"{len(c.failed_pristine)} failed on pristine (not passing on patched either), "
        f"{len(c.not_run)} skipped or capped, {len(c.regressed)} regressed, "
        f"{len(c.accepted)} accepted changes, {len(c.fixed)} fixed by the series",
    ]
    for test_id in c.regressed:
        lines.append(f"  REGRESSED {test_id} (pristine passed, patched "
                     f"{patched.tests.get(test_id, 'not collected')})")
    for test_id in c.not_reproduced:
        lines.append(f"  not reproduced {test_id} (did not pass patched in the parallel run; "
                     "rerun alone on both trees, it was no regression)")
    for test_id, change in c.accepted:
        lines.append(f"  accepted  {test_id} ({change.patch}: {change.why})")
    for change in c.stale:
        lines.append(f"  STALE     {change.test_id} passes on both trees: drop its "
                     f"'# upstream-changes:' line from {change.patch}")
    lines.extend(f"  fixed     {test_id}" for test_id in c.fixed)
    both = [node for node, (a, b) in c.collect_errors.items() if a and b]
    one = {node: pair for node, pair in c.collect_errors.items() if not (pair[0] and pair[1])}
    if both:
        lines.append(f"  {len(both)} files fail to collect on both trees: " + ", ".join(both))
    for node, (a, b) in one.items():
        side = "patched only" if b else "pristine only"
        lines.append(f"  collection error ({side}) {node}: {a or b}")
    return "\n".join(lines)
