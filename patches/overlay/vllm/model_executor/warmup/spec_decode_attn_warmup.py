# SPDX-License-Identifier: Apache-2.0
# qwen3090 patch spec-decode-attn-warmup: compile the split-KV verify kernels
# of spec-decode-attn during kernel_warmup, for every verify batch shape.
#
# Why (gotcha 45): Triton compiles a kernel once per specialisation, and the
# split and reduce passes specialise on the launch plan (tiles, segments),
# which the planner derives from the batch's query length (2..k+1) and its
# number of sequences (1..max_num_seqs), and on whether the block table's row
# stride divides by 16. vLLM's own warm-up reaches only the shapes its dummy
# batches happen to have (CUDA-graph capture sizes; none with enforce_eager:
# the profile run passes no attention metadata), so the first verify steps of
# the first requests paid the rest. Here every shape a
# verify step can take goes through the layer's own forward once, on dummy
# query, output and block-table tensors that specialise as the real ones do
# (same dtypes, 16-byte alignment and block-table row stride) and read only
# block 0 of the real KV cache. Shapes that give the same kernels cost a
# plan and a launch of a cached kernel; vLLM's JIT monitor, activated after
# warm-up, reports any compile still left to the first requests.

import time
from types import SimpleNamespace
from typing import Any

import torch

from vllm.logger import init_logger

logger = init_logger(__name__)

# Block-table row strides standing for Triton's integer specialisations (a
# multiple of 16, or not) when the runner's own tables cannot be found.
_FALLBACK_WIDTHS = (16, 17)


def _runner_block_tables(runner: Any) -> list[torch.Tensor]:
    """The runner's persistent block tables, one [max_num_reqs, width] tensor per
    KV cache group: the V2 runner's input tables or the V1 runner's buffers."""
    v2 = getattr(getattr(runner, "block_tables", None), "input_block_tables", None)
    if isinstance(v2, list) and all(isinstance(t, torch.Tensor) for t in v2):
        return list(v2)
    multi = getattr(getattr(runner, "input_batch", None), "block_table", None)
    tables = []
    for table in getattr(multi, "block_tables", None) or []:
        gpu = getattr(getattr(table, "block_table", None), "gpu", None)
        if isinstance(gpu, torch.Tensor):
            tables.append(gpu)
    return tables


def block_table_widths(runner: Any, layer_name: str) -> tuple[int, ...]:
    """Row strides of the block tables ``layer_name``'s batches are launched with.

    The split pass takes the row stride as an integer argument, which Triton
    specialises on divisibility by 16: a warm-up with another stride class
    would compile a kernel the requests never use."""
    tables = _runner_block_tables(runner)
    groups = getattr(getattr(runner, "kv_cache_config", None), "kv_cache_groups", None)
    widths = {
        tables[i].stride(0)
        for i, group in enumerate(groups or [])
        if i < len(tables) and layer_name in getattr(group, "layer_names", ())
    }
    if not widths:
        widths = {t.stride(0) for t in tables}
    return tuple(sorted(widths)) if widths else _FALLBACK_WIDTHS


def verify_shapes(qmax: int, max_num_seqs: int, num_spec_tokens: int | None
                  ) -> list[tuple[int, int]]:
    """(sequences, query length) of every batch the split-KV path accepts: a
    verify step's longest query is 2..k+1 tokens (fewer drafts near a length
    limit or from a variable-length drafter), never above QMAX."""
    longest = qmax if num_spec_tokens is None else min(qmax, num_spec_tokens + 1)
    return [
        (seqs, q) for q in range(2, longest + 1) for seqs in range(1, max_num_seqs + 1)
    ]


def _metadata(
    seqs: int, q: int, block_table: torch.Tensor, device: torch.device
) -> SimpleNamespace:
    """What TRITON_ATTN's and FLASH_ATTN's forward read of a decode-only batch
    before they dispatch to the split-KV path (int32 index tensors, as vLLM's)."""
    tokens = seqs * q
    return SimpleNamespace(
        num_actual_tokens=tokens,
        max_query_len=q,
        query_start_loc=torch.arange(0, tokens + 1, q, dtype=torch.int32, device=device),
        seq_lens=torch.full((seqs,), q, dtype=torch.int32, device=device),
        max_seq_len=q,
        block_table=block_table[:seqs],
        slot_mapping=torch.zeros(tokens, dtype=torch.int64, device=device),
        causal=True,
        use_cascade=False,
        common_prefix_len=0,
        cu_prefix_query_lens=None,
        prefix_kv_lens=None,
        suffix_kv_lens=None,
        scheduler_metadata=None,
        max_num_splits=0,
        seq_threshold_3D=0,
        num_par_softmax_segments=None,
        softmax_segm_output=None,
        softmax_segm_max=None,
        softmax_segm_expsum=None,
        mm_prefix_range_tensor=None,
        mm_prefix_query_range_tensor=None,
        rswa_prefix_lens=None,
    )


