#!/usr/bin/env python3
"""Give a ``qwen3090 demo-model --arch qwen3_5`` model a random MTP head, so SPEC=mtp can run.

    python3 python/tests/gpu/mtp_head.py MODEL_DIR

The demo generator writes no ``mtp.*`` weights. vLLM 0.28.0 turns a ``qwen3_5_text`` target into
its ``Qwen3_5MTP`` drafter when ``config.json`` has ``mtp_num_hidden_layers``, and loads the
drafter from the target's own checkpoint: ``mtp.fc`` (2H -> H), three RMSNorms and
``mtp.layers.N.*``, one full-attention decoder layer each, shaped like the target's own
full-attention layers. This copies the last full-attention layer's tensors (shapes, not
meaning: the head is random, so acceptance is low, but every drafter kernel runs) and adds the
rest from a seeded generator. Idempotent.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MTP_LAYERS = 1


def add_mtp_head(model: Path, seed: int = 0) -> int:
    """Write the head into ``model``; returns the number of ``mtp.*`` tensors it holds."""
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((model / "config.json").read_text())
    full = [i for i, t in enumerate(config["layer_types"]) if t == "full_attention"]
    if not full:
        raise SystemExit(f"{model}/config.json has no full_attention layer to shape the head on")
    weights = {k: v for k, v in load_file(str(model / "model.safetensors")).items()
               if not k.startswith("mtp.")}
    hidden = int(config["hidden_size"])
    gen = torch.Generator().manual_seed(seed)
    src = f"model.layers.{full[-1]}."
    for n in range(MTP_LAYERS):
        for key, tensor in list(weights.items()):
            if key.startswith(src):
                weights[f"mtp.layers.{n}.{key[len(src):]}"] = tensor.clone()
    std = float(config.get("initializer_range", 0.02))
    fc = torch.randn(hidden, 2 * hidden, generator=gen) * std
    weights["mtp.fc.weight"] = fc.to(torch.bfloat16)
    for norm in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding"):
        weights[f"mtp.{norm}.weight"] = weights["model.norm.weight"].clone()
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})
    config["mtp_num_hidden_layers"] = MTP_LAYERS
    (model / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return sum(1 for k in weights if k.startswith("mtp."))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(f"mtp head: {add_mtp_head(Path(sys.argv[1]))} tensors")
