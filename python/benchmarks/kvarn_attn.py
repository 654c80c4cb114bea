"""Benchmark: the KVarN cache's kernels (kvarn-cache.patch's overlay) at the model's shapes on a
GPU, against bf16 attention over the same keys and values, side by side in one run.

Not a test: run it on a CUDA machine with torch and Triton (no vLLM needed)::

    python kvarn_attn.py [--contexts 16384,65536,131072,262144] [--queries 1,8]
                         [--budget 150] [--json OUT.json]

Per context it stores a request's keys and values (4 kv heads, head size 256, keys with a
per-channel offset and three outlier channels, as the interpreter tests use) and prints:
the store's time per token; the cache's bytes per token per layer (the tensor's, against the
layout's 840); per query length, the kvarn attention's time (median of CUDA-event timed eager
calls, each including its scratch allocation and both passes) next to torch's
scaled_dot_product_attention over the bf16 keys and values; the relative error of the kvarn
output against float32 attention over the original (unquantized) rows; and a needle check: a
key planted to match the last query row, whose value the kvarn output must still point to
(cosine similarity).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
OVERLAY = HERE.parents[1] / "patches" / "overlay" / "vllm" / "v1" / "attention" / "ops" / "kvarn.py"
KV_HEADS, GROUP, HEAD_SIZE, BLOCK = 4, 6, 256, 1024
TILE = 128
# "cpu" only for --smoke: the Triton interpreter over a short context, to check this
# script's plumbing before device time is spent on it.
DEVICE = "cuda"


def load_kvarn() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_bench_kvarn", OVERLAY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while decorating
    spec.loader.exec_module(module)
    return module


def keys_like(n: int, gen: torch.Generator) -> torch.Tensor:
    k = torch.randn(n, KV_HEADS, HEAD_SIZE, generator=gen)
    k += 2.0 * torch.randn(1, KV_HEADS, HEAD_SIZE, generator=gen)
    k[..., :3] *= 12.0
    return k


def timed(fn: Any, reps: int) -> float:
    """Median microseconds of ``reps`` CUDA-event timed calls (after two warm calls)."""
    if DEVICE != "cuda":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    cuda: Any = torch.cuda  # its Event is untyped
    times: list[float] = []
    for _ in range(reps):
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(float(start.elapsed_time(end)) * 1000.0)
    return float(statistics.median(times))


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: int) -> torch.Tensor:
    """float32 attention of the last q rows of a ctx-token request (causal among them)."""
    nq = q.shape[0]
    kk = k.float().repeat_interleave(GROUP, dim=1).transpose(0, 1)  # [H, ctx, D]
    vv = v.float().repeat_interleave(GROUP, dim=1).transpose(0, 1)
    s = torch.einsum("qhd,hkd->hqk", q.float(), kk) / math.sqrt(HEAD_SIZE)
    pos = torch.arange(ctx, device=q.device)
    limit = ctx - nq + torch.arange(nq, device=q.device)
    s = s.masked_fill(pos[None, None, :] > limit[None, :, None], float("-inf"))
    return torch.einsum("hqk,hkd->qhd", s.softmax(-1), vv)


def cell(
    kv: ModuleType, ctx: int, queries: list[int], gen: torch.Generator
) -> list[dict[str, Any]]:
    dev = DEVICE
    k = keys_like(ctx, gen)
    v = torch.randn(ctx, KV_HEADS, HEAD_SIZE, generator=gen)
    q_rows = torch.randn(max(queries), KV_HEADS * GROUP, HEAD_SIZE, generator=gen)
    # The needle: the last query row of head group 0 matches one planted key, scaled so that
    # its logit stands far above the rest, and that position carries a distinctive value.
    needle = int(torch.randint(0, ctx - max(queries), (1,), generator=gen))
    direction = torch.randn(HEAD_SIZE, generator=gen)
    direction /= direction.norm()
    k[needle, 0] = direction * 100.0
    q_rows[-1, :GROUP] = direction * 8.0
    v[needle, 0] = torch.linspace(-3, 3, HEAD_SIZE)
    k, v = k.to(dev, torch.bfloat16), v.to(dev, torch.bfloat16)
    q_rows = q_rows.to(dev, torch.bfloat16)

    blocks = -(-ctx // BLOCK)
    cache = torch.full(kv.cache_shape(blocks, BLOCK, KV_HEADS, HEAD_SIZE), 0xFF,
                       dtype=torch.uint8, device=dev)
    tiles = -(-ctx // TILE)
    src = torch.arange(tiles, dtype=torch.int32, device=dev) * TILE
    length = torch.clamp(ctx - src, max=TILE).to(torch.int32)
    slot = torch.arange(tiles, dtype=torch.int64, device=dev)  # block b holds tiles b*8..
    store_us = timed(lambda: kv.store_tiles(k, v, cache, src, length, slot), 5)
    table = torch.arange(blocks, dtype=torch.int32, device=dev)[None, :]
    seq_lens = torch.tensor([ctx], dtype=torch.int32, device=dev)
    cache_bytes_per_token = cache.numel() / (blocks * BLOCK)
    kh, vh = k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    rows = []
    for nq in queries:
        q = q_rows[-nq:].contiguous()
        starts = torch.tensor([0, nq], dtype=torch.int32, device=dev)

        def run_kvarn(q: torch.Tensor = q, starts: torch.Tensor = starts,
                      nq: int = nq) -> torch.Tensor:
            out: torch.Tensor = kv.attention(q, cache, table, seq_lens, starts, nq, ctx,
                                             KV_HEADS, HEAD_SIZE ** -0.5)
            return out

        # bf16 baseline: torch's SDPA over the whole bf16 context (GQA), causal among the
        # queries through an explicit mask only when there is more than one.
        qh = q.transpose(0, 1)[None]  # [1, H, nq, D]
        mask = None
        if nq > 1:
            pos = torch.arange(ctx, device=dev)
            limit = ctx - nq + torch.arange(nq, device=dev)
            mask = (pos[None, :] <= limit[:, None])[None, None]

        def run_bf16(qh: torch.Tensor = qh, mask: torch.Tensor | None = mask) -> torch.Tensor:
            return torch.nn.functional.scaled_dot_product_attention(
                qh, kh, vh, attn_mask=mask, enable_gqa=True)

        kvarn_us = timed(run_kvarn, 20)
        bf16_us = timed(run_bf16, 20)
        out = run_kvarn().float()
        ref = reference(q, k, v, ctx)
        rel = float((out - ref).norm() / ref.norm())
        planted = v[needle, 0].float()
        got = out[-1, :GROUP].float()
        cos = float(torch.nn.functional.cosine_similarity(got, planted[None], dim=-1).min())
        row = {"context": ctx, "q": nq, "store_us_per_token": store_us / ctx,
               "cache_bytes_per_token_per_layer": cache_bytes_per_token,
               "layout_bytes_per_token_per_layer":
                   kv.bytes_per_token_per_layer(KV_HEADS, HEAD_SIZE),
               "kvarn_us": kvarn_us, "bf16_sdpa_us": bf16_us,
               "kvarn_over_bf16": kvarn_us / bf16_us,
               "rel_err_vs_unquantized": rel, "needle_cosine": cos,
               "finite": bool(torch.isfinite(out).all())}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--contexts", default="16384,65536,131072,262144")
    p.add_argument("--queries", default="1,8")
    p.add_argument("--budget", type=float, default=150.0,
                   help="seconds: contexts not started by then are listed as skipped")
    p.add_argument("--json", type=Path)
    p.add_argument("--smoke", action="store_true",
                   help="run on the CPU under TRITON_INTERPRET=1 (set it) at the given contexts")
    args = p.parse_args()
    global DEVICE
    if args.smoke:
        DEVICE = "cpu"
    elif not torch.cuda.is_available():
        raise SystemExit("kvarn_attn.py needs a CUDA GPU")
    import triton

    kv = load_kvarn()
    gen = torch.Generator().manual_seed(0)
    queries = [int(x) for x in args.queries.split(",")]
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    skipped: list[int] = []
    for ctx in (int(x) for x in args.contexts.split(",")):
        if time.monotonic() - started > args.budget:
            skipped.append(ctx)
            continue
        rows.extend(cell(kv, ctx, queries, gen))
    card = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu (interpreter)"
    result = {"card": card, "torch": torch.__version__,
              "triton": triton.__version__, "rows": rows, "skipped_contexts": skipped}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print("| context | q | kvarn µs | bf16 SDPA µs | kvarn / bf16 | rel err | needle cos | "
          "B/token/layer |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['context']:,} | {r['q']} | {r['kvarn_us']:.1f} | {r['bf16_sdpa_us']:.1f} | "
              f"{r['kvarn_over_bf16']:.2f} | {r['rel_err_vs_unquantized']:.3f} | "
              f"{r['needle_cosine']:.3f} | {r['cache_bytes_per_token_per_layer']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
