"""Counts the Triton compiles the split-KV kernels would cost the first requests after boot.

Not a test module: test_spec_decode_prewarm.py runs it as a subprocess against the CPU
wheel's tree with the whole series applied, once with and once without the warm-up.

There is no GPU here, so nothing is compiled or launched. Triton's real JIT entry point still
runs for every launch: a stand-in driver answers "RTX 3090" (sm_86) to what
``JITFunction.run`` asks of a driver, Triton binds the launch's arguments and computes the
same specialisation key it would on that card, and its ``jit_cache_hook`` is called on every
miss of its in-memory kernel cache; the hook here notes the key, passes it on to vLLM's JIT
monitor as the compile Triton would now do, and declines the compile. So the keys counted
are the kernels a GPU process would compile, and the monitor's log lines are vLLM's own.

The sequence is the worker's at boot: vLLM's real ``kernel_warmup(worker)`` (which, patched,
runs the series' split-KV warm-up) unless ``--no-warmup``, then ``jit_monitor.activate`` as
``gpu_worker.compile_or_warm_up_model`` does right after, then the requests: verify batches of
every shape the split-KV path takes, with real contexts and block tables, through
``TritonAttentionImpl.forward`` / ``FlashAttentionImpl.forward``.

    python spec_decode_prewarm_worker.py --tree DIR --out result.json [--no-warmup]
        [--terse-monitor] [--runner v2|v1|none] [--width N] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# The model's attention shapes (Qwen3.8-27B: 24 query heads over 4 KV heads of 256) and, by
# default, an SPEC=mtp-like plan: k = 3 drafts (QMAX 4), 4 sequences (--drafts, --max-seqs:
# SPEC=dflash2's DFLASH_TOKENS 15 is --drafts 15).
HEADS, KV_HEADS, HEAD_SIZE, BLOCK = 24, 4, 256, 16
K, MAX_SEQS = 3, 4
# The runner's block table is [max_num_reqs, width]; 233 blocks of 16 (a 3,728-token
# max_model_len) is a row stride Triton does not specialise as a multiple of 16 (--width).
WIDTH = 233
# Contexts (tokens before the verify block) of the request phase's sequences.
CONTEXTS = (895, 37, 2554, 300)


class SM86Driver:
    """What ``JITFunction.run`` asks of Triton's active driver, answered for an RTX 3090."""

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 86, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


class CompileLedger:
    """Triton's in-memory kernel cache as seen through ``jit_cache_hook``: a key not seen
    before is a compile. Without a GPU (``decline``) the compile is reported to the
    post-compile hook vLLM's monitor installs and then declined, so the launch returns
    without running; on a GPU Triton compiles and reports it itself."""

    def __init__(self, decline: bool) -> None:
        self.decline = decline
        self.compiled: dict[str, str] = {}
        self.phase = "boot"
        self.by_phase: dict[str, list[str]] = {}
        self.keys: dict[str, list[str]] = {}

    def __call__(self, **kwargs: Any) -> bool:
        from triton import knobs

        key = str(kwargs["key"])
        if key not in self.compiled:
            name = str(getattr(kwargs["fn"], "name", "?"))
            self.compiled[key] = name
            self.by_phase.setdefault(self.phase, []).append(name)
            self.keys.setdefault(self.phase, []).append(key)
            post = knobs.runtime.jit_post_compile_hook
            if self.decline and post is not None:
                post(**kwargs)
        return self.decline


def _config(torch: Any, context: dict[str, Any], drafts: int, max_seqs: int) -> SimpleNamespace:
    """The fields of VllmConfig that the impls and kernel_warmup read."""
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=max_seqs, max_num_batched_tokens=2048),
        speculative_config=SimpleNamespace(num_speculative_tokens=drafts),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        model_config=SimpleNamespace(
            dtype=torch.bfloat16, hf_text_config=SimpleNamespace(model_type="qwen3_5_text")
        ),
        compilation_config=SimpleNamespace(
            static_forward_context=context, cudagraph_capture_sizes=[1, 2, 4, 8, 16]
        ),
        kernel_config=SimpleNamespace(enable_jit_warmup=False, enable_cutedsl_warmup=False),
    )


