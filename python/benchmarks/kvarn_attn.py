"""Benchmark: the KVarN cache's kernels (kvarn-cache.patch's overlay) at the model's shapes on a
GPU, against bf16 attention over the same keys and values, side by side in one run.

Not a test: run it on a CUDA machine with torch and Triton (no vLLM needed)::

    python kvarn_attn.py [--contexts 16384,65536,131072,262144] [--queries 1,8]
                         [--budget 150] [--json OUT.json] [--stock [--tree DIR]]

Per context it stores a request's keys and values (4 kv heads, head size 256, keys with a
per-channel offset and three outlier channels, as the interpreter tests use) and prints:
the store's time per token; the cache's bytes per token per layer (the tensor's, against the
layout's 840); per query length, the kvarn attention's time (median of CUDA-event timed eager
calls, each including its scratch allocation and both passes) next to torch's
scaled_dot_product_attention over the bf16 keys and values; the relative error of the kvarn
output against float32 attention over the original (unquantized) rows; and a needle check: a
key planted to match the last query row, whose value the kvarn output must still point to
(cosine similarity). With ``--stock`` (vLLM's python tree importable, or given as ``--tree``)
it also times vLLM 0.28.0's ``unified_attention``, as TRITON_ATTN calls it, over a paged bf16
cache and a paged fp8 (e4m3, per-tensor scale) cache of the same rows, 16-token blocks: the
same kernel on both, so its bf16/fp8 ratio and kvarn's stand side by side.

``--seats 8,64 --seat-contexts 4096,16384 --segments 1,4,8,16,32`` instead times a batch: that
many requests decoding (or verifying ``--queries`` rows) at once over their own blocks of one
context, at each split-KV segment count, beside the count the KVARN backend launches today
(SPLIT_SEGMENTS, 32): the question is how few segments, and so how small a split workspace, a
batch of seats needs (python/docs/kvarn.md, "Next" item 9); ``--seat-long 65536`` makes seat 0
a long request among short ones. Each count's largest difference
from 32's output, relative to its largest element, is printed (bf16 rounding: about 4e-3).

``--store-seats 1,8,48,64`` instead times one decode step's store per layer as the backend
launches it (two tiles a seat from staging, the second a one-row null tile), without
``tile_keep``, with it all zeros, with every open tile lost, and with zeros and the null
tiles as 0-row placeholders; ``--also-overlay OLD/kvarn.py`` times another version of the
overlay beside this tree's in the same run (the questions: what the lost-tile restore costs
the steps that lose nothing, and what skipping the null tiles saves).
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


def load_kvarn(path: Path = OVERLAY, name: str = "_bench_kvarn") -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
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


STOCK_BLOCK = 16
FP8_MAX = 448.0


class Stock:
    """vLLM's unified_attention over paged bf16 and fp8 copies of one request's rows."""

    def __init__(self, tree: Path | None) -> None:
        if tree is not None:
            sys.path.insert(0, str(tree))
        import importlib

        self.tua = importlib.import_module("vllm.v1.attention.ops.triton_unified_attention")
        self.modes = importlib.import_module("vllm.v1.kv_cache_interface").KVQuantMode

    def caches(self, k: torch.Tensor, v: torch.Tensor) -> dict[str, Any]:
        """Paged [blocks, 16, kv heads, D] caches, bf16 and fp8 with per-tensor scales."""
        ctx = k.shape[0]
        blocks = -(-ctx // STOCK_BLOCK)
        pad = blocks * STOCK_BLOCK - ctx

        def paged(x: torch.Tensor) -> torch.Tensor:
            x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad))
            return x.view(blocks, STOCK_BLOCK, KV_HEADS, HEAD_SIZE).contiguous()

        k_scale = (k.float().abs().amax() / FP8_MAX).reshape(())
        v_scale = (v.float().abs().amax() / FP8_MAX).reshape(())
        fp8 = torch.float8_e4m3fn
        return {
            "bf16": (paged(k), paged(v), None, None),
            "fp8": (paged((k.float() / k_scale).to(fp8)), paged((v.float() / v_scale).to(fp8)),
                    k_scale, v_scale),
            "table": torch.arange(blocks, dtype=torch.int32, device=k.device)[None, :],
        }

    def call(self, caches: dict[str, Any], dtype: str, q: torch.Tensor,
             ctx: int) -> Any:
        key, value, k_scale, v_scale = caches[dtype]
        nq, heads = q.shape[0], q.shape[1]
        dev = q.device
        threshold = 128 // KV_HEADS  # MIN_LAUNCH_GRID_SIZE_2D // num_kv_heads, as TRITON_ATTN
        segm_out = torch.empty((threshold, heads, 16, HEAD_SIZE), device=dev)
        segm_max = torch.empty((threshold, heads, 16), device=dev)
        segm_sum = torch.empty((threshold, heads, 16), device=dev)
        out = torch.empty_like(q)
        quant: dict[str, Any] = {}
        descale: tuple[Any, Any] = (None, None)
        if k_scale is not None:
            quant = {"kv_quant_mode": self.modes.FP8_PER_TENSOR}
            descale = (k_scale.expand(1, KV_HEADS), v_scale.expand(1, KV_HEADS))
        starts = torch.tensor([0, nq], dtype=torch.int32, device=dev)
        lens = torch.tensor([ctx], dtype=torch.int32, device=dev)

        def run() -> torch.Tensor:
            self.tua.unified_attention(
                q=q, k=key, v=value, out=out, cu_seqlens_q=starts, max_seqlen_q=nq,
                seqused_k=lens, max_seqlen_k=ctx, softmax_scale=HEAD_SIZE ** -0.5,
                causal=True, window_size=(-1, -1), block_table=caches["table"], softcap=0,
                q_descale=None, k_descale=descale[0], v_descale=descale[1],
                seq_threshold_3D=threshold, num_par_softmax_segments=16,
                softmax_segm_output=segm_out, softmax_segm_max=segm_max,
                softmax_segm_expsum=segm_sum, **quant)
            return out

        return run


def cell(
    kv: ModuleType, ctx: int, queries: list[int], gen: torch.Generator,
    stock: Stock | None = None,
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
    paged = stock.caches(k, v) if stock is not None else None
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
        if stock is not None and paged is not None:
            ref_rows = reference(q, k, v, ctx)
            for dtype in ("bf16", "fp8"):
                run_stock = stock.call(paged, dtype, q, ctx)
                row[f"stock_{dtype}_us"] = timed(run_stock, 20)
                got_stock = run_stock().float()
                row[f"stock_{dtype}_rel_err"] = float(
                    (got_stock - ref_rows).norm() / ref_rows.norm())
            row["kvarn_over_stock_fp8"] = kvarn_us / row["stock_fp8_us"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def seats_cell(kv: ModuleType, seats: int, ctx: int, queries: list[int],
               segments: list[int], gen: torch.Generator,
               long_ctx: int = 0) -> list[dict[str, Any]]:
    """``seats`` requests of ``ctx`` tokens each (one request's rows, copied into every seat's
    own blocks, so each seat reads its own bytes), decoded together at each segment count.
    With ``long_ctx``, seat 0 reads that many tokens instead: one long request among short
    ones, the batch a segment count chosen from the number of requests alone would starve."""
    dev = DEVICE
    longest = max(ctx, long_ctx)
    k = keys_like(longest, gen).to(dev, torch.bfloat16)
    v = torch.randn(longest, KV_HEADS, HEAD_SIZE, generator=gen).to(dev, torch.bfloat16)
    per_seat = -(-longest // BLOCK)
    cache = torch.full(kv.cache_shape(seats * per_seat, BLOCK, KV_HEADS, HEAD_SIZE), 0xFF,
                       dtype=torch.uint8, device=dev)
    tiles = -(-longest // TILE)
    src = torch.arange(tiles, dtype=torch.int32, device=dev) * TILE
    length = torch.clamp(longest - src, max=TILE).to(torch.int32)
    kv.store_tiles(k, v, cache, src, length, torch.arange(tiles, dtype=torch.int64, device=dev))
    for seat in range(1, seats):
        cache[seat * per_seat:(seat + 1) * per_seat] = cache[:per_seat]
    table = torch.arange(seats * per_seat, dtype=torch.int32, device=dev).view(seats, per_seat)
    seq_lens = torch.full((seats,), ctx, dtype=torch.int32, device=dev)
    if long_ctx:
        seq_lens[0] = long_ctx
    # The seats whose outputs must agree: all, or the short ones beside a long seat 0.
    alike = 1 if long_ctx else 0
    heads = KV_HEADS * GROUP
    rows = []
    for nq in queries:
        # One request's query rows in every seat: the seats' outputs must then agree, which
        # shows each read its own (copied) blocks through the block table.
        one = torch.randn(nq, heads, HEAD_SIZE, generator=gen).to(dev, torch.bfloat16)
        q = one.repeat(seats, 1, 1)
        starts = torch.arange(seats + 1, dtype=torch.int32, device=dev) * nq

        def run(segs: int, q: torch.Tensor = q, starts: torch.Tensor = starts,
                nq: int = nq) -> torch.Tensor:
            out: torch.Tensor = kv.attention(q, cache, table, seq_lens, starts, nq, longest,
                                             KV_HEADS, HEAD_SIZE ** -0.5, num_segments=segs)
            return out

        served = run(SERVED_SEGMENTS).float()
        base_us = timed(lambda: run(SERVED_SEGMENTS), 20)
        for segs in segments:
            us = timed(lambda segs=segs: run(segs), 20)
            got = run(segs).float()
            every = got.view(seats, nq, heads, HEAD_SIZE)
            by_seat = every[alike:]
            row = {"seats": seats, "context": ctx, "long_context": long_ctx, "q": nq,
                   "segments": segs, "kvarn_us": us,
                   "over_served_segments": us / base_us,
                   "workspace_bytes": seats * nq * heads * segs * (HEAD_SIZE + 2) * 4,
                   "max_rel_diff_vs_served": float((got - served).abs().max()
                                                   / served.abs().max()),
                   "seat_spread": float((by_seat - by_seat[:1]).abs().max()
                                        / by_seat[0].abs().max()) if len(by_seat) else 0.0,
                   "finite": bool(torch.isfinite(got).all())}
            if long_ctx and seats > 1:
                # Seat 0 read more tokens than seat 1 with the same queries: they must differ.
                row["long_vs_short"] = float((every[0] - every[1]).abs().max()
                                             / every[1].abs().max())
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def store_cell(kv: ModuleType, name: str, seats: int, gen: torch.Generator,
               reps: int) -> dict[str, Any]:
    """One decode step's re-quantizing store as the KVARN backend launches it per layer:
    two tiles a seat from the staging rows (the open tile, 1..128 rows, and the null
    second tile of one row), timed four ways: without ``tile_keep``; with it all zeros
    (no tile lost: the common step); with every open tile lost (all but its last row
    restored from the cache first: the worst step); and with zeros and the null tiles as
    0-row placeholders (the step the backend launches since session 11)."""
    dev = DEVICE
    rows_total = 2 * seats * TILE + TILE  # two staging entries a seat, and scratch
    stage_k = keys_like(rows_total, gen).to(dev, torch.bfloat16)
    stage_v = torch.randn(rows_total, KV_HEADS, HEAD_SIZE, generator=gen).to(dev, torch.bfloat16)
    tiles_per_block = BLOCK // TILE
    blocks = 1 + -(-seats // tiles_per_block)
    cache = torch.full(kv.cache_shape(blocks, BLOCK, KV_HEADS, HEAD_SIZE), 0xFF,
                       dtype=torch.uint8, device=dev)
    open_len = torch.randint(1, TILE + 1, (seats,), generator=gen).to(dev, torch.int32)
    seat = torch.arange(seats, device=dev)
    entry_a = 2 * seat
    src = torch.stack([entry_a, torch.full_like(seat, 2 * seats)], 1) * TILE
    length = torch.stack([open_len, torch.ones_like(open_len)], 1)
    slot = torch.stack([tiles_per_block + seat, torch.zeros_like(seat)], 1)  # null: block 0
    src, length, slot = (src.reshape(-1).int(), length.reshape(-1).int(),
                         slot.reshape(-1).long())
    kv.store_tiles(stage_k, stage_v, cache, src, length, slot)  # the tiles hold rows
    none = torch.zeros_like(length)
    lost = torch.stack([open_len - 1, torch.zeros_like(open_len)], 1).reshape(-1).int()
    # The null tiles as 0-row placeholders, which a store that skips them does not work on
    # (a store that does not: as much work as one row).
    placeholders = length.clone()
    placeholders[1::2] = 0
    row: dict[str, Any] = {"overlay": name, "seats": seats, "tiles": int(src.numel())}
    for label, lens, keep in (("no_keep", length, None), ("keep_zero", length, none),
                              ("all_lost", length, lost),
                              ("keep_zero_null_skipped", placeholders, none)):
        row[f"{label}_us"] = timed(
            lambda lens=lens, keep=keep: kv.store_tiles(stage_k, stage_v, cache, src, lens,
                                                        slot, keep),
            reps)
    # Whether this overlay's store left the null block alone when its tiles had 0 rows.
    cache[0] = 0xFF
    kv.store_tiles(stage_k, stage_v, cache, src, placeholders, slot, none)
    row["null_block_untouched"] = bool((cache[0] == 0xFF).all())
    print(json.dumps(row), flush=True)
    return row


def print_store(rows: list[dict[str, Any]]) -> None:
    print("| overlay | seats | tiles | no tile_keep µs | tile_keep zeros µs | every tile lost µs "
          "| zeros, null tiles of 0 rows µs | null block untouched |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['overlay']} | {r['seats']} | {r['tiles']} | {r['no_keep_us']:.1f} | "
              f"{r['keep_zero_us']:.1f} | {r['all_lost_us']:.1f} | "
              f"{r['keep_zero_null_skipped_us']:.1f} | {r['null_block_untouched']} |")


# The segment count the KVARN backend launches for decode and verify (kvarn_attn.py's
# SPLIT_SEGMENTS in the kvarn-backend overlay).
SERVED_SEGMENTS = 32


def print_seats(rows: list[dict[str, Any]]) -> None:
    print("| seats | context | long seat | q | segments | µs | / 32 segments | workspace MiB | "
          "max rel diff |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['seats']} | {r['context']:,} | {r['long_context']:,} | {r['q']} | "
              f"{r['segments']} | "
              f"{r['kvarn_us']:.1f} | {r['over_served_segments']:.2f} | "
              f"{r['workspace_bytes'] / 2**20:.1f} | {r['max_rel_diff_vs_served']:.1e} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--contexts", default="16384,65536,131072,262144")
    p.add_argument("--queries", default="1,8")
    p.add_argument("--budget", type=float, default=150.0,
                   help="seconds: contexts not started by then are listed as skipped")
    p.add_argument("--json", type=Path)
    p.add_argument("--stock", action="store_true",
                   help="also time vLLM's unified_attention over bf16 and fp8 paged caches")
    p.add_argument("--tree", type=Path, default=None,
                   help="a directory holding vLLM's python tree (vllm/), for --stock")
    p.add_argument("--smoke", action="store_true",
                   help="run on the CPU under TRITON_INTERPRET=1 (set it) at the given contexts")
    p.add_argument("--seats", default="",
                   help="comma list: time that many requests decoding together instead")
    p.add_argument("--seat-contexts", default="4096,16384",
                   help="with --seats: each request's context")
    p.add_argument("--segments", default="1,2,4,8,16,32",
                   help="with --seats: the split-KV segment counts to time")
    p.add_argument("--store-seats", default="",
                   help="comma list: time one decode step's store for that many seats instead")
    p.add_argument("--also-overlay", type=Path, action="append", default=[],
                   help="with --store-seats: another kvarn.py to time beside this tree's "
                        "(e.g. an earlier commit's, from git show)")
    p.add_argument("--seat-long", type=int, default=0,
                   help="with --seats: seat 0 reads this many tokens instead (a mixed batch)")
    args = p.parse_args()
    global DEVICE
    if args.smoke:
        DEVICE = "cpu"
    elif not torch.cuda.is_available():
        raise SystemExit("kvarn_attn.py needs a CUDA GPU")
    import triton

    kv = load_kvarn()
    if args.smoke and args.stock:
        # The interpreter's bf16 dots are wrong without it, and unified_attention makes them.
        sys.path.insert(0, str(HERE.parent))
        from tests.support.spec_decode_ref import fix_interpreter_bf16_dot

        fix_interpreter_bf16_dot()
    stock = Stock(args.tree) if args.stock else None
    gen = torch.Generator().manual_seed(0)
    queries = [int(x) for x in args.queries.split(",")]
    started = time.monotonic()
    card = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu (interpreter)"
    if args.store_seats:
        overlays = [("tree", kv)] + [
            (path.name, load_kvarn(path, f"_bench_kvarn_{i}"))
            for i, path in enumerate(args.also_overlay)]
        reps = 3 if args.smoke else 50
        store_rows = [store_cell(mod, name, int(n), gen, reps)
                      for n in args.store_seats.split(",") for name, mod in overlays]
        if args.json:
            args.json.write_text(json.dumps(
                {"card": card, "torch": torch.__version__, "triton": triton.__version__,
                 "store_rows": store_rows}, indent=2) + "\n")
        print_store(store_rows)
        return 0
    if args.seats:
        seat_rows: list[dict[str, Any]] = []
        seat_skipped: list[str] = []
        for seats in (int(x) for x in args.seats.split(",")):
            for ctx in (int(x) for x in args.seat_contexts.split(",")):
                if time.monotonic() - started > args.budget:
                    seat_skipped.append(f"{seats}x{ctx}")
                    continue
                seat_rows.extend(seats_cell(kv, seats, ctx, queries,
                                            [int(x) for x in args.segments.split(",")], gen,
                                            args.seat_long))
        if args.json:
            args.json.write_text(json.dumps(
                {"card": card, "torch": torch.__version__, "triton": triton.__version__,
                 "seats_rows": seat_rows, "skipped": seat_skipped}, indent=2) + "\n")
        print_seats(seat_rows)
        return 0
    rows: list[dict[str, Any]] = []
    skipped: list[int] = []
    for ctx in (int(x) for x in args.contexts.split(",")):
        if time.monotonic() - started > args.budget:
            skipped.append(ctx)
            continue
        rows.extend(cell(kv, ctx, queries, gen, stock))
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
    if any("stock_fp8_us" in r for r in rows):
        print("\n| context | q | kvarn µs | stock bf16 µs | stock fp8 µs | kvarn / fp8 | "
              "fp8 / bf16 | rel err kvarn / fp8 / bf16 |")
        print("|---:|---:|---:|---:|---:|---:|---:|---|")
        for r in rows:
            print(f"| {r['context']:,} | {r['q']} | {r['kvarn_us']:.1f} | "
                  f"{r['stock_bf16_us']:.1f} | {r['stock_fp8_us']:.1f} | "
                  f"{r['kvarn_over_stock_fp8']:.2f} | "
                  f"{r['stock_fp8_us'] / r['stock_bf16_us']:.2f} | "
                  f"{r['rel_err_vs_unquantized']:.3f} / {r['stock_fp8_rel_err']:.3f} / "
                  f"{r['stock_bf16_rel_err']:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
