"""GPTQ-packed weights (the ``auto_round:auto_gptq`` layout vLLM's INC loader reads), made with
vLLM's own reference quantizer, so a requantized layer is what vLLM's kernels expect.

Layout, per linear layer of ``in`` inputs and ``out`` outputs, symmetric, ``bits`` wide, one
scale per ``group_size`` inputs: ``qweight`` int32 ``[in * bits / 32, out]`` (values packed
along the input dim, biased by ``2**(bits-1)``), ``scales`` ``[in / group_size, out]``,
``qzeros`` int32 ``[in / group_size, out * bits / 32]`` holding ``2**(bits-1) - 1`` (GPTQ's
"zero minus one" convention; vLLM ignores it for symmetric weights), and ``g_idx`` when the
base checkpoint's quantized layers carry one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Output rows quantized at a time: a 248320 x 5120 lm_head in one piece needs ~15 GB of fp32
# temporaries; 8192 rows need ~0.5 GB.
ROWS_PER_CHUNK = 8192


@dataclass(frozen=True)
class PackFormat:
    """How the base checkpoint stores a quantized linear layer (read from its own files)."""

    bits: int
    group_size: int
    scale_dtype: str
    """torch dtype name of ``scales``, e.g. "float16"."""
    with_g_idx: bool

    @property
    def pack_factor(self) -> int:
        return 32 // self.bits


def packed_bytes(out_features: int, in_features: int, fmt: PackFormat) -> int:
    """Bytes of the packed tensors of one ``[out, in]`` layer in ``fmt``."""
    groups = in_features // fmt.group_size
    scale_bytes = 4 if fmt.scale_dtype == "float32" else 2
    total = (in_features // fmt.pack_factor) * out_features * 4
    total += groups * out_features * scale_bytes
    total += groups * (out_features // fmt.pack_factor) * 4
    return total + (in_features * 4 if fmt.with_g_idx else 0)


def packable(shape: tuple[int, ...], fmt: PackFormat) -> str | None:
    """Why an ``[out, in]`` weight cannot be packed in ``fmt``; None when it can."""
    if len(shape) != 2:
        return f"is {len(shape)}-D, not a linear weight"
    out_features, in_features = shape
    if in_features % fmt.group_size:
        return f"has {in_features} inputs, not a multiple of group_size {fmt.group_size}"
    if out_features % fmt.pack_factor:
        return f"has {out_features} outputs, not a multiple of {fmt.pack_factor}"
    return None


def quantize_linear(
    weight: torch.Tensor, fmt: PackFormat, progress: Callable[[int, int], None] | None = None,
) -> tuple[dict[str, torch.Tensor], float]:
    """``weight`` (``[out, in]``, any float dtype) as GPTQ tensors keyed by suffix
    (``qweight``, ``qzeros``, ``scales``, and ``g_idx`` when ``fmt`` has it), and the relative
    error of the dequantized weight (``||W_q - W|| / ||W||``, Frobenius).

    Works on ``ROWS_PER_CHUNK`` output rows at a time (each output column is quantized on its
    own, so chunking changes nothing); ``progress(done_rows, total_rows)`` after each chunk.
    """
    import torch
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        gptq_pack,
        pack_quantized_values_into_int32,
        quantize_weights,
    )
    from vllm.scalar_type import scalar_types

    why = packable(tuple(weight.shape), fmt)
    if why is not None:
        raise ValueError(f"weight of shape {tuple(weight.shape)} {why}")
    quant_type = {4: scalar_types.uint4b8, 8: scalar_types.uint8b128}[fmt.bits]
    out_features, in_features = weight.shape
    scale_dtype = getattr(torch, fmt.scale_dtype)
    qweights: list[torch.Tensor] = []
    scales: list[torch.Tensor] = []
    err_sq = norm_sq = 0.0
    for start in range(0, out_features, ROWS_PER_CHUNK):
        rows = weight[start:start + ROWS_PER_CHUNK]
        # vLLM's reference wants [in, out]: groups run along the input dim.
        w = rows.to(torch.float32).t().contiguous()
        _, w_q, w_s, _ = quantize_weights(w, quant_type, fmt.group_size)
        w_s = w_s.to(scale_dtype)
        # The error against the scales as stored (rounded to their checkpoint dtype).
        w_ref = (w_q - quant_type.bias).to(torch.float32) * w_s.to(torch.float32) \
            .repeat_interleave(fmt.group_size, dim=0)
        err_sq += float(torch.sum((w_ref - w) ** 2))
        norm_sq += float(torch.sum(w * w))
        qweights.append(gptq_pack(w_q, fmt.bits, in_features, rows.shape[0]))
        scales.append(w_s)
        if progress is not None:
            progress(min(start + ROWS_PER_CHUNK, out_features), out_features)
    groups = in_features // fmt.group_size
    zero_minus_one = torch.full((groups, out_features), quant_type.bias - 1, dtype=torch.int32)
    packed = {
        "qweight": torch.cat(qweights, dim=1).contiguous(),
        "qzeros": pack_quantized_values_into_int32(zero_minus_one, quant_type, packed_dim=1)
        .contiguous(),
        "scales": torch.cat(scales, dim=1).contiguous(),
    }
    if fmt.with_g_idx:
        packed["g_idx"] = torch.arange(in_features, dtype=torch.int32) // fmt.group_size
    return packed, (err_sq / norm_sq) ** 0.5 if norm_sq else 0.0


def dequantize(packed: dict[str, torch.Tensor], fmt: PackFormat) -> torch.Tensor:
    """The ``[out, in]`` float32 weight the packed tensors stand for (for checks and reports)."""
    import torch
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        unpack_quantized_values_into_int32,
    )
    from vllm.scalar_type import scalar_types

    quant_type = {4: scalar_types.uint4b8, 8: scalar_types.uint8b128}[fmt.bits]
    q = unpack_quantized_values_into_int32(packed["qweight"], quant_type, packed_dim=0)
    scales = packed["scales"].to(torch.float32).repeat_interleave(fmt.group_size, dim=0)
    weight: torch.Tensor = ((q - quant_type.bias).to(torch.float32) * scales).t().contiguous()
    return weight
