"""services.qwen3090 evaluated with nixpkgs' lib (checks/eval-module.nix): the rendered units.

Needs NIXPKGS_LIB (see tests/support/nixeval.py); skips with that reason when it is unset.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.nixeval import REPO, eval_json, eval_module, eval_module_error, exec_argv

pytestmark = pytest.mark.nix

KEY_PATH = "/run/keys/qwen3090-api-key"
BASE = f"""{{
  services.qwen3090 = {{
    enable = true;
    apiKeyFile = "{KEY_PATH}";
    settings = {{ SPEC = "dflash2"; CTX = "long"; DFLASH_TOKENS = 15; PREFIX_CACHE = 1; }};
  }};
}}"""


@pytest.fixture(scope="module")
def base() -> dict[str, Any]:
    return eval_module(BASE)


def server(summary: dict[str, Any]) -> dict[str, Any]:
    unit: dict[str, Any] = summary["units"]["qwen3090"]
    return unit


def test_no_assertion_fails(base: dict[str, Any]) -> None:
    assert base["failedAssertions"] == []


def test_exec_start_pre_checks_the_model_and_leaves_the_gate_to_serve(
    base: dict[str, Any],
) -> None:
    exe = base["storePaths"]["package"] + "/bin/qwen3090"
    pre = [exec_argv(line) for line in server(base)["serviceConfig"]["ExecStartPre"]]
    # The log rotation first (test_nix_module_logs.py), then the model check; no gate.
    assert [argv[1:] for argv in pre] == [
        ["/var/log/qwen3090/server.log", str(16 * 1024 * 1024)],
        ["check", "model", "/var/lib/qwen3090/models/Qwen3.8-27B-W4A16-AutoRound"],
    ]
    assert pre[1][0] == exe


def test_exec_start_serves_the_rendered_config_behind_the_gate(base: dict[str, Any]) -> None:
    exe = base["storePaths"]["package"] + "/bin/qwen3090"
    argv = exec_argv(server(base)["serviceConfig"]["ExecStart"])
    # thresholdMiB = null leaves serve's own default; the timeout is the module's.
    assert argv == [exe, "serve", "--config", base["configFile"]["path"], "--gate-timeout", "600"]


def _serve_policy(argv: list[str]) -> Any:
    """What `qwen3090 serve` itself makes of a rendered ExecStart's arguments."""
    from qwen3090.cli import build_parser
    from qwen3090.commands.serve import gate_policy

    assert argv[1] == "serve"
    return gate_policy(build_parser().parse_args(argv[1:]))


def test_gpu_gate_options_become_serves_gate_flags() -> None:
    summary = eval_module(
        "{ services.qwen3090 = { enable = true; "
        "gpuGate = { thresholdMiB = 4096; timeout = 300; }; }; }"
    )
    sc = server(summary)["serviceConfig"]
    argv = exec_argv(sc["ExecStart"])
    assert argv[4:] == ["--gate-threshold-mib", "4096", "--gate-timeout", "300"]
    policy = _serve_policy(argv)
    assert (policy.threshold_mib, policy.timeout_s) == (4096, 300.0)
    # The start budget still covers the gate's wait.
    assert sc["TimeoutStartSec"] == 300 + 1800
    assert [exec_argv(line)[1] for line in sc["ExecStartPre"]] == [
        "/var/log/qwen3090/server.log", "check",
    ]


def test_gate_can_be_turned_off() -> None:
    summary = eval_module("{ services.qwen3090 = { enable = true; gpuGate.enable = false; }; }")
    sc = server(summary)["serviceConfig"]
    argv = exec_argv(sc["ExecStart"])
    assert argv[4:] == ["--no-gate"]
    assert _serve_policy(argv) is None
    assert [exec_argv(line)[1:3] for line in sc["ExecStartPre"]][1:] == [["check", "model"]]


