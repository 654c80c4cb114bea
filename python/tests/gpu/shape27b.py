#!/usr/bin/env python3
"""Give a ``qwen3090 demo-model --arch qwen3_5`` model the 27B's layer shapes, for GPU lives.

    python3 python/tests/gpu/shape27b.py MODEL_DIR [--layers 8]

Why: the demo model's attention has head_dim 64 and one KV head; the kernels the KVarN lives
exercise (and the hybrid page alignment, and the staging vLLM's profiler charges) take their
shape from the model, so a life on the demo shape says nothing about head_dim 256, a group of
6 query heads per KV head, or the 2,048-token attention block the Gated-DeltaNet page forces.
What: the config gets Qwen3.8-27B's widths (hidden 5120, 24 query / 4 KV heads of 256, MLP
17408, Gated DeltaNet 16 key / 48 value heads of 128) over ``--layers`` layers in the real
rhythm (three Gated-DeltaNet layers, then one full-attention layer); the tokenizer, and so the
vocabulary, stay the demo's. Weights are random (the demo model's generator, on the GPU
when there is one), saved as bf16. Run it before mtp_head.py and cycle_head.py, which read the
shapes from the config.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

# Qwen3.8-27B's widths (its config.json; the same figures test_patch_kvarn_cache_spec.py uses).
SHAPE_27B: dict[str, Any] = {
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
}


def shaped_config(config: dict[str, Any], layers: int) -> dict[str, Any]:
    """``config`` with the 27B's widths over ``layers`` layers (a multiple of the interval)."""
    interval = SHAPE_27B["full_attention_interval"]
    if layers < interval or layers % interval:
        raise SystemExit(f"--layers {layers}: use a multiple of {interval}, so that every "
                         "group of Gated-DeltaNet layers ends in a full-attention layer")
    out = {**config, **SHAPE_27B, "num_hidden_layers": layers}
    out["layer_types"] = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                          for i in range(layers)]
    return out


def write_weights(model: Path, config: dict[str, Any]) -> int:
    """Random bf16 weights for ``config`` into ``model`` (the demo model's own generator, on
    the GPU when there is one); returns their bytes."""
    import torch
    from safetensors.torch import save_file

    from qwen3090.demo_model import random_weights

    device = "cuda" if torch.cuda.is_available() else "cpu"
    weights = random_weights(config, seed=0, device=device)
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})
    return sum(t.numel() * t.element_size() for t in weights.values())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path)
    p.add_argument("--layers", type=int, default=8)
    args = p.parse_args()
    path = args.model / "config.json"
    config = shaped_config(json.loads(path.read_text(encoding="utf-8")), args.layers)
    if config.get("model_type") != "qwen3_5_text":
        raise SystemExit(f"{args.model}: not a qwen3_5 demo model (qwen3090 demo-model --arch "
                         "qwen3_5)")
    size = write_weights(args.model, config)
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    print(f"27B shape: {args.layers} layers, {size / 2**30:.2f} GiB of bf16 weights")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
