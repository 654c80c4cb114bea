"""A W4A16 AutoRound-format demo checkpoint, shaped like the real base: the decoder layers'
linear weights GPTQ-packed (int4, group 128, symmetric, ``auto_round:auto_gptq``), while the
layers AutoRound leaves alone stay bf16 and are listed as 16-bit in ``extra_config``: the
Gated DeltaNet ``in_proj_a``/``in_proj_b`` (2 outputs, too narrow to pack), the lm_head, the
embeddings and the whole MTP head.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from qwen3090.demo_model import write_demo_model
from qwen3090.prepare.gptq_pack import PackFormat, packable, quantize_linear

FORMAT = PackFormat(bits=4, group_size=128, scale_dtype="float16", with_g_idx=False)
_DECODER_LINEAR = re.compile(r"(model\.layers\.\d+\..*)\.weight")


def quantize_base(model: Path) -> list[str]:
    """Rewrite ``model`` (a bf16 demo dir) as a W4A16 AutoRound checkpoint in place; returns
    the module names that were packed."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(model / "model.safetensors"))
    out: dict[str, torch.Tensor] = {}
    packed: list[str] = []
    kept: list[str] = []
    for name, tensor in weights.items():
        found = _DECODER_LINEAR.fullmatch(name)
        if found and tensor.dim() == 2 and not name.endswith("norm.weight"):
            module = found.group(1)
            if packable(tuple(tensor.shape), FORMAT) is None:
                for suffix, value in quantize_linear(tensor, FORMAT)[0].items():
                    out[f"{module}.{suffix}"] = value
                packed.append(module)
                continue
            kept.append(module)
        out[name] = tensor
    save_file(out, str(model / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "auto-round",
        "packing_format": "auto_round:auto_gptq",
        "bits": FORMAT.bits,
        "group_size": FORMAT.group_size,
        "sym": True,
        "data_type": "int",
        "block_name_to_quantize": "model.layers",
        "extra_config": {m: {"bits": 16, "data_type": "float"} for m in sorted(kept)},
    }
    (model / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return packed


def write_quantized_demo(path: Path, with_mtp: bool = True) -> Path:
    """The qwen3_5 demo model, given an MTP head, then quantized as :func:`quantize_base`."""
    from tests.patch.test_mtp_draft_vocab_patch import add_mtp_head

    model = write_demo_model(path, "qwen3_5").path
    if with_mtp:
        add_mtp_head(model)
    quantize_base(model)
    return model