def test_cache_and_home_environment(base: dict[str, Any]) -> None:
    unit = server(base)
    env = unit["environment"]
    sc = unit["serviceConfig"]
    assert sc["CacheDirectory"] == "qwen3090"
    assert sc["StateDirectory"] == "qwen3090"
    # Base directories only: qwen3090.caches keys the vLLM root by the series digest.
    assert env["QWEN3090_CACHE_DIR"] == "/var/cache/qwen3090"
    assert env["XDG_CACHE_HOME"] == "/var/cache/qwen3090"
    assert env["HOME"] == "/var/lib/qwen3090"
    assert "VLLM_CACHE_ROOT" not in env


def test_cache_dir_elsewhere_becomes_a_read_write_path() -> None:
    summary = eval_module(
        '{ services.qwen3090 = { enable = true; cacheDir = "/srv/qwen-cache"; }; }'
    )
    sc = server(summary)["serviceConfig"]
    assert "CacheDirectory" not in sc
    assert sc["ReadWritePaths"] == ["/srv/qwen-cache"]
    assert server(summary)["environment"]["QWEN3090_CACHE_DIR"] == "/srv/qwen-cache"


def test_gpu_stays_reachable_and_relaxations_are_exact(base: dict[str, Any]) -> None:
    sc = server(base)["serviceConfig"]
    for device in ("char-nvidiactl", "char-nvidia-caps", "char-nvidia-frontend", "char-nvidia-uvm"):
        assert device in sc["DeviceAllow"]
    assert sc["DevicePolicy"] == "closed"
    assert sc["PrivateDevices"] is False
    assert sc["MemoryDenyWriteExecute"] is False
    assert sc["LimitMEMLOCK"] == "infinity"
    assert sc["KillSignal"] == "SIGINT"
    # SIGINT to vLLM's main process alone; SIGKILL cgroup-wide only after TimeoutStopSec.
    assert sc["KillMode"] == "mixed"
    assert sc["DynamicUser"] is True
    assert sc["ProtectSystem"] == "strict"
    assert sc["CapabilityBoundingSet"] == [""]
    assert sc["Restart"] == "on-failure"
    assert server(base)["startLimitBurst"] > 0
    # The start budget covers the gate's wait plus a cold compile.
    assert sc["TimeoutStartSec"] >= 600 + 900


def test_every_relaxation_is_commented() -> None:
    text = (REPO / "modules" / "qwen3090" / "default.nix").read_text().splitlines()
    relaxed = (
        "PrivateDevices = false;",
        "MemoryDenyWriteExecute = false;",
        'LimitMEMLOCK = "infinity";',
        'ProcSubset = "all";',
        'ProtectProc = "default";',
    )
    for setting in relaxed:
        (index,) = [i for i, line in enumerate(text) if line.strip() == setting]
        assert text[index - 1].strip().startswith("#"), f"{setting} has no comment above it"


def test_api_key_goes_through_load_credential(tmp_path: Path) -> None:
    secret = "sk-qwen3090-test-secret-7f3a"
    key_file = tmp_path / "api-key"
    key_file.write_text(secret)
    summary = eval_module(
        f'{{ services.qwen3090 = {{ enable = true; apiKeyFile = "{key_file}"; }}; }}'
    )
    unit = server(summary)
    assert unit["serviceConfig"]["LoadCredential"] == [f"api-key:{key_file}"]
    assert unit["environment"]["API_KEY_FILE"] == "%d/api-key"
    rendered = json.dumps(summary)
    assert secret not in rendered
    # Neither the settings file nor the command line carries the key or its path.
    assert str(key_file) not in json.dumps(summary["configFile"])
    assert str(key_file) not in unit["serviceConfig"]["ExecStart"]