def _layers(torch: Any, kinds: list[str], qmax: int) -> dict[str, Any]:
    """One attention layer per backend and cache dtype, as vLLM binds them: the impl and
    the logical (blocks, kv heads, block size, 2 x head) cache with NHD strides."""
    from vllm.v1.attention.backends import triton_attn as ta_mod

    num_blocks = sum(-(-(c + qmax) // BLOCK) for c in CONTEXTS) + 1
    layers: dict[str, Any] = {}
    for kind in kinds:
        for dtype in ("auto", "int8_per_token_head") if kind == "triton" else ("auto",):
            if kind == "triton":
                cls: Any = ta_mod.TritonAttentionImpl
            else:
                from vllm.v1.attention.backends import flash_attn as fa_mod

                cls = fa_mod.FlashAttentionImpl
            impl = cls(num_heads=HEADS, head_size=HEAD_SIZE, scale=HEAD_SIZE**-0.5,
                       num_kv_heads=KV_HEADS, alibi_slopes=None, sliding_window=None,
                       kv_cache_dtype=dtype)
            if kind == "flash":
                # No FA build on the CPU; the split-KV dispatch comes before FA is called.
                impl.vllm_flash_attn_version = impl.vllm_flash_attn_version or 2
            assert impl.spec_decode_attn is not None, (kind, dtype)
            int8 = dtype != "auto"
            width = 2 * (HEAD_SIZE + 4) if int8 else 2 * HEAD_SIZE
            raw = torch.zeros((num_blocks, BLOCK, KV_HEADS, width),
                              dtype=torch.int8 if int8 else torch.bfloat16)
            # The logical view vLLM hands the backends (spec_decode_ref.paged_views).
            kv_cache = raw.permute(0, 2, 1, 3)
            layers[f"model.layers.{len(layers) * 4 + 3}.self_attn.attn.{kind}.{dtype}"] = (
                SimpleNamespace(
                    impl=impl, kv_cache=kv_cache, kind=kind,
                    _k_scale=torch.ones(()), _v_scale=torch.ones(()), _q_scale=torch.ones(()),
                )
            )
    return layers


def _request_metadata(torch: Any, kind: str, q: int, contexts: list[int],
                      block_table: Any) -> Any:
    from vllm.v1.attention.backends import triton_attn as ta_mod

    seqs = len(contexts)
    tokens = seqs * q
    seq_lens = [c + q for c in contexts]
    common: dict[str, Any] = dict(
        num_actual_tokens=tokens, max_query_len=q,
        query_start_loc=torch.arange(0, tokens + 1, q, dtype=torch.int32),
        max_seq_len=max(seq_lens), seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_table=block_table[:seqs], slot_mapping=torch.zeros(tokens, dtype=torch.int64),
        causal=True, use_cascade=False, common_prefix_len=0, cu_prefix_query_lens=None,
        prefix_kv_lens=None, suffix_kv_lens=None,
    )
    if kind == "triton":
        # No 3-D scratch: a verify batch takes the split-KV path, never stock's 3-D one.
        no_3d: dict[str, Any] = dict(
            seq_threshold_3D=0, num_par_softmax_segments=None, softmax_segm_output=None,
            softmax_segm_max=None, softmax_segm_expsum=None,
        )
        return ta_mod.TritonAttentionMetadata(**common, **no_3d)
    return SimpleNamespace(**common, scheduler_metadata=None, max_num_splits=0,
                           mm_prefix_query_range_tensor=None, rswa_prefix_lens=None)


def _runner(torch: Any, config: SimpleNamespace, layout: str, table: Any) -> SimpleNamespace:
    """The model runner as the warm-up sees it: the V2 runner's input block tables, the V1
    runner's per-group buffers, or (``none``) neither, which leaves the warm-up to cover both
    of Triton's stride classes."""
    names = list(config.compilation_config.static_forward_context)
    runner = SimpleNamespace(
        is_pooling_model=False, device=torch.get_default_device(),
        compilation_config=config.compilation_config,
        kv_cache_config=SimpleNamespace(kv_cache_groups=[SimpleNamespace(layer_names=names)]),
    )
    if layout == "v2":
        runner.block_tables = SimpleNamespace(input_block_tables=[table])
    elif layout == "v1":
        buffer = SimpleNamespace(block_table=SimpleNamespace(gpu=table))
        runner.input_batch = SimpleNamespace(
            block_table=SimpleNamespace(block_tables=[buffer])
        )
    return runner


def _as_rtx3090(sda: Any) -> None:
    """Plan as on an RTX 3090 although no card is here: its tile plans
    (ARCH_TILE_PLANS[(8, 6)]), its int8 widening, and its shared memory and SM count in
    the workspace the planner reads (the compile report's figures for the card)."""
    from tests.patch.spec_decode_worker import COMPILE_TARGETS

    _, _, sms, smem, _ = next(t for t in COMPILE_TARGETS if t[0] == "rtx3090")
    make = sda.get_workspace

    def get_workspace(*args: Any, **kwargs: Any) -> Any:
        ws = make(*args, **kwargs)
        ws.max_shared_mem, ws.num_sms = smem, sms
        return ws

    sda._capability = lambda device: (8, 6)
    sda.use_fast_int8 = lambda tiles, device: (
        tiles.fast_int8 if tiles.fast_int8 is not None else True)
    sda.get_workspace = get_workspace


def run(warmup: bool, verbose: bool, layout: str = "v2", width: int = WIDTH,
        device: str = "cpu", drafts: int = K, max_seqs: int = MAX_SEQS,
        card: str = "default") -> dict[str, Any]:
    import torch
    import vllm.config.vllm as config_mod
    from triton import knobs
    from triton.runtime.driver import driver
    from vllm.utils import jit_monitor

    os.environ["VLLM_SPEC_DECODE_ATTN"] = "1"
    qmax = drafts + 1
    os.environ["VLLM_SPEC_DECODE_ATTN_QMAX"] = str(qmax)
    if card == "rtx3090":
        import vllm.v1.attention.ops.spec_decode_attention as sda_mod

        _as_rtx3090(sda_mod)
    if device == "cpu":
        driver.set_active(SM86Driver())
    else:
        # Every tensor below (caches, tables, the split-KV scratch) on the GPU.
        torch.set_default_device(device)
    ledger = CompileLedger(decline=device == "cpu")
    knobs.runtime.jit_cache_hook = ledger

    context: dict[str, Any] = {}
    config = _config(torch, context, drafts, max_seqs)
    config_mod._current_vllm_config = config  # type: ignore[assignment]
    kinds = ["triton"]
    try:
        from vllm.v1.attention.backends import flash_attn  # noqa: F401

        kinds.append("flash")
    except ImportError:
        pass
    context.update(_layers(torch, kinds, qmax))
    # The runner's persistent block table (one KV group); the requests' rows are its rows.
    table = torch.zeros((max_seqs, width), dtype=torch.int32)
    runner = _runner(torch, config, layout, table)
    # use_v2_model_runner only gates kernel_warmup's V1 block-table and KV-zeroing warm-ups,
    # which need a whole V1 runner; the split-KV warm-up finds the tables either way.
    worker = SimpleNamespace(
        use_v2_model_runner=True, model_runner=runner, vllm_config=config,
        scheduler_config=config.scheduler_config, get_model=lambda: torch.nn.Module(),
    )
    result: dict[str, Any] = {"warmup": warmup, "kinds": kinds, "layers": list(context),
                              "runner": layout, "width": width, "drafts": drafts,
                              "max_seqs": max_seqs, "card": card}
    if warmup:
        import types

        from vllm.model_executor.warmup.kernel_warmup import kernel_warmup

        # kernel_warmup imports MiniMax-M3's warm-up first thing, whose model imports
        # torchvision (absent from the CPU venv); it is called only past the
        # process-local part this run stops at, so an empty stand-in does.
        minimax = types.ModuleType("vllm.model_executor.warmup.minimax_m3_msa_warmup")
        minimax.minimax_m3_msa_warmup = lambda worker: None  # type: ignore[attr-defined]
        sys.modules[minimax.__name__] = minimax
        ledger.phase = "warmup"
        kernel_warmup(worker, process_local_only=True)  # type: ignore[arg-type]
    # gpu_worker.compile_or_warm_up_model: all warm-up done, then the monitor (verbose: a
    # line for every compile; by default one per kernel name).
    jit_monitor.activate(mode="warn", verbose=verbose)
    ledger.phase = "requests"
    batches = 0
    plans: list[dict[str, Any]] = []
    for q in range(2, drafts + 2):
        for seqs in range(1, max_seqs + 1):
            contexts = list(CONTEXTS[:seqs])
            table.zero_()
            used = 1  # block 0 is the null block
            for row, ctx in enumerate(contexts):
                n = -(-(ctx + q) // BLOCK)
                table[row, :n] = torch.arange(used, used + n, dtype=torch.int32)
                used += n
            for layer in context.values():
                query = torch.zeros((seqs * q, HEADS, HEAD_SIZE), dtype=torch.bfloat16)
                out = torch.empty_like(query)
                sda = layer.impl.spec_decode_attn
                sda.last_plan = None
                layer.impl.forward(layer, query, None, None, layer.kv_cache,
                                   _request_metadata(torch, layer.kind, q, contexts, table),
                                   output=out)
                plan = sda.last_plan
                assert plan is not None, "the split-KV path declined a verify batch"
                plans.append({"layer": layer.kind, "int8": layer.kv_cache.dtype == torch.int8,
                              "q": q, "seqs": seqs, "kernel": plan.kernel,
                              "block_m": plan.block_m, "q_tiles": plan.q_tiles,
                              "tile_n": plan.tile_n, "num_warps": plan.num_warps,
                              "num_segments": plan.num_segments})
                batches += 1
    if device == "cuda":
        torch.cuda.synchronize()
    result["request_batches"] = batches
    result["plans"] = plans
    result["compiled"] = {phase: names for phase, names in ledger.by_phase.items()}
    result["keys"] = ledger.keys
    config_mod._current_vllm_config = None
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", required=True, help="directory that contains the patched vllm/")
    parser.add_argument("--out", required=True)
    parser.add_argument("--no-warmup", action="store_true",
                        help="skip kernel_warmup (what a tree without the warm-up patch does)")
    parser.add_argument("--terse-monitor", action="store_true",
                        help="the JIT monitor's default mode (one line per kernel name)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: Triton's keys for sm_86, nothing compiled; cuda: this GPU, "
                        "compiled and run for real")
    parser.add_argument("--runner", choices=("v2", "v1", "none"), default="v2",
                        help="the block tables the warm-up finds: V2's, V1's, or none")
    parser.add_argument("--width", type=int, default=WIDTH,
                        help="the block table's row stride (blocks per request)")
    parser.add_argument("--drafts", type=int, default=K,
                        help="draft tokens a verify step checks (the verify block is one more)")
    parser.add_argument("--max-seqs", type=int, default=MAX_SEQS)
    parser.add_argument("--card", choices=("default", "rtx3090"), default="default",
                        help="default: the planner's plans without a card (an H200's); "
                        "rtx3090: the RTX 3090's tile plans, shared memory and SMs")
    parser.add_argument("--dist-dir", help="holds a vllm-0.28.0.dist-info (see spec_decode_worker)")
    args = parser.parse_args()
    # Triton's compiler path, not its interpreter; on the CPU no device is used.
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.pop("TRITON_INTERPRET", None)
    if args.dist_dir:
        sys.path.insert(0, args.dist_dir)
    sys.path.insert(0, args.tree)
    if args.device == "cpu":
        # After the tree: its vllm must win.
        sys.path.insert(1, str(Path(__file__).resolve().parents[2]))
        from tests.support.cpu_kernels import load_cpu_kernels_for_this_cpu

        load_cpu_kernels_for_this_cpu()
    from vllm.triton_utils import HAS_TRITON

    assert HAS_TRITON, "vLLM disabled Triton in the worker"
    result = run(warmup=not args.no_warmup, verbose=not args.terse_monitor,
                 layout=args.runner, width=args.width, device=args.device,
                 drafts=args.drafts, max_seqs=args.max_seqs, card=args.card)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
