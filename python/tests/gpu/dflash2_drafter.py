#!/usr/bin/env python3
"""Write a tiny random DFlash2 drafter for a ``qwen3090 demo-model --arch qwen3_5`` model.

    python3 python/tests/gpu/dflash2_drafter.py MODEL_DIR [DRAFTER_DIR]

DRAFTER_DIR defaults to ``MODEL_DIR/../dflash2-drafter`` (beside the model). What vLLM 0.28.0
reads from it, and why each field is here:

- ``architectures: ["DFlash2DraftModel"]``: the name ``_is_dflash2_draft`` (config/vllm.py) and
  ``init_speculator`` select the DFlash2 speculator on, which forces the V2 model runner; the
  registry maps it to ``qwen3_dflash2.DFlash2Qwen3ForCausalLM``. ``model_type: qwen3``: the
  EAGLE config wrapper rebuilds the draft's config through transformers' Qwen3 class.
- ``dflash_config``: ``mask_token_id`` (the id fed to the N parallel query slots; here the
  last embedding row, a padding row the tokenizer never emits), ``target_layer_ids`` (the
  target layers whose hidden states the drafter reads, 0-based; vLLM adds one), the grouped
  convolution (``conv_kernel_size`` taps, ``conv_group_size`` channels a group) and the
  candidate selector (``selector_rank``, ``selector_top_k``).
- The shapes follow the demo target (hidden 128, head_dim 64, one KV head), so the drafter's
  attention runs on the same backend as the target's.
- No ``embed_tokens`` or ``lm_head``: the loader then shares the target's (as released DFlash
  drafters do), and every other parameter is written, so nothing stays uninitialised.

The weights are random (seeded): acceptance is near zero, but every drafter kernel runs. The
block length is not in the checkpoint: vLLM sizes the query block from the server's
``num_speculative_tokens``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DRAFT_LAYERS = 1
TARGET_LAYER_IDS = (0, 2)
CONV_TAPS = 3
CONV_GROUP = 32
SELECTOR_RANK = 16
SELECTOR_TOP_K = 4
DRAFT_DIR_NAME = "dflash2-drafter"


def drafter_config(target: dict[str, Any]) -> dict[str, Any]:
    """The drafter's config.json for the demo target's config.json."""
    hidden = int(target["hidden_size"])
    if hidden % CONV_GROUP:
        raise SystemExit(f"hidden_size {hidden} of the target is not a multiple of "
                         f"conv_group_size {CONV_GROUP}: change CONV_GROUP in {__file__}")
    if max(TARGET_LAYER_IDS) >= int(target["num_hidden_layers"]):
        raise SystemExit(f"target_layer_ids {TARGET_LAYER_IDS} reach past the target's "
                         f"{target['num_hidden_layers']} layers")
    vocab = int(target["vocab_size"])
    return {
        "architectures": ["DFlash2DraftModel"],
        "model_type": "qwen3",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(target["intermediate_size"]),
        "num_hidden_layers": DRAFT_LAYERS,
        "num_attention_heads": int(target["num_attention_heads"]),
        "num_key_value_heads": int(target["num_key_value_heads"]),
        "head_dim": int(target["head_dim"]),
        "hidden_act": "silu",
        "max_position_embeddings": int(target["max_position_embeddings"]),
        "rms_norm_eps": float(target["rms_norm_eps"]),
        "rope_theta": 1000000.0,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "target_hidden_size": hidden,
        "dflash_config": {
            "mask_token_id": vocab - 1,
            "target_layer_ids": list(TARGET_LAYER_IDS),
            "conv_kernel_size": CONV_TAPS,
            "conv_group_size": CONV_GROUP,
            "selector_rank": SELECTOR_RANK,
            "selector_top_k": SELECTOR_TOP_K,
        },
    }


def drafter_weights(config: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """Random tensors under the names DFlash2Qwen3ForCausalLM.load_weights maps (bf16)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads, head_dim = (config["num_attention_heads"], config["num_key_value_heads"],
                                 config["head_dim"])
    groups = hidden // CONV_GROUP

    def rand(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen) * 0.02

    out: dict[str, Any] = {
        "fc.weight": rand(hidden, hidden * len(TARGET_LAYER_IDS)),
        "hidden_norm.weight": torch.ones(hidden),
        "norm.weight": torch.ones(hidden),
        "candidate_selector.predecessor_codebook": rand(config["vocab_size"], SELECTOR_RANK),
        "candidate_selector.successor_codebook": rand(config["vocab_size"], SELECTOR_RANK),
        "candidate_selector.hidden_projection.weight": rand(SELECTOR_RANK, hidden),
    }
    for n in range(DRAFT_LAYERS):
        p = f"layers.{n}."
        out.update({
            p + "self_attn.q_proj.weight": rand(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": rand(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": rand(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
            p + "self_attn.q_norm.weight": torch.ones(head_dim),
            p + "self_attn.k_norm.weight": torch.ones(head_dim),
            p + "mlp.gate_proj.weight": rand(inter, hidden),
            p + "mlp.up_proj.weight": rand(inter, hidden),
            p + "mlp.down_proj.weight": rand(hidden, inter),
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
        })
        for conv in ("attention_conv", "mlp_conv"):
            # Tap 0 near one: the convolution starts close to the identity, so activations
            # stay in range through the random layer.
            base = rand(2, CONV_TAPS, hidden)
            base[:, 0] += 1.0
            out[p + f"{conv}.base_kernel"] = base
            out[p + f"{conv}.kernel_projection.weight"] = rand(2 * CONV_TAPS * groups, hidden)
    return {k: v.to(torch.bfloat16).contiguous() for k, v in out.items()}


def write_drafter(model: Path, out: Path | None = None, seed: int = 0) -> Path:
    """Write the drafter for the demo model at ``model``; returns its directory."""
    from safetensors.torch import save_file

    target = json.loads((model / "config.json").read_text())
    out = out or model.resolve().parent / DRAFT_DIR_NAME
    out.mkdir(parents=True, exist_ok=True)
    config = drafter_config(target)
    save_file(drafter_weights(config, seed), str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    where = write_drafter(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) == 3 else None)
    print(where)