def test_api_key_as_a_nix_path_is_refused(tmp_path: Path) -> None:
    key_file = tmp_path / "api-key"
    key_file.write_text("secret")
    # A path literal would be copied into the world-readable store: the type refuses it.
    error = eval_module_error(
        f"{{ services.qwen3090 = {{ enable = true; apiKeyFile = {key_file}; }}; }}"
    )
    assert "apiKeyFile" in error
    assert "not in the Nix store" in error
    store_key = "/nix/store/0c4y4z8wklmnpqrsvwxyz0123456789a-key"
    error = eval_module_error(
        f'{{ services.qwen3090 = {{ enable = true; apiKeyFile = "{store_key}"; }}; }}'
    )
    assert "not in the Nix store" in error


def test_without_api_key_no_credential(base: dict[str, Any]) -> None:
    summary = eval_module("{ services.qwen3090.enable = true; }")
    unit = server(summary)
    assert unit["serviceConfig"]["LoadCredential"] == []
    assert "API_KEY_FILE" not in unit["environment"]


def test_open_firewall_false_opens_nothing(base: dict[str, Any]) -> None:
    assert base["firewall"]["allowedTCPPorts"] == []
    assert base["firewall"]["allowedUDPPorts"] == []
    opened = eval_module(
        "{ services.qwen3090 = { enable = true; openFirewall = true; port = 18555; }; }"
    )
    assert opened["firewall"]["allowedTCPPorts"] == [18555]


def test_disabled_module_renders_nothing() -> None:
    summary = eval_module("{ services.qwen3090.enable = false; }")
    assert summary["units"] == {}
    assert summary["firewall"]["allowedTCPPorts"] == []


def test_shared_module_assertions_pass_on_this_evaluation() -> None:
    harness = REPO / "checks" / "eval-module.nix"
    failures = eval_json(
        f"let s = (import {harness} {{ inherit lib; configuration = {BASE}; }}).config; in "
        f"import {REPO}/checks/module-assertions.nix {{ inherit lib; "
        f'apiKeyFile = "{KEY_PATH}"; units = s.systemd.services; '
        "firewall = s.networking.firewall; }"
    )
    assert failures == []


def test_shared_module_assertions_catch_a_bad_unit() -> None:
    harness = REPO / "checks" / "eval-module.nix"
    failures = eval_json(
        f"let s = (import {harness} {{ inherit lib; configuration = {BASE}; }}).config; "
        "u = s.systemd.services; bad = u // { qwen3090 = u.qwen3090 // { serviceConfig = "
        'u.qwen3090.serviceConfig // { KillSignal = "SIGTERM"; KillMode = "control-group"; '
        'ExecStartPre = [ "qwen3090 \\"gate\\"" ] ++ u.qwen3090.serviceConfig.ExecStartPre; '
        'ExecStart = "qwen3090 \\"serve\\" \\"--config\\" \\"f\\" \\"--no-gate\\""; }; }; }; in '
        f"import {REPO}/checks/module-assertions.nix {{ inherit lib; "
        f'apiKeyFile = "{KEY_PATH}"; units = bad; firewall = s.networking.firewall; }}'
    )
    assert any("SIGINT" in f for f in failures)
    assert any("KillMode must be mixed" in f for f in failures)
    assert any("serve owns the GPU gate" in f for f in failures)
    assert any("serve must gate the GPU" in f for f in failures)


def test_settings_may_not_shadow_the_options() -> None:
    summary = eval_module(
        "{ services.qwen3090 = { enable = true; settings.port = 1; }; }"
    )
    assert any("must not set" in m for m in summary["failedAssertions"])


def test_dflash_in_the_target_path_is_refused() -> None:
    summary = eval_module(
        '{ services.qwen3090 = { enable = true; modelDir = "/models/Qwen3.8-27B-DFlash2"; }; }'
    )
    assert any("gotcha 14" in m for m in summary["failedAssertions"])


def test_non_loopback_without_key_warns() -> None:
    summary = eval_module('{ services.qwen3090 = { enable = true; host = "0.0.0.0"; }; }')
    assert any("without services.qwen3090.apiKeyFile" in w for w in summary["warnings"])
    assert eval_module("{ services.qwen3090.enable = true; }")["warnings"] == []


