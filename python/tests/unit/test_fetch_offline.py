"""``qwen3090 fetch`` without a network: complete dirs make no call; incomplete ones say why.

Every run goes through ``tests/support/netguard.py``, which logs and refuses each socket
connection, with ``HF_ENDPOINT`` on a closed loopback port as a second fence. The download
test shows the guard does see the hub client's connections, so an empty log elsewhere means
"no call was made".
The Hugging Face Hub itself is not reachable here: a real download is not exercised.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from qwen3090.errors import Qwen3090Error
from qwen3090.fetch import _overlay_base_files, fetch_order
from qwen3090.pins import FetchTarget, load_targets

pytestmark = pytest.mark.unit

NETGUARD = Path(__file__).resolve().parents[1] / "support" / "netguard.py"
CLOSED_PORT = 18499  # in this area's port range; asserted closed below


def _pins(tmp_path: Path, models: Mapping[str, object] | None) -> Path:
    data: dict[str, object] = {"schema": 1}
    if models is not None:
        data["models"] = models
    path = tmp_path / "pins.json"
    path.write_text(json.dumps(data))
    return path


MODELS = {
    "base": {"repo": "example/Qwen3-tiny", "revision": None, "dir": "Qwen3-tiny",
             "role": "target", "default": True},
    "fast": {"repo": "example/Qwen3-tiny-fast", "revision": "0" * 40, "dir": "Qwen3-tiny-fast",
             "role": "target", "default": True, "link_from": "base",
             "allow_patterns": ["config.json"]},
    "drafter": {"repo": "example/tiny-drafter", "revision": "1" * 40, "dir": "drafter",
                "role": "draft"},
}


def _fetch(
    tmp_path: Path, pins: Path, *args: str, offline_env: bool = False
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    log = tmp_path / f"connections-{len(list(tmp_path.glob('connections-*')))}.log"
    log.touch()
    env = dict(os.environ, QWEN3090_PINS=str(pins), HF_ENDPOINT=f"http://127.0.0.1:{CLOSED_PORT}",
               HF_HOME=str(tmp_path / "hf-home"))
    env.pop("HF_HUB_OFFLINE", None)
    if offline_env:
        env["HF_HUB_OFFLINE"] = "1"
    done = subprocess.run(
        [sys.executable, str(NETGUARD), str(log), "fetch", *args],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    return done, log.read_text().splitlines()


def test_the_fence_port_is_closed() -> None:
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", CLOSED_PORT)) != 0


def test_complete_dir_makes_no_network_call_and_is_idempotent(
    tiny_model: Path, tmp_path: Path
) -> None:
    pins = _pins(tmp_path, MODELS)
    dest = tiny_model.parent
    for _ in range(2):
        done, calls = _fetch(tmp_path, pins, "base", "--dest", str(dest))
        assert done.returncode == 0, done.stderr
        assert f"base: {tiny_model}: already complete" in done.stdout
        assert calls == []
    # The offline switches change nothing for a complete dir.
    done, calls = _fetch(tmp_path, pins, "base", "--dest", str(dest), offline_env=True)
    assert done.returncode == 0 and calls == []


def test_incomplete_dir_offline_says_what_is_missing(tiny_model: Path, tmp_path: Path) -> None:
    pins = _pins(tmp_path, MODELS)
    (tiny_model / "tokenizer.json").unlink()
    (tiny_model / "model-00003-of-00003.safetensors").unlink()
    for args, env_offline in (((), True), (("--offline",), False)):
        done, calls = _fetch(
            tmp_path, pins, "base", "--dest", str(tiny_model.parent), *args,
            offline_env=env_offline,
        )
        assert done.returncode == 2
        assert "offline mode forbids downloading example/Qwen3-tiny" in done.stderr
        assert "no tokenizer.json" in done.stderr
        assert "model-00003-of-00003.safetensors" in done.stderr
        assert calls == []


def test_unpinned_target_needs_an_explicit_revision(tiny_model: Path, tmp_path: Path) -> None:
    pins = _pins(tmp_path, MODELS)
    (tiny_model / "tokenizer.json").unlink()
    done, calls = _fetch(tmp_path, pins, "base", "--dest", str(tiny_model.parent))
    assert done.returncode == 4  # "not pinned": the NixOS fetch unit does not retry it
    assert "no revision of example/Qwen3-tiny is pinned" in done.stderr
    assert "--revision base=" in done.stderr
    assert calls == []


def test_download_attempt_is_seen_and_reported(tiny_model: Path, tmp_path: Path) -> None:
    pins = _pins(tmp_path, MODELS)
    (tiny_model / "tokenizer.json").unlink()
    done, calls = _fetch(
        tmp_path, pins, "base", "--dest", str(tiny_model.parent), "--revision", "base=abc123"
    )
    assert done.returncode == 2
    # The hub client swallows the refused connection and hands back the local dir; the
    # re-check after it is what turns that into an error naming what is still missing.
    assert "still incomplete after snapshot_download of example/Qwen3-tiny@abc123" in done.stderr
    assert "no tokenizer.json" in done.stderr
    assert calls, "the hub client connected without the guard seeing it"
    assert all(str(CLOSED_PORT) in c for c in calls)


def test_missing_models_section_is_a_clear_error(tmp_path: Path) -> None:
    done, _ = _fetch(tmp_path, _pins(tmp_path, None), "--dest", str(tmp_path))
    assert done.returncode == 2 and "has no 'models' section" in done.stderr
    with pytest.raises(Qwen3090Error, match="no pins file"):
        load_targets(tmp_path / "absent.json")


def test_list_and_order(tmp_path: Path) -> None:
    pins = _pins(tmp_path, MODELS)
    done, calls = _fetch(tmp_path, pins, "--list", "--dest", "/srv/models")
    assert done.returncode == 0 and calls == []
    line = "base: example/Qwen3-tiny @ (no pinned revision) -> /srv/models/Qwen3-tiny"
    assert line in done.stdout
    assert "[default, target, overlay on base]" in done.stdout
    targets = load_targets(pins)
    assert [t.name for t in fetch_order([], targets)] == ["base", "fast"]
    assert [t.name for t in fetch_order(["fast"], targets)] == ["base", "fast"]
    assert [t.name for t in fetch_order(["drafter", "base"], targets)] == ["drafter", "base"]
    with pytest.raises(Qwen3090Error, match="unknown fetch target"):
        fetch_order(["nope"], targets)


def test_bad_target_entries_are_refused(tmp_path: Path) -> None:
    bad_role = {"x": {"repo": "a/b", "dir": "d", "role": "judge"}}
    with pytest.raises(Qwen3090Error, match="role"):
        load_targets(_pins(tmp_path, bad_role))
    no_repo = {"x": {"dir": "d"}}
    with pytest.raises(Qwen3090Error, match="repo"):
        load_targets(_pins(tmp_path, no_repo))
    dangling = {"x": {"repo": "a/b", "dir": "d", "link_from": "y"}}
    with pytest.raises(Qwen3090Error, match="link_from"):
        load_targets(_pins(tmp_path, dangling))


def test_overlay_takes_the_base_files_it_lacks(tiny_model: Path, tmp_path: Path) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "config.json").write_text('{"overlay": true}')
    _overlay_base_files(tiny_model, overlay)
    assert json.loads((overlay / "config.json").read_text()) == {"overlay": True}
    shard = "model-00001-of-00003.safetensors"
    assert (overlay / shard).read_bytes() == (tiny_model / shard).read_bytes()
    linked = (overlay / "tokenizer.json").stat().st_ino
    assert linked == (tiny_model / "tokenizer.json").stat().st_ino


def test_fetch_target_type_is_what_the_pins_say(tmp_path: Path) -> None:
    t = load_targets(_pins(tmp_path, MODELS))["fast"]
    assert t == FetchTarget(
        name="fast", repo="example/Qwen3-tiny-fast", revision="0" * 40, dir="Qwen3-tiny-fast",
        role="target", default=True, allow_patterns=("config.json",), link_from="base", note="",
    )
