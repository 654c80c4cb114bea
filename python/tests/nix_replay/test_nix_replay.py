"""The nix-replay tier: every derivation's build script (nix/build/*.py) run outside Nix on the
real pinned wheels, with the derivation's own decisions; the wrapper's run-time environment
exercised through Triton's and nvcc's own code; the checks' scripts in their copy layout.

What this cannot show, only a Nix build can: that nixpkgs' packages named in decisions.json
really hold the sonames claimed, the cc-wrapper and autoPatchelfHook themselves, the GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import checkscripts, replay
from tests.support.replay import Replayed

pytestmark = pytest.mark.nix_replay


@pytest.fixture(scope="module")
def replayed() -> Iterator[Replayed]:
    """One replay for the module: closure, patched vLLM and wrapper (about 11 GB under the
    cache directory while it runs, removed afterwards; the wheel cache stays)."""
    yield from replay.replayed_session()


def wrapper_env(replayed: Replayed, **extra: str) -> dict[str, str]:
    """A bare environment: PATH leads nowhere, so only what the wrapper adds is found."""
    tmp = replayed.work / "run-tmp"
    tmp.mkdir(exist_ok=True)
    return {"HOME": str(replayed.work), "PATH": "/var/empty", "TMPDIR": str(tmp), **extra}


def in_wrapper(replayed: Replayed, code: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return replay.run([str(replayed.wrapper / "bin" / "qwen3090-python"), "-c", code],
                      env=wrapper_env(replayed, **extra), timeout=600)


def fake_host_lib(root: Path) -> Path:
    """A distribution's library directory as the wrapper sees it: the driver's libcuda and NVML
    beside the host's own glibc and libstdc++ (names only: nothing here is loaded)."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ("libcuda.so.1", "libnvidia-ml.so.1", "libc.so.6", "libstdc++.so.6"):
        (root / name).write_bytes(b"")
    return root


def bad_path(p: str, env: dict[str, str]) -> bool:
    """nixpkgs' wrapper-common/utils.bash badPath: the cc-wrapper drops -L of such paths
    inside a build (NIX_ENFORCE_PURITY=1)."""
    if not p.startswith("/"):
        return False
    allowed = [env["NIX_STORE"], env["NIX_BUILD_TOP"], "/tmp"] + [
        env.get(v, "/tmp") for v in ("TMP", "TMPDIR", "TEMP", "TEMPDIR")
    ]
    return p != "/dev/null" and not any(p.startswith(a) for a in allowed)


# --- the closure: lock -> table -> install -> link ------------------------------------------


def test_table_leaves_out_what_the_server_never_imports() -> None:
    # lock2table.py's exclusion list, as the generated table records it. (Read here, not at
    # import: checks.python-tests collects this file in a source without nix/.)
    excluded: dict[str, str] = replay.table()["excluded"]
    names = {w["name"] for part in ("runtime", "test") for w in replay.wheel_set(part)}
    assert not names & set(excluded), names & set(excluded)
    assert {"torchcodec", "pynvvideocodec", "torchaudio", "tokenspeed-mla"} <= set(excluded)
    # The second Triton went with tokenspeed-mla.
    assert "tokenspeed-triton" not in names and "triton" in names
    assert all(len(reason) > 40 for reason in excluded.values())


def test_closure_installs_as_the_install_phase_does(replayed: Replayed) -> None:
    site = replay.site_packages(replayed.closure)
    assert "collide" not in replayed.closure_log, replayed.closure_log[-3000:]
    for package in ("torch", "triton", "flashinfer", "transformers", "nvidia"):
        assert (site / package).is_dir(), replayed.closure_log[-3000:]
    # The collision decision took effect: neither copy of build_backend.py is there.
    assert not (site / "build_backend.py").exists()
    assert list((site / "torch").rglob("*.pyc")), "compileall did not run"


def test_colliding_wheels_fail_the_install_with_their_names(tmp_path: Path) -> None:
    both = [e for e in replay.wheel_set("runtime")
            if e["name"] in ("flashinfer-python", "torch-c-dlpack-ext")]
    assert len(both) == 2
    undecided = tmp_path / "decisions.json"
    data = replay.decisions()
    data["collisions"] = {}
    undecided.write_text(json.dumps(data))
    proc = replay.install_closure(tmp_path / "prefix", replay.fetch(both), undecided,
                                  compile_bytecode=False)
    assert proc.returncode == 1
    assert "build_backend.py: installed by flashinfer-python, torch-c-dlpack-ext" in proc.stderr