def test_fetch_model_unit_backs_off_and_gates_the_server() -> None:
    summary = eval_module(
        "{ services.qwen3090 = { enable = true; fetchModel = { enable = true; "
        'targets = [ "base" ]; revisions.base = "abc123"; '
        'tokenFile = "/run/keys/hf"; }; }; }'
    )
    fetch = summary["units"]["qwen3090-fetch-model"]
    sc = fetch["serviceConfig"]
    assert sc["Type"] == "oneshot"
    assert sc["Restart"] == "on-failure"
    assert sc["RestartSteps"] > 1 and sc["RestartMaxDelaySec"]
    assert exec_argv(sc["ExecStart"])[1:] == [
        "fetch", "base", "--dest", "/var/lib/qwen3090/models", "--revision", "base=abc123",
    ]
    # Network failures back off; a missing revision stops the unit at once.
    assert sc["RestartPreventExitStatus"] == [4]
    assert summary["warnings"] == []
    assert sc["LoadCredential"] == ["hf-token:/run/keys/hf"]
    assert fetch["environment"]["HF_TOKEN_PATH"] == "%d/hf-token"
    assert sc["User"] == server(summary)["serviceConfig"]["User"]
    assert "network-online.target" in fetch["after"]
    assert "qwen3090-fetch-model.service" in server(summary)["requires"]
    assert "qwen3090-fetch-model.service" in server(summary)["after"]
    assert fetch["unitConfig"]["OnSuccess"] == ["qwen3090.service"]


def test_prometheus_scrape_jobs_and_rules() -> None:
    summary = eval_module(
        '{ services.qwen3090 = { enable = true; host = "0.0.0.0"; '
        "prometheus.scrape.enable = true; }; }"
    )
    jobs = {j["job_name"]: j for j in summary["prometheus"]["scrapeConfigs"]}
    assert jobs["qwen3090-vllm"]["static_configs"][0]["targets"] == ["127.0.0.1:18020"]
    assert jobs["qwen3090-exporter"]["static_configs"][0]["targets"] == ["127.0.0.1:18021"]
    (rules,) = summary["prometheus"]["ruleFiles"]
    assert rules.endswith("modules/prometheus/rules.yml")
    rules_present = (REPO / "modules" / "prometheus" / "rules.yml").is_file()
    missing = [m for m in summary["failedAssertions"] if "rules.yml" in m]
    assert bool(missing) != rules_present
    exporter = summary["units"]["qwen3090-exporter"]
    assert exec_argv(exporter["serviceConfig"]["ExecStart"])[1:] == [
        "exporter", "--host", "0.0.0.0", "--port", "18021", "--vllm-url", "http://127.0.0.1:18020",
        "--server-log", "/var/log/qwen3090/server.log",
        "--state-dir", "/var/lib/qwen3090-exporter",
    ]


def test_rendered_settings_hold_the_knobs_and_owned_keys(base: dict[str, Any]) -> None:
    value = base["configFile"]["value"]
    assert value == {
        "SPEC": "dflash2",
        "CTX": "long",
        "DFLASH_TOKENS": 15,
        "PREFIX_CACHE": 1,
        "profile": "single-user",
        "host": "127.0.0.1",
        "port": 18020,
        "model": "/var/lib/qwen3090/models/Qwen3.8-27B-W4A16-AutoRound",
        # SPEC = dflash2 without a DRAFT: the drafter where the fetch unit puts it.
        "DRAFT": "/var/lib/qwen3090/models/Qwen3.8-27B-DFlash2-W4A16",
    }


