"""Probe for offload-draft-groups: ``SchedulerOffloadConfig.from_spec`` on a 3-group hybrid.

Groups as the deployment lays them out under KVarN: full attention and recurrent state at
2176-token blocks, the DFlash2 drafter's sliding-window layers (numbered after the target's
64 layers) at 128. The speculative config uses EAGLE-style drafting (mtp/dflash do). The
offloading spec and the configs are stand-ins carrying only the fields the builder reads;
the KV cache config and its specs are vLLM's own classes.
"""

from __future__ import annotations

import logging
import types

from _result import report

NUM_TARGET_LAYERS = 64
CPU_BYTES = 4 << 30


def main() -> None:
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
        SlidingWindowSpec,
    )

    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger(scheduler.__name__).addHandler(Collect())

    full = FullAttentionSpec(block_size=2176, num_kv_heads=4, head_size=256,
                             dtype=torch.bfloat16)
    mamba = MambaSpec(block_size=2176, shapes=((16, 1024),), dtypes=(torch.float16,),
                      mamba_cache_mode="align")
    draft = SlidingWindowSpec(block_size=128, num_kv_heads=8, head_size=128,
                              dtype=torch.bfloat16, sliding_window=2048)
    groups = [
        KVCacheGroupSpec([f"model.layers.{i}.self_attn.attn" for i in (3, 7)], full),
        KVCacheGroupSpec([f"model.layers.{i}.linear_attn" for i in (0, 1)], mamba),
        KVCacheGroupSpec([f"model.layers.{i}.self_attn.attn"
                          for i in range(NUM_TARGET_LAYERS, NUM_TARGET_LAYERS + 2)], draft),
    ]
    kv_cache_config = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=groups)
    spec = types.SimpleNamespace(tokens_per_block=(2176, 2176, 128), blocks_per_chunk=1,
                                 tokens_per_hash=128, offload_prompt_only=False,
                                 extra_config={"cpu_bytes_to_use": CPU_BYTES})
    vllm_config = types.SimpleNamespace(
        speculative_config=types.SimpleNamespace(use_eagle=lambda: True),
        model_config=types.SimpleNamespace(get_total_num_hidden_layers=lambda: NUM_TARGET_LAYERS),
        parallel_config=types.SimpleNamespace(world_size=1, decode_context_parallel_size=1),
    )
    config = scheduler.SchedulerOffloadConfig.from_spec(
        spec, vllm_config, kv_cache_config)  # type: ignore[arg-type]
    report({
        "eagle_flags": [g.is_eagle_group for g in config.kv_group_configs],
        "tokens_per_chunk": [g.tokens_per_chunk for g in config.kv_group_configs],
        "log": records,
    })


if __name__ == "__main__":
    main()