def test_closure_links_with_the_derivations_ignore_list(replayed: Replayed) -> None:
    proc = replay.resolve(replayed.closure, "closure")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 unsatisfied" in proc.stdout


def test_the_old_ignore_list_leaves_sonames_unsatisfied(replayed: Replayed, tmp_path: Path) -> None:
    # Before decisions.json the closure ignored libcuda and NVML only: the resolution must name
    # what that list left missing, and the file needing each.
    old = replay.decisions()
    old["closure"]["ignored"] = {"libcuda.so.1": "driver"}
    path = tmp_path / "decisions.json"
    path.write_text(json.dumps(old))
    proc = replay.resolve(replayed.closure, "closure", decisions_file=path)
    assert proc.returncode == 1
    assert "unsatisfied libmpi.so.40, needed by " in proc.stderr
    assert "nvshmem" in proc.stderr
    assert "unsatisfied libtbb.so.12, needed by " in proc.stderr


def test_vllm_is_patched_and_links_against_the_closure(replayed: Replayed) -> None:
    assert "patched vLLM 0.28.0" in replayed.vllm_log, replayed.vllm_log[-3000:]
    manifest = json.loads((replayed.vllm_site / "vllm" / "_qwen3090" / "manifest.json").read_text())
    series = (replay.REPO / "patches" / "series").read_text().split()
    assert [p["name"] + ".patch" for p in manifest["patches"]] == [
        s for s in series if s.endswith(".patch")
    ]
    assert not list(replayed.vllm_site.glob("vllm-*.dist-info/RECORD"))
    site = replay.site_packages(replayed.closure)
    search = [site / p for p in replay.decisions()["vllm"]["searchPaths"]]
    proc = replay.resolve(replayed.vllm_site, "vllm", search)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- the wrapper's run-time environment ------------------------------------------------------


