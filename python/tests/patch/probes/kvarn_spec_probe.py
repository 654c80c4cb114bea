"""Probe for kvarn-cache-spec: what vLLM's own objects make of ``--kv-cache-dtype
kvarn_k4v2_g128``.

Sections (each reports the exception text where the tree refuses):
- ``cache_config``: CacheConfig with the dtype, at the default block, a user block of 1024 and
  of 100; the ``--kv-cache-dtype`` CLI choice.
- ``spec``: the dtype's torch dtype and quant mode, and the full-attention page at the model's
  shape (4 kv heads, head size 256) for blocks of 128 x n, against kvarn.page_bytes.
- ``selector``: vLLM's attention backend selection for the dtype.
- ``hybrid``: with ``argv[1]`` a config-only Qwen3.5 model dir, the platform's hybrid block
  alignment (the CPU backend's kernel blocks) and then unify_kv_cache_spec_page_size over one
  full-attention and one Gated-DeltaNet layer, per mamba cache mode.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from typing import Any

from _result import report

DTYPE = "kvarn_k4v2_g128"
KV_HEADS = 4
HEAD_SIZE = 256
TILES = (1, 2, 8, 16)
# name -> (mamba cache mode, --block-size, recurrent-state dtype, block the backend preferred).
# The deployment's prefix-cache mode ("align") at the default and at a user block; the state
# in bfloat16 (the model's dtype, 1.6 MB a layer) and float32 (3.2 MB, a block of 30 tiles);
# a backend preferring 16-token blocks before the alignment (update_block_size_for_backend's
# phase 1 on CUDA) must not make the block 16-aligned; and the "all" mode's chunk alignment.
HYBRID_CASES: dict[str, tuple[str, int | None, str, int | None]] = {
    "align": ("align", None, "bfloat16", None),
    "align_fp32_state": ("align", None, "float32", None),
    "align_block_1024": ("align", 1024, "bfloat16", None),
    "align_backend_block_16": ("align", None, "bfloat16", 16),
    "all": ("all", None, "bfloat16", None),
}


def attempt(fn: Callable[[], Any]) -> dict[str, Any]:
    try:
        return {"ok": fn()}
    except BaseException as e:  # argparse exits; pydantic wraps a ValueError
        return {"error": f"{type(e).__name__}: {e}"}


def cache_config_section() -> dict[str, Any]:
    from vllm.config import CacheConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    def block(**kw: Any) -> Callable[[], int]:
        # Keyword dicts: the installed vllm that mypy reads does not know the dtype.
        config: dict[str, Any] = {"cache_dtype": DTYPE, **kw}
        return lambda: int(CacheConfig(**config).block_size)

    def cli() -> str:
        new_parser: Any = FlexibleArgumentParser
        parser = EngineArgs.add_cli_args(new_parser())
        return str(parser.parse_args(["--kv-cache-dtype", DTYPE]).kv_cache_dtype)

    return {"default": attempt(block()), "block_1024": attempt(block(block_size=1024)),
            "block_100": attempt(block(block_size=100)), "cli": attempt(cli)}


def spec_section() -> dict[str, Any]:
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode

    torch_dtype = STR_DTYPE_TO_TORCH_DTYPE.get(DTYPE)
    mode = get_kv_quant_mode(DTYPE)

    def full(block_size: int) -> Any:
        assert torch_dtype is not None, f"{DTYPE} has no torch dtype in this tree"
        return FullAttentionSpec(block_size=block_size, num_kv_heads=KV_HEADS,
                                 head_size=HEAD_SIZE, dtype=torch_dtype, kv_quant_mode=mode)

    def kvarn_pages() -> dict[str, int]:
        from vllm.v1.attention.ops import kvarn

        return {str(128 * n): kvarn.page_bytes(128 * n, KV_HEADS, HEAD_SIZE) for n in TILES}

    def pages() -> dict[str, list[int]]:
        return {str(128 * n): [full(128 * n).page_size_bytes, full(128 * n).real_page_size_bytes]
                for n in TILES}

    def unify_scaled() -> list[int]:
        # A page another layer (a drafter, a padded mamba state) makes 16 tiles large: the
        # kvarn layer's one-tile block is scaled by the whole ratio, not padded.
        from vllm.v1.core.kv_cache_utils import unify_kv_cache_spec_page_size

        specs = {"attn": full(128), "other": full(2048)}
        unified = unify_kv_cache_spec_page_size(specs)["attn"]
        return [unified.block_size, unified.page_size_bytes]

    return {"torch_dtype": str(torch_dtype), "quant_mode": mode.name,
            "unify_scaled": attempt(unify_scaled),
            "pages": attempt(pages), "kvarn_pages": attempt(kvarn_pages),
            "block_100": attempt(lambda: full(100).page_size_bytes)}


def selector_section() -> dict[str, Any]:
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend

    def choose(kv_cache_dtype: str) -> Callable[[], str]:
        def run() -> str:
            with set_current_vllm_config(VllmConfig()):
                return str(get_attn_backend(HEAD_SIZE, torch.bfloat16, kv_cache_dtype).get_name())
        return run

    return {"kvarn": attempt(choose(DTYPE)), "auto": attempt(choose("auto"))}


def hybrid_case(model_dir: str, mamba_cache_mode: str, block_size: int | None, ssm_dtype: str,
                backend_block: int | None) -> dict[str, Any]:
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig
    from vllm.model_executor.models import ModelRegistry
    from vllm.platforms.interface import Platform
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    from vllm.v1.core.kv_cache_utils import unify_kv_cache_spec_page_size
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, get_kv_quant_mode

    model_config = ModelConfig(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True,
                               dtype="bfloat16")
    cache_kw: dict[str, Any] = {"cache_dtype": DTYPE, "block_size": block_size,
                                "mamba_cache_mode": mamba_cache_mode,
                                "enable_prefix_caching": mamba_cache_mode != "none"}
    cache_config = CacheConfig(**cache_kw)
    vllm_config = VllmConfig(model_config=model_config, cache_config=cache_config,
                             device_config=DeviceConfig("cpu"))
    cache_config = vllm_config.cache_config
    cache_config.mamba_ssm_cache_dtype = ssm_dtype  # type: ignore[assignment]
    if backend_block is not None:
        cache_config.block_size = backend_block
    before = cache_config.block_size
    Platform._align_hybrid_block_size(vllm_config, CPUAttentionBackend)

    resolved, _ = ModelRegistry.resolve_model_cls(model_config.architecture,
                                                  model_config=model_config)
    model_cls: Any = resolved  # a hybrid model class (IsHybrid's classmethods)
    shapes = model_cls.get_mamba_state_shape_from_config(vllm_config)
    dtypes = model_cls.get_mamba_state_dtype_from_config(vllm_config)
    mamba_page = MambaSpec(shapes=shapes, dtypes=dtypes, block_size=-1).page_size_bytes
    block = cache_config.block_size
    specs = {
        "model.layers.3.self_attn.attn": FullAttentionSpec(
            block_size=block, num_kv_heads=model_config.get_num_kv_heads(
                vllm_config.parallel_config),
            head_size=model_config.get_head_size(),
            dtype=STR_DTYPE_TO_TORCH_DTYPE[DTYPE], kv_quant_mode=get_kv_quant_mode(DTYPE)),
        "model.layers.0.linear_attn": MambaSpec(
            shapes=shapes, dtypes=dtypes, block_size=cache_config.mamba_block_size or block,
            page_size_padded=cache_config.mamba_page_size_padded,
            mamba_cache_mode=cache_config.mamba_cache_mode),
    }
    attn, mamba = (unify_kv_cache_spec_page_size(specs)[k] for k in specs)
    return {
        "block_before": before, "block": block, "mamba_block": cache_config.mamba_block_size,
        "mamba_page": mamba_page, "mamba_page_padded": cache_config.mamba_page_size_padded,
        "ssm_dtypes": [str(d) for d in dtypes], "shapes": [list(s) for s in shapes],
        "unified": {"attn_block": attn.block_size, "attn_page": attn.page_size_bytes,
                    "mamba_page": mamba.page_size_bytes},
    }


def main() -> None:
    out: dict[str, Any] = {
        "cache_config": cache_config_section(),
        "spec": spec_section(),
        "selector": selector_section(),
    }
    if len(sys.argv) > 1:
        out["hybrid"] = {name: attempt(partial(hybrid_case, sys.argv[1], *case))
                         for name, case in HYBRID_CASES.items()}
    report(out)


if __name__ == "__main__":
    main()
