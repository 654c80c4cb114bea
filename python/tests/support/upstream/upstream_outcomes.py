"""pytest plugin loaded into the runs of vLLM's own tests (``-p upstream_outcomes``).

Writes ``$UPSTREAM_OUTCOMES`` (JSON): ``{"tests": {nodeid: outcome}, "collect_errors":
{nodeid: message}}``, outcome one of passed / failed / skipped / capped. A test counts as
failed if its setup, call or teardown failed, so a fixture that breaks is not a pass. Under
pytest-xdist the workers' reports reach the controller, which alone writes the file.

Failure cap (``$UPSTREAM_FAIL_CAP``, a count): once that many cases of one test function
(one nodeid without its ``[params]``) have failed in a process and none has passed, its
remaining cases are not run and are recorded as ``capped``. vLLM's suite parametrizes GPU
kernels and Hub models by the hundred (640 cases of tests/kernels/attention/test_flash_attn.py,
387 model initializations each in a fresh process); on the CPU build offline their first cases
show that the rest cannot run either, and running them all would take hours.

Only these (``$UPSTREAM_ONLY``, a JSON list of test ids): every other collected test is
deselected. The patched side runs only the tests that did not fail on the pristine tree: one
that failed there cannot regress, and rerunning hundreds of hopeless cases doubles the time.

Standard library and pytest only: it runs inside vLLM's test environment, not ours.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

OUTCOMES_ENV = "UPSTREAM_OUTCOMES"
FAIL_CAP_ENV = "UPSTREAM_FAIL_CAP"
ONLY_ENV = "UPSTREAM_ONLY"
CAPPED = "capped"
_RANK = {"passed": 0, "skipped": 1, CAPPED: 1, "failed": 2}


def _function_id(nodeid: str) -> str:
    return nodeid.split("[", 1)[0]


class _Outcomes:
    def __init__(self, target: Path | None, fail_cap: int, only: set[str] | None) -> None:
        self.target = target
        self.fail_cap = fail_cap
        self.only = only
        self.tests: dict[str, str] = {}
        self.collect_errors: dict[str, str] = {}
        self.failed_cases: Counter[str] = Counter()
        self.passed_functions: set[str] = set()

    @pytest.hookimpl
    def pytest_collection_modifyitems(self, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        if self.only is None:
            return
        keep = [item for item in items if item.nodeid in self.only]
        dropped = [item for item in items if item.nodeid not in self.only]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        function = _function_id(item.nodeid)
        if (self.fail_cap and function not in self.passed_functions
                and self.failed_cases[function] >= self.fail_cap):
            pytest.skip(f"{CAPPED}: the first {self.fail_cap} cases of {function} failed")

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call" and report.outcome == "passed":
            return
        if report.outcome == "failed":
            outcome = "failed"
        elif report.outcome == "skipped" and f"{CAPPED}: " in str(report.longrepr):
            outcome = CAPPED
        else:
            outcome = report.outcome
        previous = self.tests.get(report.nodeid)
        if previous is None or _RANK[outcome] > _RANK[previous]:
            self.tests[report.nodeid] = outcome
        function = _function_id(report.nodeid)
        if outcome == "failed" and previous != "failed":
            self.failed_cases[function] += 1
        elif outcome == "passed":
            self.passed_functions.add(function)

    @pytest.hookimpl
    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            lines = str(report.longrepr).strip().splitlines()
            self.collect_errors[report.nodeid] = lines[-1] if lines else "collection failed"

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.target is None or hasattr(session.config, "workerinput"):
            return  # an xdist worker: the controller, which gets every report, writes
        payload = {"tests": self.tests, "collect_errors": self.collect_errors}
        self.target.write_text(json.dumps(payload, indent=1, sort_keys=True), encoding="utf-8")


def pytest_configure(config: pytest.Config) -> None:
    target = os.environ.get(OUTCOMES_ENV)
    cap = int(os.environ.get(FAIL_CAP_ENV) or 0)
    only_file = os.environ.get(ONLY_ENV)
    only = set(json.loads(Path(only_file).read_text(encoding="utf-8"))) if only_file else None
    if target or cap or only is not None:
        config.pluginmanager.register(
            _Outcomes(Path(target) if target else None, cap, only), "upstream-outcomes-writer")