def _layout_key(impl: Any, kv_cache: torch.Tensor, width: int) -> tuple[Any, ...]:
    # Everything of a layer that enters the kernels' specialisations: layers
    # alike in all of it share their compiled kernels.
    sda = impl.spec_decode_attn
    return (
        type(impl).__name__,
        id(sda.workspace),
        sda.num_heads,
        sda.num_kv_heads,
        sda.head_size,
        sda.kv_pth,
        sda.kv_fp8_tensor,
        kv_cache.dtype,
        tuple(kv_cache.shape[1:]),
        kv_cache.stride(),
        kv_cache.data_ptr() % 16,
        width == 1,
        width % 16 == 0,
    )


def _warm_layer(
    layer: Any, kv_cache: torch.Tensor, width: int, shapes: list[tuple[int, int]],
    dtype: torch.dtype,
) -> int:
    impl = layer.impl
    sda = impl.spec_decode_attn
    device = kv_cache.device
    rows = max(seqs * q for seqs, q in shapes)
    q_dtype = dtype
    if getattr(layer, "query_quant", None) is not None and getattr(
        impl, "supports_quant_query_input", False
    ):
        # Attention.forward hands this backend fp8 queries (per-tensor fp8 caches), and
        # the split pass specialises on the query's dtype; the output stays 16-bit.
        from vllm.platforms import current_platform

        q_dtype = current_platform.fp8_dtype()
    shape = (rows, sda.num_heads, sda.head_size)
    query = torch.zeros(shape, dtype=q_dtype, device=device)
    output = torch.empty(shape, dtype=dtype, device=device)
    # Block 0 is the null block: every dummy sequence reads it and nothing else.
    block_table = torch.zeros(
        (sda.max_num_seqs, width), dtype=torch.int32, device=device
    )
    ran = 0
    for seqs, q in shapes:
        tokens = seqs * q
        sda.last_plan = None
        impl.forward(
            layer, query[:tokens], None, None, kv_cache,
            _metadata(seqs, q, block_table, device), output=output[:tokens],
        )
        if sda.last_plan is None:
            # The layer declined this batch (it takes the stock path): so will
            # every request of this shape; nothing of the split path to warm.
            logger.warning(
                "spec-decode attention warm-up: %s declined a %d x %d verify "
                "batch; not warming its split-KV kernels",
                type(impl).__name__, seqs, q,
            )
            break
        ran += 1
    return ran


@torch.inference_mode()
def spec_decode_attn_warmup(runner: Any, vllm_config: Any) -> int:
    """Run every verify batch shape through each distinct split-KV layer layout
    once, so Triton compiles at warm-up; returns the launches made."""
    import vllm.envs as envs

    if not envs.VLLM_SPEC_DECODE_ATTN:
        return 0
    context = getattr(vllm_config.compilation_config, "static_forward_context", None)
    spec = vllm_config.speculative_config
    num_spec = getattr(spec, "num_speculative_tokens", None) if spec else None
    dtype = vllm_config.model_config.dtype
    started = time.perf_counter()
    seen: set[tuple[Any, ...]] = set()
    devices: list[torch.Tensor] = []
    launches = 0
    for name, layer in (context or {}).items():
        impl = getattr(layer, "impl", None)
        sda = getattr(impl, "spec_decode_attn", None)
        kv_cache = getattr(layer, "kv_cache", None)
        if sda is None or not isinstance(kv_cache, torch.Tensor) or not kv_cache.numel():
            continue
        shapes = verify_shapes(sda.qmax, sda.max_num_seqs, num_spec)
        for width in block_table_widths(runner, name):
            key = _layout_key(impl, kv_cache, width)
            if key in seen:
                continue
            seen.add(key)
            devices.append(kv_cache)
            try:
                launches += _warm_layer(layer, kv_cache, width, shapes, dtype)
            except Exception as exc:
                # A warm-up never stops a boot: the first requests compile
                # instead, and the JIT monitor says which kernels.
                logger.warning(
                    "spec-decode attention warm-up failed on %s (%s); its "
                    "split-KV kernels compile on the first verify batches",
                    name, exc,
                )
    if seen:
        if any(t.device.type == "cuda" for t in devices):
            torch.cuda.synchronize()
        logger.info(
            "spec-decode attention: warmed the split-KV kernels with %d verify "
            "batches over %d layer layouts in %.1f s",
            launches, len(seen), time.perf_counter() - started,
        )
    return launches
