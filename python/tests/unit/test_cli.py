"""``qwen3090 plan`` / ``serve`` / ``demo-model`` as a user runs them: real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit


def qwen3090(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if k not in {"SPEC", "CTX", "MODEL", "KV_MEM", "PORT", "HOST", "EXTRA_ARGS"}}
    # This checkout's package first, whatever the working directory.
    package_root = str(Path(__file__).resolve().parents[2])
    base["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, base.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "qwen3090", *args],
        env={**base, **(env or {})}, cwd=cwd, capture_output=True, text=True, timeout=120,
    )


def test_plan_json_has_the_contract_keys(tmp_path: Path) -> None:
    out = qwen3090("plan", "--json", "--spec", "off", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert {"profile", "vllm_args", "env", "warnings", "argv"} <= set(plan)
    assert plan["profile"] == "single-user"
    assert plan["vllm_args"][0] == "models/Qwen3.8-27B-W4A16-AutoRound"
    assert "--speculative-config" not in plan["vllm_args"]
    # argv ends with the vLLM arguments (the model possibly moved into --model).
    assert plan["argv"][-len(plan["vllm_args"]) + 1:] == plan["vllm_args"][1:]
    assert plan["vllm_args"][0] in plan["argv"]


@pytest.mark.parametrize(
    ("env", "knob"),
    [
        ({"SPEC": "eagle"}, "SPEC"),
        ({"CTX": "tiny"}, "CTX"),
        ({"DFLASH_TOKENS": "0"}, "DFLASH_TOKENS"),
        ({"MODEL": "/models/qwen-dflash-target"}, "MODEL"),
        ({"KV_MEM": "five-gigabytes"}, "KV_MEM"),
    ],
)
@pytest.mark.parametrize("command", ["plan", "serve"])
def test_bad_knob_exits_nonzero_naming_it(
    env: dict[str, str], knob: str, command: str, tmp_path: Path
) -> None:
    # MODEL points nowhere: a failure about the knob (not the directory) shows the knob
    # was refused before any model access.
    full = {"MODEL": str(tmp_path / "no-such-model"), **env}
    out = qwen3090(command, env=full, cwd=tmp_path)
    assert out.returncode != 0
    assert f"{knob}" in out.stderr and "error" in out.stderr and "fix:" in out.stderr
    assert "no-such-model" not in out.stderr or knob == "MODEL"
    assert out.stdout == ""  # no plan printed
    assert "exec" not in out.stderr


def test_unknown_yaml_key_suggests_the_knob(tmp_path: Path) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text("SPECC: dflash2\n")
    out = qwen3090("plan", "--config", str(config), cwd=tmp_path)
    assert out.returncode != 0
    assert "SPECC" in out.stderr and "did you mean SPEC?" in out.stderr


def test_precedence_yaml_env_cli(tmp_path: Path) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text("spec: dflash2\nDFLASH_TOKENS: 15\nport: 18101\nprefix_cache: true\n")

    def tokens(env: dict[str, str], *flags: str) -> tuple[int, str]:
        out = qwen3090("plan", "--json", "--config", str(config), *flags, env=env, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        plan = json.loads(out.stdout)
        args = plan["vllm_args"]
        spec = json.loads(args[args.index("--speculative-config") + 1])
        assert "--enable-prefix-caching" in args
        return spec["num_speculative_tokens"], args[args.index("--port") + 1]

    assert tokens({}) == (15, "18101")  # YAML over the profile default (7, 18020)
    assert tokens({"DFLASH_TOKENS": "9"}) == (9, "18101")  # environment over YAML
    assert tokens({"DFLASH_TOKENS": "9"}, "--dflash-tokens", "5") == (5, "18101")  # CLI wins


def test_help_documents_the_precedence() -> None:
    for command in ("plan", "serve"):
        out = qwen3090(command, "--help")
        assert out.returncode == 0
        text = " ".join(out.stdout.split())
        assert "precedence, lowest first" in text.lower()
        assert "--config YAML" in text or "--config YAML file" in text
        assert "--dflash-tokens" in out.stdout


def test_serve_dry_run_checks_the_model_dir(tmp_path: Path) -> None:
    out = qwen3090("serve", "--dry-run", "--device", "cpu",
                   env={"MODEL": str(tmp_path / "absent")}, cwd=tmp_path)
    assert out.returncode != 0
    assert "absent" in out.stderr


def test_plan_for_the_cpu_device(tmp_path: Path) -> None:
    out = qwen3090("plan", "--json", "--device", "cpu", env={"PREFIX_CACHE": "1"}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["device"] == "cpu"
    assert all(w.startswith("CPU build: ") or "left out" in w for w in plan["warnings"])
    assert "--mamba-ssm-cache-dtype" in plan["vllm_args"]
