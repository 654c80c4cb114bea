"""Probe for hybrid-sw-block-promote: ``unify_kv_cache_spec_page_size`` on the deployment's
layer geometry, built from the specs vLLM itself would publish.

Target attention: 4 KV heads, per head and token 2 x 256 B of int8 K/V + 8 B of scales (520 B)
under int8_per_token_head, 264 B under int4_per_token_head. DFlash2 drafter: 8 KV heads at
264 B, sliding window 2048, born at the kernel block 16. The recurrent-state (mamba) page is
padded to the target's page by the platform, which is what fixes the primary block B.
Cases: (name, B, target bytes per head and token).
"""

from __future__ import annotations

import math
from typing import Any, cast

from _result import report

CASES = [
    ("int8_k7", 864, 520),
    ("int8_k15", 944, 520),
    ("int4_k7", 1696, 264),
    ("int4_k15", 1840, 264),
]
MAX_IN_FLIGHT_TOKENS = 4096
MAX_MODEL_LEN = 245760


def main() -> None:
    import torch
    from vllm.v1.core.kv_cache_utils import unify_kv_cache_spec_page_size
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

    out: dict[str, Any] = {}
    for name, primary_block, target_bytes in CASES:
        full = FullAttentionSpec(block_size=primary_block, num_kv_heads=4, head_size=256,
                                 dtype=torch.int8, state_content_bytes=target_bytes,
                                 indexes_kv_by_block_stride=True)
        mamba = MambaSpec(block_size=primary_block, shapes=((16, 1024),),
                          dtypes=(torch.float16,), page_size_padded=full.page_size_bytes,
                          mamba_cache_mode="align")
        draft = SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=128,
                                  dtype=torch.int8, state_content_bytes=264,
                                  sliding_window=2048, indexes_kv_by_block_stride=True)
        specs = {
            "model.layers.3.self_attn.attn": full,
            "model.layers.0.linear_attn": mamba,
            "model.layers.64.self_attn.attn": draft,
        }
        unified = unify_kv_cache_spec_page_size(specs)
        f, m, d = (cast(Any, unified[k]) for k in specs)
        out[name] = {
            "primary_page": full.page_size_bytes,
            "full": {"block": f.block_size, "page": f.page_size_bytes,
                     "padded": f.page_size_padded is not None},
            "mamba": {"block": m.block_size, "page": m.page_size_bytes},
            "draft": {"block": d.block_size, "page": d.page_size_bytes,
                      "padded": d.page_size_padded is not None,
                      "blocks_per_request": d.max_admission_blocks_per_request(
                          MAX_IN_FLIGHT_TOKENS, MAX_MODEL_LEN),
                      "used_fraction": d.unpadded_page_size_bytes / d.page_size_bytes},
            "lcm_block": math.lcm(f.block_size, m.block_size, d.block_size),
            "max_block": max(f.block_size, m.block_size, d.block_size),
        }
    report(out)


if __name__ == "__main__":
    main()
