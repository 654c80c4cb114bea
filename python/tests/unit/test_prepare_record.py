"""The draft-vocab ranking and the preparation manifest, without vLLM (issue 23)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from qwen3090.errors import Qwen3090Error
from qwen3090.modelcheck import preparation_problems, prepared_steps
from qwen3090.patchtool import sha256_file
from qwen3090.prepare import draft_vocab as dv
from qwen3090.prepare import record
from qwen3090.prepare.prompts import BUILTIN_PROMPTS, read_prompt_file

pytestmark = pytest.mark.unit


def test_ids_ranked_by_frequency_ties_by_id_and_capped() -> None:
    counts = Counter({5: 3, 9: 7, 2: 3, 40: 1})
    assert dv.select_vocab(counts, 10) == [9, 2, 5, 40]
    assert dv.select_vocab(counts, 2) == [9, 2]
    assert dv.coverage(counts, [9, 2]) == pytest.approx(10 / 14)


def test_build_vocab_keeps_top_and_holds_out_every_fifth_prompt() -> None:
    outputs = [[1, 1, 2], [1, 3], [2, 2], [1, 4], [5, 1]]
    result = dv.build_vocab(outputs, top=100, vocab_size=6)
    assert result.ids == [1, 2, 3, 4, 5]
    assert result.coverage == 1.0
    # The list built from prompts 0-3 lacks 5, which is half the held-out prompt's tokens.
    assert result.holdout_coverage == 0.5
    assert dv.build_vocab(outputs, top=2, vocab_size=6).ids == [1, 2]


def test_an_id_outside_the_vocabulary_is_refused() -> None:
    with pytest.raises(Qwen3090Error, match="outside its vocabulary of 4"):
        dv.build_vocab([[1, 9]], top=10, vocab_size=4)


def test_prompt_file_lines_and_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "p.txt"
    path.write_text("first\n\n  second  \n")
    assert read_prompt_file(path) == ["first", "second"]
    path.write_text("\n \n")
    with pytest.raises(Qwen3090Error, match=r"--prompts .*holds no prompt"):
        read_prompt_file(path)
    assert len(BUILTIN_PROMPTS) == 40


def _prepared(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 10}))
    (model / dv.VOCAB_FILE).write_bytes(b"ids")
    inputs: dict[str, object] = {"model": record.model_fingerprint(model), "top": 3}
    record.record_step(model, record.StepRecord(
        step=dv.STEP, inputs=inputs,
        outputs={dv.VOCAB_FILE: sha256_file(model / dv.VOCAB_FILE)}, report={}))
    return model, inputs


def test_step_is_current_until_an_input_or_output_changes(tmp_path: Path) -> None:
    model, inputs = _prepared(tmp_path)
    assert record.is_current(model, dv.STEP, inputs)
    assert not record.is_current(model, dv.STEP, {**inputs, "top": 4})
    (model / "config.json").write_text(json.dumps({"vocab_size": 11}))
    assert record.model_fingerprint(model) != inputs["model"]
    (model / "config.json").write_text(json.dumps({"vocab_size": 10}))
    assert record.model_fingerprint(model) == inputs["model"]
    (model / dv.VOCAB_FILE).write_bytes(b"other")
    assert not record.is_current(model, dv.STEP, inputs)


def test_check_tells_prepared_from_raw_and_flags_altered_or_missing_outputs(
    tmp_path: Path,
) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    assert prepared_steps(raw) == [] and preparation_problems(raw) == []
    model, _ = _prepared(tmp_path)
    assert prepared_steps(model) == [dv.STEP] and preparation_problems(model) == []
    (model / dv.VOCAB_FILE).write_bytes(b"altered")
    (problem,) = preparation_problems(model)
    assert "no longer matches its recorded sha256" in problem
    assert problem.endswith(f"fix: rerun `qwen3090 prepare draft-vocab {model} --force`")
    (model / dv.VOCAB_FILE).unlink()
    (problem,) = preparation_problems(model)
    assert "is missing" in problem
    (model / record.MANIFEST_NAME).write_text("{")
    (problem,) = preparation_problems(model)
    assert "cannot be read" in problem
