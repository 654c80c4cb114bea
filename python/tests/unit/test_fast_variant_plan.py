"""What ``prepare fast-variant`` selects, refuses and writes into the config, without vLLM;
and the 27B's byte figures from its shapes (issue 23, gotcha 41)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qwen3090.errors import Qwen3090Error
from qwen3090.prepare import fast_variant as fv
from qwen3090.prepare.gptq_pack import PackFormat, packable, packed_bytes

pytestmark = pytest.mark.unit

QC: dict[str, Any] = {"quant_method": "auto-round", "packing_format": "auto_round:auto_gptq",
                      "bits": 4, "group_size": 128, "sym": True, "data_type": "int",
                      "extra_config": {"mtp.fc": {"bits": 16, "data_type": "float"}}}


def _base(tmp_path: Path, config: dict[str, Any] | None = None, packed_head: bool = False) -> Path:
    import torch
    from safetensors.torch import save_file

    base = tmp_path / "base"
    base.mkdir()
    tensors = {
        "model.layers.0.mlp.down_proj.qweight": torch.zeros(32, 128, dtype=torch.int32),
        "model.layers.0.mlp.down_proj.scales": torch.zeros(2, 128, dtype=torch.float16),
        "model.embed_tokens.weight": torch.zeros(64, 128, dtype=torch.bfloat16),
        "mtp.fc.weight": torch.zeros(128, 256, dtype=torch.bfloat16),
        "mtp.layers.0.self_attn.q_proj.weight": torch.zeros(256, 128, dtype=torch.bfloat16),
        "mtp.layers.0.input_layernorm.weight": torch.zeros(128, dtype=torch.bfloat16),
        "mtp.norm.weight": torch.zeros(128, dtype=torch.bfloat16),
    }
    if packed_head:
        tensors["lm_head.qweight"] = torch.zeros(16, 64, dtype=torch.int32)
    else:
        tensors["lm_head.weight"] = torch.zeros(64, 128, dtype=torch.bfloat16)
    save_file(tensors, str(base / "model.safetensors"))
    cfg = config if config is not None else {"quantization_config": QC}
    (base / "config.json").write_text(json.dumps(cfg))
    return base


def test_plan_takes_lm_head_and_mtp_linears_in_the_base_format(tmp_path: Path) -> None:
    base = _base(tmp_path)
    p = fv.plan(base, fv.default_out(base))
    assert p.out == tmp_path / "base-fast"
    assert p.fmt == PackFormat(bits=4, group_size=128, scale_dtype="float16", with_g_idx=False)
    assert [(t.name, t.group) for t in p.targets] == [
        ("lm_head.weight", "lm_head"), ("mtp.fc.weight", "mtp"),
        ("mtp.layers.0.self_attn.q_proj.weight", "mtp")]
    assert [t.name for t in fv.plan(base, tmp_path / "o", mtp=False).targets] == [
        "lm_head.weight"]
    extra = fv._new_config(p)["quantization_config"]["extra_config"]
    # The base listed mtp.fc as 16-bit; the variant marks it packed, and lm_head by suffix.
    want = {"bits": 4, "group_size": 128, "sym": True, "data_type": "int"}
    assert extra == {"lm_head": want, "mtp.fc": want, "mtp.layers.0.self_attn.q_proj": want}
    assert p.config["quantization_config"]["extra_config"]["mtp.fc"]["bits"] == 16


@pytest.mark.parametrize(("change", "message"), [
    ({"quantization_config": None}, "has no quantization_config"),
    ({"quantization_config": {**QC, "quant_method": "awq"}}, "quant_method is 'awq'"),
    ({"quantization_config": {**QC, "packing_format": "auto_round:auto_awq"}},
     "only GPTQ-packed symmetric int"),
    ({"quantization_config": {**QC, "sym": False}}, "only GPTQ-packed symmetric int"),
    ({"quantization_config": {**QC, "bits": 3}}, "bits=3"),
    ({"quantization_config": QC, "tie_word_embeddings": True}, "tie_word_embeddings is true"),
])
def test_refuses_a_base_it_cannot_vary(tmp_path: Path, change: dict[str, Any],
                                       message: str) -> None:
    base = _base(tmp_path, {k: v for k, v in change.items() if v is not None})
    with pytest.raises(Qwen3090Error, match=message) as err:
        fv.plan(base, tmp_path / "out")
    assert str(base) in str(err.value)


def test_refuses_a_variant_as_base_and_writing_over_the_base(tmp_path: Path) -> None:
    with pytest.raises(Qwen3090Error, match="already packed"):
        fv.plan(_base(tmp_path, packed_head=True), tmp_path / "out")
    other = tmp_path / "other"
    other.mkdir()
    base = _base(other)
    with pytest.raises(Qwen3090Error, match="is the base itself"):
        fv.plan(base, base)


def test_packable_shapes() -> None:
    fmt = PackFormat(bits=4, group_size=128, scale_dtype="float16", with_g_idx=False)
    assert packable((256, 128), fmt) is None
    assert "not a multiple of group_size" in str(packable((256, 100), fmt))
    assert "outputs" in str(packable((2, 128), fmt))  # the GDN in_proj_a/b AutoRound skips
    assert "1-D" in str(packable((128,), fmt))


def test_27b_figures() -> None:
    """Qwen3.8-27B (Qwen3.5 27B layout): hidden 5120, vocab 248320, one MTP layer with gated
    attention (24 heads x 256, q_proj doubled for the gate; 4 KV heads) and a 17408 MLP."""
    fmt = PackFormat(bits=4, group_size=128, scale_dtype="float16", with_g_idx=False)
    hidden, vocab = 5120, 248320
    mtp = [(2 * 24 * 256, hidden), (4 * 256, hidden), (4 * 256, hidden), (hidden, 24 * 256),
           (17408, hidden), (17408, hidden), (hidden, 17408), (hidden, 2 * hidden)]
    got = fv.shape_savings(vocab, hidden, mtp, fmt)
    # Gotcha 41's figure for the bf16 embed_tokens, which has the lm_head's shape.
    assert got["lm_head_bytes_before"] == 2_542_796_800
    # qweight 4 bits a weight, one fp16 scale and half a byte of zeros per 128 weights.
    assert got["lm_head_bytes_after"] == vocab * hidden // 2 + vocab * 40 * 2 + vocab * 40 // 2
    assert got["mtp_bytes_before"] == 849_346_560
    assert packed_bytes(256, 128, fmt) == 16 * 256 * 4 + 256 * 2 + 32 * 4
