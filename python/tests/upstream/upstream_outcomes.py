"""pytest plugin loaded into the runs of vLLM's own tests (``-p upstream_outcomes``).

Writes ``$UPSTREAM_OUTCOMES`` (JSON): ``{"tests": {nodeid: outcome}, "collect_errors":
{nodeid: message}}``, outcome one of passed / failed / skipped. A test counts as failed if its
setup, call or teardown failed, so a fixture that breaks is not a pass. Under pytest-xdist the
workers' reports reach the controller, which alone writes the file. Standard library and pytest
only: it runs inside vLLM's test environment, not ours.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

OUTCOMES_ENV = "UPSTREAM_OUTCOMES"
_RANK = {"passed": 0, "skipped": 1, "failed": 2}


class _Outcomes:
    def __init__(self, target: Path) -> None:
        self.target = target
        self.tests: dict[str, str] = {}
        self.collect_errors: dict[str, str] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or report.outcome != "passed":
            outcome = "failed" if report.outcome == "failed" else report.outcome
            previous = self.tests.get(report.nodeid)
            if previous is None or _RANK[outcome] > _RANK[previous]:
                self.tests[report.nodeid] = outcome

    @pytest.hookimpl
    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.collect_errors[report.nodeid] = str(report.longrepr).splitlines()[-1:][0] \
                if str(report.longrepr) else "collection failed"

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput"):  # an xdist worker: the controller writes
            return
        payload = {"tests": self.tests, "collect_errors": self.collect_errors}
        self.target.write_text(json.dumps(payload, indent=1, sort_keys=True), encoding="utf-8")


def pytest_configure(config: pytest.Config) -> None:
    target = os.environ.get(OUTCOMES_ENV)
    if target:
        config.pluginmanager.register(_Outcomes(Path(target)), "upstream-outcomes-writer")
