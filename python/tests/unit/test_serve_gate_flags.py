"""``qwen3090 serve`` owns the GPU gate: its --gate-* flags set the policy (the NixOS unit passes
its gpuGate options through them), --no-gate skips it, and a gate failure under serve suggests
serve's flags, never those of ``qwen3090 gate``.

No GPU here: ``nvidia-smi`` is a script printing what the real tool
prints, and the serve CLI, the gate and the probe around it are the real code.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import qwen3090
from qwen3090 import gate
from qwen3090.cli import build_parser
from qwen3090.commands.serve import gate_policy

pytestmark = pytest.mark.unit


def _serve_args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *flags])


def test_gate_flags_set_the_policy() -> None:
    policy = gate_policy(_serve_args("--gate-threshold-mib", "512", "--gate-timeout", "42"))
    assert policy is not None
    assert (policy.threshold_mib, policy.timeout_s) == (512, 42.0)
    # The gate's own pid is not a foreign holder, as with `qwen3090 gate`.
    assert os.getpid() in policy.own_pids


def test_without_flags_serve_uses_the_gates_defaults() -> None:
    policy = gate_policy(_serve_args())
    assert policy is not None
    assert policy.threshold_mib == gate.DEFAULT_THRESHOLD_MIB
    assert policy.timeout_s == gate.DEFAULT_TIMEOUT_S
    assert policy.samples == gate.DEFAULT_SAMPLES


def test_no_gate_means_no_policy() -> None:
    assert gate_policy(_serve_args("--no-gate", "--gate-timeout", "5")) is None


@pytest.mark.parametrize(
    "flags", [("--gate-timeout", "0"), ("--gate-timeout", "-3"), ("--gate-threshold-mib", "-1"),
              ("--gate-threshold-mib", "lots")],
)
def test_nonsense_gate_values_are_usage_errors(
    flags: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _serve_args(*flags)
    assert exit_info.value.code == 2
    assert flags[0] in capsys.readouterr().err


def _fake_smi(tmp_path: Path, used_mib: int) -> Path:
    """A bin dir whose ``nvidia-smi`` reports one RTX 3090 with ``used_mib`` in use and no
    compute process, in the CSV the real tool prints for the probe's two queries."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  --query-gpu=*) echo '0, GPU-5a0c3f3e-0000-4000-8000-000000003090, "
        f"NVIDIA GeForce RTX 3090, {used_mib}, 24576, Disabled, Disabled' ;;\n"
        "  --query-compute-apps=*) ;;\n"
        '  *) echo "unexpected: $*" >&2; exit 9 ;;\n'
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bindir


def _serve(bindir: Path, model: Path, tmp_path: Path, *flags: str,
           extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec("pynvml") is not None:
        pytest.skip("NVML is installed here: serve would read the real card, not the script")
    env = {k: v for k, v in os.environ.items() if k not in {"MODEL", "API_KEY_FILE"}}
    env.update(
        PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}",
        MODEL=str(model),
        QWEN3090_CACHE_DIR=str(tmp_path / "cache"),
        # The package under test, not whichever copy the environment has installed.
        PYTHONPATH=str(Path(qwen3090.__file__).resolve().parents[1]),
    )
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, "-m", "qwen3090", "serve", "--device", "cuda", *flags],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )


def _names_gate_command_flags(text: str) -> list[str]:
    """`qwen3090 gate` flags (not serve's --gate-* ones) mentioned in ``text``."""
    return re.findall(
        r"(?<![\w-])--(?:timeout|threshold-mib|source|plan-device|device-index|interval)\b",
        text,
    )


def test_serve_gate_timeout_names_serves_flags(
    tmp_path: Path, demo_model_dir: Path
) -> None:
    bindir = _fake_smi(tmp_path, 3000)  # nobody listed, but over the 2048 MiB default
    done = _serve(bindir, demo_model_dir, tmp_path, "--gate-timeout", "1",
                  "--gate-threshold-mib", "2500")
    assert done.returncode == 3, done.stderr
    # The flags reached the gate ...
    assert "(timeout 1 s)" in done.stderr
    assert "threshold 2500 MiB" in done.stderr
    # ... and the fix speaks serve's language.
    assert "--gate-timeout" in done.stderr and "--no-gate" in done.stderr
    assert _names_gate_command_flags(done.stderr) == [], done.stderr