def test_triton_finds_the_wrappers_compiler(replayed: Replayed) -> None:
    # Triton's own build function compiles a C extension with nothing but the wrapper's PATH
    # and CC, as it builds its CUDA launcher on the first kernel.
    code = (
        "import os, tempfile\n"
        "from triton.runtime.build import _build\n"
        "d = tempfile.mkdtemp()\n"
        "open(d + '/probe.c', 'w').write('#include <Python.h>\\n"
        "static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, \"probe\", 0, -1, 0};\\n"
        "PyMODINIT_FUNC PyInit_probe(void) { return PyModule_Create(&m); }\\n')\n"
        "print(os.environ['CC'])\n"
        "print(_build('probe', d + '/probe.c', d, [], [], [], []))\n"
    )
    proc = in_wrapper(replayed, code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cc, built = proc.stdout.split()
    assert Path(cc).parent == replayed.tools
    assert Path(built).is_file()


def test_flashinfer_jit_tools_are_on_the_wrappers_paths(replayed: Replayed, tmp_path: Path) -> None:
    # FlashInfer: CUDA_HOME (else `which nvcc`), $CUDA_HOME/bin/nvcc, c++ and ninja. nvcc of the
    # closure compiles a kernel for sm_86 with the wrapper's host compiler.
    kernel = tmp_path / "k.cu"
    kernel.write_text("__global__ void k(float* x) { x[threadIdx.x] += 1.0f; }\n")
    code = (
        "import os, shutil, subprocess, sys\n"
        "home = os.environ['CUDA_HOME']\n"
        "for tool in ('which', 'c++', 'ninja'):\n"
        "    assert shutil.which(tool), tool\n"
        "subprocess.run([home + '/bin/nvcc', '-arch=sm_86', '-c', sys.argv[1], '-o',\n"
        "                sys.argv[1] + '.o'], check=True)\n"
        "print(home)\n"
    )
    proc = replay.run([str(replayed.wrapper / "bin" / "qwen3090-python"), "-c", code,
                       str(kernel)], env=wrapper_env(replayed), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.strip() == str(replay.site_packages(replayed.closure) / "nvidia" / "cu13")
    assert (tmp_path / "k.cu.o").is_file()


def test_driver_libraries_come_alone_on_another_distribution(replayed: Replayed,
                                                               tmp_path: Path) -> None:
    host = fake_host_lib(tmp_path / "usr-lib")
    code = (
        "import json, os\n"
        "from triton.backends.nvidia.driver import libcuda_dirs\n"
        "print(json.dumps({'ld': os.environ.get('LD_LIBRARY_PATH', ''),\n"
        "                  'triton': libcuda_dirs()}))\n"
    )
    proc = in_wrapper(replayed, code, QWEN3090_DRIVER_LIB=str(host))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    for entry in got["ld"].split(":"):
        names = set(os.listdir(entry))
        assert "libcuda.so.1" in names and "libnvidia-ml.so.1" in names
        # The host's glibc and libstdc++ must never come ahead of the store's.
        assert not names & {"libc.so.6", "libstdc++.so.6"}, entry
    assert all((Path(d) / "libcuda.so.1").exists() for d in got["triton"])


def test_no_driver_sets_no_triton_libcuda_path(replayed: Replayed) -> None:
    if any(Path(d, "libcuda.so.1").exists() for d in
           ("/run/opengl-driver/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib",
            "/usr/lib/wsl/lib")):
        pytest.skip("this machine has an NVIDIA driver")
    proc = in_wrapper(replayed, "import os; print(os.environ.get('TRITON_LIBCUDA_PATH'))",
                      QWEN3090_DRIVER_LIB="/var/empty")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "None"


def test_libcuda_dir_survives_the_cc_wrapper_inside_a_build(replayed: Replayed,
                                                            tmp_path: Path) -> None:
    # checks.gpu-serve-demo: inside the build, Triton links -lcuda with -L<libcuda_dirs()>; the
    # cc-wrapper drops an -L outside the store and the build directory.
    build_top = tmp_path / "build"
    build_top.mkdir()
    driver = fake_host_lib(tmp_path / "run-opengl-driver-lib")
    env = {"NIX_STORE": "/nix/store", "NIX_BUILD_TOP": str(build_top), "TMPDIR": str(build_top),
           "NIX_ENFORCE_PURITY": "1"}
    code = "from triton.backends.nvidia.driver import libcuda_dirs; print(*libcuda_dirs())"
    proc = in_wrapper(replayed, code, QWEN3090_DRIVER_LIB=str(driver), **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dirs = proc.stdout.split()
    assert dirs and not any(bad_path(d, env) for d in dirs), dirs
    # What the old wrapper passed is what the cc-wrapper drops.
    assert bad_path("/run/opengl-driver/lib", env)


# --- the checks' scripts in their copy layout ------------------------------------------------


def test_python_tests_check_runs_in_its_copy_layout(replayed: Replayed) -> None:
    spec = checkscripts.check("python-tests")
    src = checkscripts.copy_source(replayed.work / "src")
    proc = checkscripts.run_check(
        "python-tests",
        {checkscripts.FAKE_SRC: str(src), spec["testTools"]: str(replayed.test_tools),
         spec["qwen3090"]: str(replayed.wrapper)},
        [replayed.wrapper / "bin"], replayed.work,
    )
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "error" not in proc.stdout.splitlines()[-1]


def test_tokenizer_check_runs(replayed: Replayed) -> None:
    spec = checkscripts.check("tokenizer")
    proc = checkscripts.run_check("tokenizer", {spec["qwen3090"]: str(replayed.wrapper)},
                                  [replayed.wrapper / "bin"], replayed.work)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_verifier_check_runs(replayed: Replayed) -> None:
    spec = checkscripts.check("verifier")
    patch = shutil.which("patch")
    assert patch is not None
    proc = checkscripts.run_check(
        "verifier",
        {spec["qwen3090"]: str(replayed.wrapper), spec["vllm"]: str(replayed.vllm_site.parents[2])},
        [replayed.wrapper / "bin"], replayed.work,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((replayed.work / "build-verifier" / "verify.json").read_text())
    assert report, proc.stdout[-3000:]
    assert "vllm 0.28.0 torch 2.13.0" in proc.stdout
