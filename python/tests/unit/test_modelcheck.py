"""``check_model_dir`` / ``qwen3090 check model`` on real generated model directories."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qwen3090.errors import Qwen3090Error
from qwen3090.modelcheck import check_model_dir, require_model_dirs

pytestmark = pytest.mark.unit


def _only(problems: list[str], directory: Path) -> str:
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{directory}: ")
    assert "fix: " in problems[0]
    return problems[0]


def test_complete_dir_passes(tiny_model: Path) -> None:
    assert check_model_dir(tiny_model) == []
    assert check_model_dir(tiny_model, "draft") == []


def test_no_tokenizer_json_fails_naming_dir_and_gotcha(tiny_model: Path) -> None:
    (tiny_model / "tokenizer.json").unlink()
    text = _only(check_model_dir(tiny_model), tiny_model)
    assert "no tokenizer.json" in text and "ReasoningConfig" in text
    # A drafter shares the target's tokenizer, so it needs none.
    assert check_model_dir(tiny_model, "draft") == []


def test_empty_vocabulary_is_caught(tiny_model: Path) -> None:
    # The trap of gotcha 32 in its own file: a vocabulary that loads and encodes to [].
    from tokenizers import Tokenizer, models, pre_tokenizers

    empty = Tokenizer(models.BPE())
    empty.pre_tokenizer = pre_tokenizers.ByteLevel()
    empty.save(str(tiny_model / "tokenizer.json"))
    problems = check_model_dir(tiny_model)
    assert len(problems) == 2  # both '<think>' and '</think>'
    assert all("encodes '<" in p and "to no tokens" in p for p in problems)
    # A vocabulary that raises instead of returning [] is reported, not a crash.
    Tokenizer(models.WordLevel({}, unk_token=None)).save(str(tiny_model / "tokenizer.json"))
    problems = check_model_dir(tiny_model)
    assert len(problems) == 2 and all("cannot encode" in p for p in problems)


def test_broken_tokenizer_json_and_config(tiny_model: Path) -> None:
    (tiny_model / "tokenizer.json").write_text("{not json")
    (tiny_model / "tokenizer_config.json").unlink()
    problems = check_model_dir(tiny_model)
    assert any("no tokenizer_config.json" in p for p in problems)
    assert any("tokenizer.json does not load" in p for p in problems)


def test_missing_shard_is_named(tiny_model: Path) -> None:
    (tiny_model / "model-00002-of-00003.safetensors").unlink()
    text = _only(check_model_dir(tiny_model), tiny_model)
    assert "1 of 3 shard(s)" in text and "model-00002-of-00003.safetensors" in text


def test_truncated_shard_is_caught(tiny_model: Path) -> None:
    shard = tiny_model / "model-00001-of-00003.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    text = _only(check_model_dir(tiny_model), tiny_model)
    assert "model-00001-of-00003.safetensors is truncated" in text


def test_index_naming_a_tensor_the_shard_lacks(tiny_model: Path) -> None:
    index_path = tiny_model / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["model.embed_tokens.weight_packed"] = "model-00001-of-00003.safetensors"
    index_path.write_text(json.dumps(index))
    text = _only(check_model_dir(tiny_model), tiny_model)
    assert "lacks 1 tensor(s)" in text and "embed_tokens.weight_packed" in text


def test_no_weights_and_no_config(tiny_model: Path) -> None:
    for f in tiny_model.glob("model*"):
        f.unlink()
    (tiny_model / "config.json").unlink()
    problems = check_model_dir(tiny_model)
    assert any("no config.json" in p for p in problems)
    assert any("no weights" in p for p in problems)


def test_dflash_in_a_target_path_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    moved = tmp_path / "Qwen3.8-27B-DFlash2-test" / "model"
    shutil.copytree(tiny_model, moved)
    text = _only(check_model_dir(moved), moved)
    assert "contains 'dflash'" in text and "gotcha 14" in text
    # The same dir as a drafter is what dflash expects.
    assert check_model_dir(moved, "draft") == []
    # A relative path through a symlink is still seen (vLLM may get either form).
    link = tmp_path / "innocent"
    link.symlink_to(moved)
    assert any("dflash" in p for p in check_model_dir(link))


def test_missing_dir(tmp_path: Path) -> None:
    text = _only(check_model_dir(tmp_path / "nope"), tmp_path / "nope")
    assert "does not exist" in text


def test_a_missing_pinned_checkpoint_is_fetched_on_cuda_and_replaced_on_cpu(
    tmp_path: Path,
) -> None:
    from qwen3090.pins import load_targets

    base = load_targets()["base"]
    missing = tmp_path / "models" / base.dir
    on_cuda = _only(check_model_dir(missing), missing)
    assert on_cuda.endswith(f"fix: qwen3090 fetch base --dest {missing.parent}")
    on_cpu = _only(check_model_dir(missing, device="cpu"), missing)
    assert "qwen3090 demo-model DIR" in on_cpu and "MODEL=DIR" in on_cpu
    assert "qwen3090 fetch" not in on_cpu
    # A dir the user made (not a pinned one) that exists keeps the generic repair on the CPU.
    own = tmp_path / "mine"
    own.mkdir()
    problems = check_model_dir(own, device="cpu")
    assert problems and all("re-download the checkpoint" in p for p in problems)


def test_require_model_dirs_lists_every_problem(tiny_model: Path, tmp_path: Path) -> None:
    (tiny_model / "tokenizer.json").unlink()
    with pytest.raises(Qwen3090Error) as info:
        require_model_dirs([(tiny_model, "target"), (tmp_path / "drafter", "draft")])
    assert str(tiny_model) in info.value.message
    assert str(tmp_path / "drafter") in info.value.message
    require_model_dirs([])  # nothing to check is fine


def test_check_cli(tiny_model: Path, tiny_model_master: Path) -> None:
    (tiny_model / "tokenizer.json").unlink()
    cmd = [sys.executable, "-m", "qwen3090", "check", "model"]
    ok = subprocess.run(
        [*cmd, str(tiny_model_master)], capture_output=True, text=True, timeout=60, check=False
    )
    assert ok.returncode == 0 and f"ok   {tiny_model_master} (target)" in ok.stdout
    bad = subprocess.run(
        [*cmd, str(tiny_model_master), str(tiny_model)], capture_output=True, text=True,
        timeout=60, check=False,
    )
    assert bad.returncode == 1
    assert f"FAIL {tiny_model}: no tokenizer.json" in bad.stderr
    draft = subprocess.run(
        [*cmd, "--role", "draft", str(tiny_model)], capture_output=True, text=True, timeout=60,
        check=False,
    )
    assert draft.returncode == 0


def test_shared_demo_model_passes(request: pytest.FixtureRequest) -> None:
    """The spine's generated demo model is what the CPU tier serves: it must pass too."""
    try:
        demo = request.getfixturevalue("demo_model_dir")
    except pytest.FixtureLookupError:
        pytest.skip("the shared demo_model_dir fixture is not defined in this checkout")
    assert check_model_dir(Path(demo)) == []