def _plan(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    exe = shutil.which("qwen3090") or str(Path(sys.executable).parent / "qwen3090")
    proc = subprocess.run(
        [exe, "plan", *args, "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_rendered_yaml_round_trips_through_plan(tmp_path: Path) -> None:
    if not (REPO / "python" / "qwen3090" / "commands" / "plan.py").is_file():
        pytest.skip("`qwen3090 plan` does not exist yet (python/qwen3090/commands/plan.py)")
    model = tmp_path / "Qwen3.8-27B-W4A16-AutoRound"
    model.mkdir()
    summary = eval_module(
        f'{{ services.qwen3090 = {{ enable = true; modelDir = "{model}"; port = 18555; '
        f'modelsDir = "{tmp_path}"; '
        'settings = { SPEC = "dflash2"; CTX = "long"; DFLASH_TOKENS = 15; PREFIX_CACHE = 1; }; }; }'
    )
    config = tmp_path / "qwen3090.yaml"
    config.write_text(yaml.safe_dump(summary["configFile"]["value"]))
    clean = {k: v for k, v in os.environ.items() if not k.isupper() or k in ("PATH", "HOME")}
    from_file = _plan(["--config", str(config)], clean)
    from_knobs = _plan(
        ["--profile", "single-user", "--host", "127.0.0.1", "--port", "18555"],
        {
            **clean,
            "SPEC": "dflash2",
            "CTX": "long",
            "DFLASH_TOKENS": "15",
            "PREFIX_CACHE": "1",
            "MODEL": str(model),
            "DRAFT": str(tmp_path / "Qwen3.8-27B-DFlash2-W4A16"),
        },
    )
    assert from_file == from_knobs


def test_exporter_gets_the_key_by_credential_not_by_value() -> None:
    summary = eval_module(
        f'{{ services.qwen3090 = {{ enable = true; apiKeyFile = "{KEY_PATH}"; '
        "exporter.enable = true; }; }"
    )
    sc = summary["units"]["qwen3090-exporter"]["serviceConfig"]
    assert sc["LoadCredential"] == [f"api-key:{KEY_PATH}"]
    argv = exec_argv(sc["ExecStart"])
    assert argv[argv.index("--api-key-file") + 1] == (
        "/run/credentials/qwen3090-exporter.service/api-key"
    )
    assert sc["PrivateDevices"] is True


def _fetch_argv(summary: dict[str, Any]) -> list[str]:
    sc = summary["units"]["qwen3090-fetch-model"]["serviceConfig"]
    return exec_argv(sc["ExecStart"])[1:]


def _pins() -> dict[str, Any]:
    pins: dict[str, Any] = json.loads((REPO / "python" / "qwen3090" / "pins.json").read_text())
    return pins


def test_fetch_targets_are_the_pins_defaults_plus_the_drafter_dflash2_needs() -> None:
    models = _pins()["models"]
    defaults = sorted(n for n, m in models.items() if m.get("default"))
    drafters = sorted(n for n, m in models.items() if m.get("role") == "draft")
    assert defaults and drafters
    plain = eval_module("{ services.qwen3090 = { enable = true; fetchModel.enable = true; }; }")
    assert _fetch_argv(plain)[1:-2] == defaults
    dflash2 = eval_module(
        '{ services.qwen3090 = { enable = true; fetchModel.enable = true; '
        'settings.SPEC = "dflash2"; }; }'
    )
    assert _fetch_argv(dflash2)[1:-2] == defaults + drafters
    # The server looks for the drafter where the fetch unit puts it.
    assert dflash2["configFile"]["value"]["DRAFT"] == (
        f"/var/lib/qwen3090/models/{models[drafters[0]]['dir']}"
    )
    # A DRAFT of the user's own is not fetched and not overridden.
    own = eval_module(
        '{ services.qwen3090 = { enable = true; fetchModel.enable = true; '
        'settings = { SPEC = "dflash2"; DRAFT = "/srv/drafter"; }; }; }'
    )
    assert _fetch_argv(own)[1:-2] == defaults
    assert own["configFile"]["value"]["DRAFT"] == "/srv/drafter"


def test_fetch_targets_and_revisions_must_name_pinned_targets() -> None:
    error = eval_module_error(
        '{ services.qwen3090 = { enable = true; fetchModel = { enable = true; '
        'targets = [ "dflash2-draft" ]; }; }; }'
    )
    assert "fetchModel.targets" in error
    for name in _pins()["models"]:
        assert f'"{name}"' in error
    summary = eval_module(
        '{ services.qwen3090 = { enable = true; fetchModel = { enable = true; '
        'revisions.target = "abc"; }; }; }'
    )
    assert any("revisions names no target" in m for m in summary["failedAssertions"])


def test_unpinned_targets_warn_at_evaluation_and_stop_the_unit_once(tmp_path: Path) -> None:
    summary = eval_module(
        '{ services.qwen3090 = { enable = true; fetchModel = { enable = true; '
        'targets = [ "base" "dflash2" ]; revisions.dflash2 = "abc"; }; }; }'
    )
    sc = summary["units"]["qwen3090-fetch-model"]["serviceConfig"]
    (stop,) = sc["RestartPreventExitStatus"]
    unpinned = [w for w in summary["warnings"] if "no revision is pinned" in w]
    if _pins()["models"]["base"]["revision"] is None:
        (warning,) = unpinned
        assert "for base;" in warning and "fetchModel.revisions.base" in warning
        assert f"exit status {stop}" in warning
    else:
        assert unpinned == []
    # The status the unit stops on is the one `qwen3090 fetch` really exits with when a
    # target has no revision (a pins file with none; the check runs before any download).
    pins = _pins()
    pins["models"]["base"]["revision"] = None
    pins_file = tmp_path / "pins.json"
    pins_file.write_text(json.dumps(pins))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(
        QWEN3090_PINS=str(pins_file),
        PYTHONPATH=str(REPO / "python"),
    )
    done = subprocess.run(
        [sys.executable, "-m", "qwen3090", "fetch", "base", "--dest", str(tmp_path / "models")],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == stop, done.stderr
    assert "no revision of" in done.stderr and "--revision base=" in done.stderr


def _readme_nixos_example() -> str:
    """The ```nix block of README.md's "### NixOS" section: a system flake."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n### NixOS\n", 1)[1].split("\n### ", 1)[0]
    block = section.split("```nix\n", 1)[1].split("\n```", 1)[0]
    return block


def test_the_readme_nixos_example_evaluates_and_fails_clearly(tmp_path: Path) -> None:
    flake = tmp_path / "flake.nix"
    flake.write_text(_readme_nixos_example())
    harness = REPO / "checks" / "eval-module.nix"
    # The flake's outputs with stand-ins for its inputs: nixosSystem hands back its arguments,
    # and the qwen3090 input's module is a marker replaced by the module itself (the harness
    # imports modules/qwen3090); the README's own module is evaluated as written.
    summary = eval_json(
        f"let marker = {{ qwen3090ReadmeMarker = true; }}; "
        f"flake = import {flake}; "
        "system = (flake.outputs { self = { }; nixpkgs.lib.nixosSystem = args: args; "
        "qwen3090.nixosModules.default = marker; }).nixosConfigurations.gpu-box; "
        "isMarker = m: builtins.isAttrs m && m ? qwen3090ReadmeMarker; "
        "own = builtins.filter (m: !(isMarker m)) system.modules; "
        f"in assert builtins.length (builtins.filter isMarker system.modules) == 1; "
        f'assert system.system == "x86_64-linux"; '
        f"(import {harness} {{ inherit lib; configuration = {{ imports = own; }}; }}).summary"
    )
    assert summary["failedAssertions"] == []
    unit = server(summary)
    settings = summary["configFile"]["value"]
    argv = exec_argv(unit["serviceConfig"]["ExecStart"])
    assert argv[1:3] == ["serve", "--config"] and "--gate-timeout" in argv
    # The drafter SPEC = dflash2 needs is fetched, into the directory the server reads.
    fetch = _fetch_argv(summary)
    if settings.get("SPEC") == "dflash2":
        assert "dflash2" in fetch
        assert settings["DRAFT"].endswith(_pins()["models"]["dflash2"]["dir"])
    # Every target it fetches exists; one without a revision is named at evaluation time
    # and stops the fetch unit once instead of retrying forever.
    targets = fetch[1:fetch.index("--dest")]
    assert set(targets) <= set(_pins()["models"])
    unpinned = [t for t in targets if _pins()["models"][t]["revision"] is None
                and f"{t}=" not in " ".join(fetch)]
    if unpinned:
        (warning,) = [w for w in summary["warnings"] if "no revision is pinned" in w]
        assert all(f"fetchModel.revisions.{t}" in warning for t in unpinned)
    sc = summary["units"]["qwen3090-fetch-model"]["serviceConfig"]
    assert sc["RestartPreventExitStatus"] == [4]
    assert "qwen3090-fetch-model.service" in unit["requires"]


def test_module_eval_check_is_evaluation_only() -> None:
    """checks/module-eval.nix with the harness's stand-in for lib.nixosSystem: it passes, and
    its one output is the unit text without the package's string context, so building the
    check builds nothing of the closure."""
    harness = REPO / "checks" / "eval-module.nix"
    result = eval_json(
        f"let h = import {harness} {{ inherit lib; }}; "
        f"check = import {REPO}/checks/module-eval.nix {{ inherit lib; "
        'system = "x86_64-linux"; inherit (h) nixosSystem; '
        f"nixosModule = {REPO}/modules/qwen3090; "
        "writeText = name: text: { inherit name text; }; }; "
        "rendered = (h.nixosSystem { modules = [ "
        f"{REPO}/modules/qwen3090 {{ services.qwen3090.enable = true; }} ]; }})"
        '.config.systemd.units."qwen3090.service".text; '
        "in { inherit (check) name text; checkHasContext = builtins.hasContext check.text; "
        "renderedHasContext = builtins.hasContext rendered; "
        "package = toString h.config.services.qwen3090.package; }"
    )
    # The unit text as rendered does depend on the package ...
    assert result["renderedHasContext"] is True
    # ... and what the check writes does not, though it names the same store path.
    assert result["checkHasContext"] is False
    lines = result["text"].splitlines()
    (exec_start,) = [line for line in lines if line.startswith("ExecStart=")]
    assert result["package"] + "/bin/qwen3090" in exec_start
    for line in ("KillSignal=SIGINT", "KillMode=mixed", f"LoadCredential=api-key:{KEY_PATH}"):
        assert line in lines


def test_module_eval_check_fails_on_a_bad_unit() -> None:
    harness = REPO / "checks" / "eval-module.nix"
    proc = eval_json(
        f"let h = import {harness} {{ inherit lib; }}; "
        f"in (import {REPO}/checks/module-eval.nix {{ inherit lib; "
        'system = "x86_64-linux"; inherit (h) nixosSystem; '
        f"nixosModule = {{ imports = [ {REPO}/modules/qwen3090 ]; "
        'systemd.services.qwen3090.serviceConfig.KillMode = lib.mkForce "control-group"; }; '
        "writeText = name: text: { inherit name text; }; }).text",
        check=False,
    )
    assert proc.returncode != 0
    assert "KillMode must be mixed" in proc.stderr
    assert "lacks the line KillMode=mixed" in proc.stderr


def test_fetch_option_examples_name_targets_that_exist() -> None:
    harness = REPO / "checks" / "eval-module.nix"
    examples = eval_json(
        f"let o = (import {harness} {{ inherit lib; }}).evaluated.options.services.qwen3090; "
        "in { targets = o.fetchModel.targets.example; "
        "revisions = builtins.attrNames o.fetchModel.revisions.example; }"
    )
    names = set(_pins()["models"])
    assert examples["targets"] and set(examples["targets"]) <= names
    assert examples["revisions"] and set(examples["revisions"]) <= names
    text = (REPO / "modules" / "qwen3090" / "default.nix").read_text()
    for stale in ("dflash2-draft", "revisions.target", 'target = "0123'):
        assert stale not in text