def test_serve_gate_threshold_lets_a_desktop_card_pass(
    tmp_path: Path, demo_model_dir: Path
) -> None:
    bindir = _fake_smi(tmp_path, 3000)
    # A missing API key file stops serve after the gate and before vLLM is exec'd.
    done = _serve(bindir, demo_model_dir, tmp_path, "--gate-threshold-mib", "4096",
                  "--gate-timeout", "30", extra_env={"API_KEY_FILE": str(tmp_path / "no-key")})
    assert "GPU 0 (NVIDIA GeForce RTX 3090) is free: 3000 of 24576 MiB used" in done.stderr
    assert "cannot read the API key file" in done.stderr
    assert done.returncode == 2


def test_serve_without_a_gpu_suggests_serves_flags(
    tmp_path: Path, demo_model_dir: Path
) -> None:
    empty = tmp_path / "no-smi"
    empty.mkdir()
    only_python = {"PATH": str(Path(sys.executable).parent)}
    done = _serve(empty, demo_model_dir, tmp_path, extra_env=only_python)
    assert done.returncode == 2, done.stderr
    assert "no NVIDIA GPU found" in done.stderr
    assert "--device cpu" in done.stderr
    assert _names_gate_command_flags(done.stderr) == [], done.stderr


# ---- issue 19: the environment is checked before the GPU, the gate's reading feeds the plan --


def _smi_that_must_not_run(tmp_path: Path) -> tuple[Path, Path]:
    """A bin dir whose ``nvidia-smi`` leaves a marker file and fails: any call is a touch."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    marker = tmp_path / "smi-was-called"
    script = bindir / "nvidia-smi"
    script.write_text(f"#!/bin/sh\ntouch '{marker}'\nexit 9\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bindir, marker


def test_serve_refuses_a_variable_nothing_reads_before_the_gpu(
    tmp_path: Path, demo_model_dir: Path
) -> None:
    bindir, marker = _smi_that_must_not_run(tmp_path)
    done = _serve(bindir, demo_model_dir, tmp_path,
                  extra_env={"VLLM_DFLASH2_LOOKUP": "1", "VLLM_V2_CUDAGRAPH_MEM_MIB": "2600"})
    assert done.returncode == 2, done.stderr
    assert "VLLM_DFLASH2_LOOKUP='1'" in done.stderr and "through LOOKUP" in done.stderr
    assert "VLLM_V2_CUDAGRAPH_MEM_MIB='2600'" in done.stderr
    assert "GRAPH_MEM_MIB" in done.stderr
    assert not marker.exists(), "serve read the GPU before refusing its environment"
    assert "exec" not in done.stderr


# A pinned mtp pool of the dflash2 default holds 1.13 requests of 65536 tokens on a headless
# card (gotcha 25's model); what the gate reads beyond the baseline comes out of it.
PINNED_MTP = {"KV_MEM": "5583457484", "MAX_LEN": "65536"}


def test_serve_lowers_a_pinned_pool_by_what_the_gate_measured(
    tmp_path: Path, demo_model_dir: Path
) -> None:
    bindir = _fake_smi(tmp_path, 700)
    done = _serve(bindir, demo_model_dir, tmp_path, "--gate-timeout", "30",
                  extra_env={**PINNED_MTP, "API_KEY_FILE": str(tmp_path / "no-key")})
    assert "700 of 24576 MiB used" in done.stderr
    assert "lowered by 188 MiB, from 5583457484 to 5386325196 bytes" in done.stderr
    # The missing key file stops serve after the plan was redone and before vLLM is exec'd.
    assert "cannot read the API key file" in done.stderr
    assert done.returncode == 2


def test_serve_refuses_a_pool_the_measured_memory_leaves_too_small(
    tmp_path: Path, demo_model_dir: Path
) -> None:
    bindir = _fake_smi(tmp_path, 1300)
    # The missing key file keeps vLLM from starting should the refusal ever go missing.
    done = _serve(bindir, demo_model_dir, tmp_path, "--gate-timeout", "30",
                  extra_env={**PINNED_MTP, "API_KEY_FILE": str(tmp_path / "no-key")})
    assert done.returncode == 2, done.stderr
    assert "1300 of 24576 MiB used" in done.stderr  # the gate ran and passed ...
    assert "other processes' GPU memory was taken out of it" in done.stderr  # ... then refused
    assert "exec" not in done.stderr
