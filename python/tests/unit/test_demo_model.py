"""``qwen3090 demo-model``: a tiny model with a trained tokenizer and the parsers' tokens."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from qwen3090.demo_model import ARCHS, MARKUP_TOKENS, SPECIAL_TOKENS, write_demo_model

pytestmark = pytest.mark.unit


def test_tokenizer_is_trained_and_knows_the_markup(demo_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(demo_model_dir))
    vocab = tok.get_vocab()
    for marker in (*SPECIAL_TOKENS, *MARKUP_TOKENS):
        ids = tok.encode(marker, add_special_tokens=False)
        assert len(ids) == 1, (marker, ids)  # parsers look these up as single tokens
        assert vocab[marker] == ids[0]
    # Trained merges: common words are single tokens, and text round-trips.
    text = "The river passes the garden bridge in the morning."
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) < len(text) / 2
    assert tok.decode(ids) == text
    assert len(vocab) > 1000


def test_chat_template_renders_think(demo_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(demo_model_dir))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    thinking = str(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    plain = str(tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    ))
    assert thinking.endswith("<|im_start|>assistant\n")
    assert plain.endswith("<think>\n\n</think>\n\n")
    assert "<|im_start|>system\nBe brief.<|im_end|>" in thinking
    tools: list[dict[Any, Any] | Callable[..., Any]] = [
        {"type": "function", "function": {"name": "add", "parameters": {}}}
    ]
    with_tools = str(tok.apply_chat_template(messages, tools=tools, tokenize=False))
    assert "<tools>" in with_tools and "<tool_call>" in with_tools


def test_default_demo_is_the_hybrid_model(demo_model_dir: Path) -> None:
    config = json.loads((demo_model_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3NextForCausalLM"]
    assert "linear_attention" in config["layer_types"]
    assert "full_attention" in config["layer_types"]
    assert config["head_dim"] == 64  # 16 is rejected by vLLM's CPU attention
    assert config["linear_key_head_dim"] == config["linear_value_head_dim"] == 128
    assert config["tie_word_embeddings"] is False
    tok = json.loads((demo_model_dir / "tokenizer.json").read_text())
    assert config["vocab_size"] >= len(tok["model"]["vocab"]) + len(tok["added_tokens"]) - 16


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "qwen3_next"])
def test_other_archs_generate(arch: str, tmp_path: Path) -> None:
    from safetensors import safe_open

    model = write_demo_model(tmp_path / arch, arch)
    config = json.loads((model.path / "config.json").read_text())
    assert config["architectures"] == [model.architecture]
    with safe_open(str(model.path / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        embed = f.get_tensor("model.embed_tokens.weight")
    assert embed.shape == (config["vocab_size"], config["hidden_size"])
    assert "lm_head.weight" in names  # untied
    assert model.hybrid == (arch != "qwen3")


def test_same_seed_same_model(tmp_path: Path) -> None:
    a = write_demo_model(tmp_path / "a", "qwen3", seed=3)
    b = write_demo_model(tmp_path / "b", "qwen3", seed=3)
    for name in ("tokenizer.json", "config.json", "model.safetensors"):
        assert (a.path / name).read_bytes() == (b.path / name).read_bytes()
