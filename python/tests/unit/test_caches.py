"""Cache paths are decided in one place, keyed by the build, and cleared only where ours."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from qwen3090 import caches, cli
from qwen3090.errors import Qwen3090Error

pytestmark = pytest.mark.unit

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64


@dataclass(frozen=True)
class FakeBuild:
    vllm_version: str
    series_digest: str


def test_changing_the_series_digest_gives_a_new_empty_vllm_root(tmp_path: Path) -> None:
    env_a = caches.cache_env(tmp_path, FakeBuild("0.28.0", DIGEST_A), environ={})
    root_a = Path(env_a["VLLM_CACHE_ROOT"])
    (root_a / "torch_compile_cache").mkdir()
    (root_a / "torch_compile_cache" / "artifact").write_bytes(b"x" * 10)

    env_b = caches.cache_env(tmp_path, FakeBuild("0.28.0", DIGEST_B), environ={})
    root_b = Path(env_b["VLLM_CACHE_ROOT"])
    assert root_b != root_a
    assert root_b.is_dir() and list(root_b.iterdir()) == []
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE"):
        assert env_a[name] != env_b[name]
        assert Path(env_b[name]).is_relative_to(tmp_path)


def test_the_same_build_reuses_its_root(tmp_path: Path) -> None:
    build = FakeBuild("0.28.0", DIGEST_A)
    first = caches.cache_env(tmp_path, build, environ={})
    marker = Path(first["VLLM_CACHE_ROOT"]) / "kept"
    marker.write_text("warm")
    second = caches.cache_env(tmp_path, build, environ={})
    assert second == first
    assert marker.read_text() == "warm"


def test_a_new_vllm_version_is_a_new_root(tmp_path: Path) -> None:
    a = caches.cache_env(tmp_path, FakeBuild("0.28.0", DIGEST_A), environ={})
    b = caches.cache_env(tmp_path, FakeBuild("0.28.1", DIGEST_A), environ={})
    assert a["VLLM_CACHE_ROOT"] != b["VLLM_CACHE_ROOT"]


def test_no_manifest_means_a_stock_key(tmp_path: Path) -> None:
    paths = caches.resolve(tmp_path, None, environ={})
    assert paths.build.series_digest == caches.STOCK
    assert paths.build.key.endswith("-stock")
    assert paths.build.key.startswith(f"vllm-{caches.installed_vllm_version()}")


def test_base_comes_from_the_env_then_xdg(tmp_path: Path) -> None:
    env = {"QWEN3090_CACHE_DIR": str(tmp_path / "svc"), "XDG_CACHE_HOME": str(tmp_path / "x")}
    assert caches.resolve(None, None, env).base == tmp_path / "svc"
    env.pop("QWEN3090_CACHE_DIR")
    assert caches.resolve(None, None, env).base == tmp_path / "x" / "qwen3090"


def test_hf_home_rules(tmp_path: Path) -> None:
    build = FakeBuild("0.28.0", DIGEST_A)
    # A service (explicit base) keeps its own HF cache...
    svc = caches.cache_env(tmp_path / "svc", build, environ={})
    assert svc["HF_HOME"] == str(tmp_path / "svc" / "huggingface")
    # ...a plain install shares the user's standard one...
    plain = caches.cache_env(None, build, environ={"XDG_CACHE_HOME": str(tmp_path / "x")})
    assert plain["HF_HOME"] == str(tmp_path / "x" / "huggingface")
    assert plain["VLLM_CACHE_ROOT"].startswith(str(tmp_path / "x" / "qwen3090"))
    # ...and an HF_HOME the user set always wins.
    mine = caches.cache_env(tmp_path / "svc", build, environ={"HF_HOME": "/data/hf"})
    assert mine["HF_HOME"] == "/data/hf"


def _populate(base: Path, build: FakeBuild) -> Path:
    env = caches.cache_env(base, build, environ={})
    (Path(env["TRITON_CACHE_DIR"]) / "k").mkdir()
    (Path(env["TRITON_CACHE_DIR"]) / "k" / "kernel.so").write_bytes(b"\0" * 100)
    return Path(env["VLLM_CACHE_ROOT"]).parent


def test_clear_removes_only_this_projects_dirs(tmp_path: Path) -> None:
    base = tmp_path / "base"
    a = _populate(base, FakeBuild("0.28.0", DIGEST_A))
    b = _populate(base, FakeBuild("0.28.0", DIGEST_B))
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    # A link planted where a build would be must be unlinked, never followed.
    (base / caches.BUILDS / "evil").symlink_to(victim, target_is_directory=True)
    sibling = base / "not-ours.txt"
    sibling.write_text("unrelated")

    removed = caches.clear_builds(base, [a.name, "evil"])
    assert set(removed) == {a, base / caches.BUILDS / "evil"}
    assert not a.exists() and b.is_dir()
    assert (victim / "precious").read_text() == "keep me"
    assert sibling.read_text() == "unrelated"


def test_clear_refuses_a_base_that_is_not_ours(tmp_path: Path) -> None:
    stranger = tmp_path / "home-cache"
    (stranger / caches.BUILDS / "x").mkdir(parents=True)
    (stranger / caches.BUILDS / "x" / "data").write_text("theirs")
    with pytest.raises(Qwen3090Error, match="not a qwen3090 cache"):
        caches.clear_builds(stranger, ["x"])
    assert (stranger / caches.BUILDS / "x" / "data").read_text() == "theirs"


def test_clear_refuses_unmarked_builds_and_path_keys(tmp_path: Path) -> None:
    base = tmp_path / "base"
    _populate(base, FakeBuild("0.28.0", DIGEST_A))
    odd = base / caches.BUILDS / "hand-made"
    odd.mkdir()
    with pytest.raises(Qwen3090Error, match="not made by qwen3090"):
        caches.clear_builds(base, ["hand-made"])
    assert odd.is_dir()
    for bad in ("..", "../..", "a/b", ""):
        with pytest.raises(Qwen3090Error, match="not a build key"):
            caches.clear_builds(base, [bad])
    assert base.is_dir()


def _triton_record(path: Path, timings: dict[int, float]) -> None:
    """The file Triton 3.7's Autotuner writes with TRITON_CACHE_AUTOTUNING=1."""
    path.parent.mkdir(parents=True, exist_ok=True)
    configs = [
        [{"kwargs": {"BLOCK": block}, "num_warps": 4, "num_stages": 2}, [t, t, t]]
        for block, t in timings.items()
    ]
    path.write_text(json.dumps({"key": [1024, "torch.float16"], "configs_timings": configs}))


def _inductor_record(path: Path, xblock: int, ms: int) -> None:
    """The `.best_config` torch 2.13's inductor writes beside a tuned kernel."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {"XBLOCK": xblock, "num_warps": 4, "num_stages": 1, "configs_hash": "c0ffee",
             "found_by_coordesc": False, "time_taken_ms": ms, "triton_cache_hash": "zz"}
        )
    )  # fmt: skip


def test_fingerprint_follows_the_winners_not_the_timings(tmp_path: Path) -> None:
    def tree(root: Path, timings: dict[int, float], xblock: int, ms: int) -> list[Path]:
        _triton_record(root / "triton" / "ab12" / "chunk_gdn_fwd.autotune.json", timings)
        _inductor_record(root / "inductor" / "cd" / "cdef.best_config", xblock, ms)
        (root / "triton" / "ab12" / "chunk_gdn_fwd.so").write_bytes(os.urandom(64))
        return [root / "triton", root / "inductor"]

    one = caches.fingerprint(tree(tmp_path / "1", {64: 0.50, 128: 0.41}, 256, 12))
    # Same winners (BLOCK 128, XBLOCK 256), different measured timings and kernel binaries.
    same = caches.fingerprint(tree(tmp_path / "2", {64: 0.61, 128: 0.39}, 256, 40))
    # A different winner: the race went the other way (gotcha 48).
    other = caches.fingerprint(tree(tmp_path / "3", {64: 0.38, 128: 0.41}, 256, 12))
    other_inductor = caches.fingerprint(tree(tmp_path / "4", {64: 0.50, 128: 0.41}, 512, 12))
    assert one[1] == 2 and one[0].startswith("sha256:")
    assert one == same
    assert other[0] != one[0]
    assert other_inductor[0] != one[0]
    assert caches.fingerprint([tmp_path / "empty"]) == ("none", 0)


def test_cli_status_fingerprint_and_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "base"
    monkeypatch.delenv("QWEN3090_MANIFEST", raising=False)
    current = caches.resolve(base, caches.find_manifest())
    caches.prepare(current)
    _triton_record(current.component("triton") / "h" / "k.autotune.json", {64: 1.0, 32: 2.0})
    stale = _populate(base, FakeBuild("0.27.1", DIGEST_B))

    assert cli.main(["cache", "--cache-dir", str(base), "status", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    keys = {b["key"]: b for b in doc["builds"]}
    assert set(keys) == {current.build.key, stale.name}
    assert keys[current.build.key]["current"] is True
    assert keys[stale.name]["components"]["triton"]["bytes"] == 100

    assert cli.main(["cache", "--cache-dir", str(base), "fingerprint"]) == 0
    fp_line = capsys.readouterr().out
    assert fp_line.split()[0] == caches.build_fingerprint(current)[0] != "none"

    assert cli.main(["cache", "--cache-dir", str(base), "clear", "--stale"]) == 0
    assert not stale.exists() and current.build_dir.is_dir()
    assert cli.main(["cache", "--cache-dir", str(base), "clear"]) == 0
    assert not current.build_dir.exists()

    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "file").write_text("x")
    assert cli.main(["cache", "--cache-dir", str(stranger), "clear", "--all"]) != 0
    assert (stranger / "file").read_text() == "x"
