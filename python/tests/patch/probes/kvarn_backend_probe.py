"""Probe for kvarn-backend: vLLM's backend selection for ``--kv-cache-dtype kvarn_k4v2_g128``,
and the KVARN backend's own builder and forward driven over a token stream.

Sections (each reports the exception text where the tree refuses):
- ``selector``: ``get_attn_backend`` on this (CPU) platform for kvarn and auto; CUDA's candidate
  list (``CudaPlatformBase.get_valid_backends``, no GPU needed) on sm86 and sm90 for kvarn,
  auto and fp8: the valid backends and what each refused kvarn for.
- ``stream``: with ``argv[1]`` a file to write, the backend over the steps of ``STEPS`` on
  ``argv[2]`` (default cpu: the Triton interpreter, TRITON_INTERPRET=1 in the environment;
  cuda: the compiled kernels, for the GPU tier): each step builds the
  metadata with the real builder from a CommonAttentionMetadata and runs forward for one
  layer; the file gets the inputs, each step's outputs and a copy of the cache after it,
  and (``starved``) a lost open tile rebuilt from the cache on the same device.
- ``freed``: the builder alone; a closed tile's entry is reused before an unscheduled
  request's.
- ``drafter``: the builder alone, called as vLLM 0.28.0's MTP proposer calls a drafter's
  (``build_for_drafting``: three passes a step, the later two at guessed positions) while a
  decode crosses a tile boundary.
- ``drafter_seats``: the same at three busy seats over seeded schedules, where pass 0 ends on
  a tile boundary and the later passes claim a third tile.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from _result import report

DTYPE = "kvarn_k4v2_g128"
KV_HEADS, HEADS, HEAD_SIZE = 2, 4, 64
BLOCK = 256  # two tiles a block
NUM_BLOCKS = 14
MAX_NUM_SEQS = 4
# One step = {request: (first new position, new tokens)}; a request's first step starts at 0,
# its blocks go back to the pool after its last step.
# "a": a 250-token prompt (tile 0 full, tile 1 open at 122 rows), then decodes across 256.
# "b": a 126-token prompt, a verify step crossing 128 (126..129), rolled back to 127 (only
#   one token accepted: tile 0 must still hold its exact rows), then decodes; it is left
#   unscheduled for one step while "c" and "d" open four tiles, and then continues its open
#   tile (entries are reused least recently claimed first).
# "c" and "d" arrive after "a" has finished (they reuse entries it left): "c" with a 300-token
#   prompt (tile 1 quantized straight from the chunk), "d" with 200.
STEPS: list[dict[str, tuple[int, int]]] = [
    {"a": (0, 250), "b": (0, 126)},
    {"a": (250, 1), "b": (126, 4)},
    {"a": (251, 1), "b": (127, 4)},
    *({"a": (252 + i, 1), "b": (131 + i, 1)} for i in range(6)),
    {"b": (137, 1)},
    {"c": (0, 300), "d": (0, 200)},
    {"b": (138, 1), "c": (300, 1), "d": (200, 1)},
]


def attempt(fn: Callable[[], Any]) -> dict[str, Any]:
    try:
        return {"ok": fn()}
    except BaseException as e:
        return {"error": f"{type(e).__name__}: {e}"}


def selector_section() -> dict[str, Any]:
    import types

    import torch

    # cuda.py imports the CUDA build's extension at the top; the CPU build has none, and the
    # candidate list below never calls into it.
    sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.platforms.cuda import CudaPlatformBase
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.selector import AttentionSelectorConfig, get_attn_backend

    def choose(kv_cache_dtype: str) -> Callable[[], str]:
        def run() -> str:
            with set_current_vllm_config(VllmConfig()):
                return str(get_attn_backend(256, torch.bfloat16, kv_cache_dtype).get_name())
        return run

    def cuda(major: int, minor: int, kv_cache_dtype: str) -> Callable[[], dict[str, Any]]:
        def run() -> dict[str, Any]:
            config = AttentionSelectorConfig(
                head_size=256, dtype=torch.bfloat16, kv_cache_dtype=kv_cache_dtype,  # type: ignore[arg-type]
                block_size=None)
            valid, invalid = CudaPlatformBase.get_valid_backends(
                DeviceCapability(major, minor), config, num_heads=24)
            return {"valid": [c.backend.name for c in sorted(valid, key=lambda c: c.priority)],
                    "invalid": {b.name: r for b, (_, r) in invalid.items()}}
        return run

    out: dict[str, Any] = {"kvarn": attempt(choose(DTYPE)), "auto": attempt(choose("auto"))}
    for major, minor in ((8, 6), (9, 0)):
        for dtype in (DTYPE, "auto", "fp8"):
            out[f"cuda_sm{major}{minor}_{dtype}"] = attempt(cuda(major, minor, dtype))
    return out


def stream_section(path: str, device_name: str) -> dict[str, Any]:
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.v1.attention.backends.kvarn_attn import KVarNAttentionBackend
    from vllm.v1.attention.ops import kvarn
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVQuantMode

    device = torch.device(device_name)
    gen = torch.Generator().manual_seed(0)
    offset = {r: 2.0 * torch.randn(1, KV_HEADS, HEAD_SIZE, generator=gen)
              for s in STEPS for r in s}

    def key_rows(r: str, n: int) -> torch.Tensor:
        """Key-like rows: the request's per-channel offset and three outlier channels."""
        k = torch.randn(n, KV_HEADS, HEAD_SIZE, generator=gen) + offset[r]
        k[..., :3] *= 12.0
        return k.to(torch.bfloat16)

    # Fresh rows every step, so a rolled-back position is written with new K/V.
    keys = [{r: key_rows(r, n) for r, (_, n) in s.items()} for s in STEPS]
    values = [{r: torch.randn(n, KV_HEADS, HEAD_SIZE, generator=gen).to(torch.bfloat16)
               for r, (_, n) in s.items()} for s in STEPS]
    queries = [{r: torch.randn(n, HEADS, HEAD_SIZE, generator=gen).to(torch.bfloat16)
                for r, (_, n) in s.items()} for s in STEPS]

    config = VllmConfig()
    config.scheduler_config.max_num_seqs = MAX_NUM_SEQS
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=HEAD_SIZE,
                             dtype=torch.uint8, kv_quant_mode=KVQuantMode["KVARN_K4V2_G128"])
    with set_current_vllm_config(config):
        backend = KVarNAttentionBackend
        builder = backend.get_builder_cls()(spec, ["layer.0"], config, device)
        impl = backend.get_impl_cls()(HEADS, HEAD_SIZE, HEAD_SIZE ** -0.5, KV_HEADS,
                                      kv_cache_dtype=DTYPE)
    cache = torch.full(backend.get_kv_cache_shape(NUM_BLOCKS, BLOCK, KV_HEADS, HEAD_SIZE),
                       0xFF, dtype=torch.uint8, device=device)
    # Block 0 is vLLM's null block; the others are handed out out of order.
    free = torch.randperm(NUM_BLOCKS - 1, generator=gen).add(1).tolist()
    owned: dict[str, list[int]] = {}
    record: dict[str, Any] = {"steps": STEPS, "keys": keys, "values": values,
                              "queries": queries, "outputs": [], "caches": [],
                              "block_tables": [], "block": BLOCK, "device": str(device)}
    last = {r: i for i, s in enumerate(STEPS) for r in s}
    for step, batch in enumerate(STEPS):
        for r in list(owned):
            if last[r] < step:  # finished: its blocks go back to the pool
                free.extend(owned.pop(r))
        reqs = list(batch)
        for r in reqs:
            blocks = owned.setdefault(r, [])
            while len(blocks) * BLOCK < sum(batch[r]):
                blocks.append(free.pop(0))
        cam = common_metadata(batch, owned, device)
        tokens = cam.num_actual_tokens
        md = builder.build(0, cam)
        key = torch.cat([keys[step][r] for r in reqs]).to(device)
        value = torch.cat([values[step][r] for r in reqs]).to(device)
        query = torch.cat([queries[step][r] for r in reqs]).to(device)
        output = torch.full((tokens, HEADS * HEAD_SIZE), float("nan"), device=device)
        impl.forward(None, query.view(tokens, -1), key.reshape(tokens, -1),  # type: ignore[arg-type]
                     value.reshape(tokens, -1), cache, md, output)
        record["outputs"].append(output.view(tokens, HEADS, HEAD_SIZE).cpu())
        record["caches"].append(cache.to("cpu", copy=True))  # a snapshot, also on the CPU
        record["block_tables"].append({r: list(owned[r]) for r in reqs})
    # The lost-tile rebuild on the same device (the GPU record carries it).
    record["starved"] = attempt(lambda: starved_section(device_name))
    torch.save(record, path)
    return {"steps": len(STEPS), "tile_bytes": kvarn.head_tile_bytes(HEAD_SIZE),
            "staging_rows": int(impl.stage_k.shape[0]), "entries": builder.entries,
            "lost_tiles": int(builder.lost_tiles)}


def common_metadata(batch: dict[str, tuple[int, int]], blocks: dict[str, list[int]],
                    device: Any = "cpu") -> Any:
    """The runner's metadata for one step: ``batch`` maps each request to (cached tokens, new
    tokens), ``blocks`` to its block ids (rows padded with the null block 0)."""
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata

    reqs = list(batch)
    q_lens = [batch[r][1] for r in reqs]
    seq_lens = torch.tensor([sum(batch[r]) for r in reqs], dtype=torch.int32)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    table = torch.zeros(len(reqs), max(len(blocks[r]) for r in reqs), dtype=torch.int32)
    for i, r in enumerate(reqs):
        table[i, :len(blocks[r])] = torch.tensor(blocks[r], dtype=torch.int32)
    tokens = int(qsl[-1])
    return CommonAttentionMetadata(
        query_start_loc=qsl.to(device), query_start_loc_cpu=qsl.clone(),
        seq_lens=seq_lens.to(device), num_reqs=len(reqs), num_actual_tokens=tokens,
        max_query_len=max(q_lens), max_seq_len=int(seq_lens.max()),
        block_table_tensor=table.to(device),
        slot_mapping=torch.zeros(tokens, dtype=torch.int64, device=device))


def starved_section(device_name: str = "cpu") -> dict[str, Any]:
    """The backend at max_num_seqs 1 (2 entries), one request a step (on the CPU: the
    interpreter):
    "p" keeps a tile open, is left unscheduled while "q"'s prompt opens two tiles (taking both
    entries, p's the least recently claimed), then continues its tile. Its exact rows are
    gone: the builder counts the tile lost and the store rebuilds its earlier rows from the
    cache (kvarn_attn.py's documented limit). Reports p's rows and its tile's dequantized
    rows after the last step, what the staging entry held before it (q's rows), and the
    builder's warnings (checked every build: LOST_REPORT_S 0)."""
    import logging

    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.v1.attention.backends import kvarn_attn
    from vllm.v1.attention.backends.kvarn_attn import KVarNAttentionBackend
    from vllm.v1.attention.ops import kvarn
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVQuantMode

    warnings: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())

    kvarn_attn.logger.addHandler(Keep())
    kvarn_attn.LOST_REPORT_S = 0.0
    config = VllmConfig()
    config.scheduler_config.max_num_seqs = 1
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=HEAD_SIZE,
                             dtype=torch.uint8, kv_quant_mode=KVQuantMode["KVARN_K4V2_G128"])
    with set_current_vllm_config(config):
        builder = KVarNAttentionBackend.get_builder_cls()(spec, ["layer.0"], config,
                                                          torch.device(device_name))
        impl = KVarNAttentionBackend.get_impl_cls()(HEADS, HEAD_SIZE, HEAD_SIZE ** -0.5,
                                                     KV_HEADS, kv_cache_dtype=DTYPE)
    cache = torch.full(KVarNAttentionBackend.get_kv_cache_shape(5, BLOCK, KV_HEADS, HEAD_SIZE),
                       0xFF, dtype=torch.uint8, device=device_name)
    gen = torch.Generator().manual_seed(1)
    blocks = {"p": [1], "q": [2]}
    rows: dict[str, list[torch.Tensor]] = {"p": [], "q": []}
    lost = []
    steps = ({"p": (0, 100)}, {"p": (100, 1)}, {"q": (0, 130)}, {"p": (101, 1)})
    for batch in steps:
        (r, (_, n)), = batch.items()
        k = (torch.randn(n, KV_HEADS, HEAD_SIZE, generator=gen) + 1.0).to(torch.bfloat16)
        v = torch.randn(n, KV_HEADS, HEAD_SIZE, generator=gen).to(torch.bfloat16)
        rows[r].append(torch.stack([k, v]))
        md = builder.build(0, common_metadata(batch, blocks, device_name))
        out = torch.empty(n, HEADS * HEAD_SIZE, device=device_name)
        q = torch.randn(n, HEADS * HEAD_SIZE, generator=gen).to(torch.bfloat16)
        impl.forward(None, q.to(device_name), k.reshape(n, -1).to(device_name),  # type: ignore[arg-type]
                     v.reshape(n, -1).to(device_name), cache, md, out)
        lost.append(int(builder.lost_tiles))
    if device_name == "cuda":  # the last check's copy has landed: the next one reads it
        torch.cuda.synchronize()
        builder._report_lost()
    # [2 (k, v), rows, heads, D]: p's 102 rows and q's first 128 (what p's entry held).
    return {"entries": builder.entries, "lost_after_step": lost, "warnings": warnings,
            "p_rows": torch.cat(rows["p"], 1).float().tolist(),
            "q_rows": rows["q"][0][:, :kvarn.TILE_TOKENS].float().tolist(),
            "p_tile": cache[1, 0].cpu().tolist()}


def lone_builder(max_num_seqs: int, layer: str) -> Any:
    """The KVARN metadata builder alone on the CPU, for ``max_num_seqs`` seats."""
    import torch
    from vllm.config import VllmConfig
    from vllm.v1.attention.backends.kvarn_attn import KVarNMetadataBuilder
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVQuantMode

    config = VllmConfig()
    config.scheduler_config.max_num_seqs = max_num_seqs
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=HEAD_SIZE,
                             dtype=torch.uint8, kv_quant_mode=KVQuantMode["KVARN_K4V2_G128"])
    return KVarNMetadataBuilder(spec, [layer], config, torch.device("cpu"))


def freed_section() -> dict[str, Any]:
    """The builder alone at max_num_seqs 2 (4 entries): "p" keeps a tile open and is left
    unscheduled while "r"'s prompt, in 100-token chunks, opens four tiles. Each chunk closes
    the tile before it for good, and its entry is freed and reused first; least recently
    claimed alone would hand r p's entry at the fourth tile."""
    builder = lone_builder(2, "layer.0")
    blocks = {"p": [1], "r": [2, 3]}
    lost = []
    for batch in ({"p": (0, 100)}, {"r": (0, 100)}, {"r": (100, 100)}, {"r": (200, 100)},
                  {"r": (300, 100)}, {"p": (100, 1)}):
        builder.build(0, common_metadata(batch, blocks))
        lost.append(int(builder.lost_tiles))
    return {"entries": builder.entries, "lost_after_step": lost}


def drafter_section() -> dict[str, Any]:
    """The builder alone at max_num_seqs 2 (4 entries), driven as vLLM 0.28.0's MTP proposer
    (three draft tokens, padded drafter batch) drives a drafter's: a step's first pass
    (``draft_index`` 0) covers the verified positions from the accepted length on, its later
    two passes one guessed position each (seq_lens cut to the accepted length, then + 1 a
    pass). "d" prefills 250 tokens, then decodes with no draft accepted (the random heads of
    the GPU lives), so each step advances one position; at 254 the last pass sits at 256, in
    the next tile, while the next step continues tile 1 at 255."""
    builder = lone_builder(2, "mtp.layers.0.attn")
    blocks = {"d": [1, 2]}
    passes = [[(0, 250), (250, 1), (251, 1)]]
    passes += [[(p, 4), (p + 1, 1), (p + 2, 1)] for p in range(250, 259)]
    lost = []
    for step in passes:
        for index, batch in enumerate(step):
            builder.build_for_drafting(common_metadata({"d": batch}, blocks), index)
        lost.append(int(builder.lost_tiles))
    return {"entries": builder.entries, "first_positions": [s[0][0] for s in passes],
            "lost_after_step": lost}


def drafter_seats_section() -> dict[str, Any]:
    """The builder alone at CTX=huge's three seats, every seat in every step, driven as the
    MTP proposer drives a drafter's (pass 0 over the step's positions, two later passes from
    the accepted length L on): seeded schedules of chunked prompts (chunks of 100 to 256,
    many ending on a tile boundary) then decodes accepting 0 to 3 drafts. A step whose pass 0
    spans two tiles and whose L opens the next one claims a third tile for the seat
    (``third_claims``). The next step continues the tile holding L, which pass 1 claims, so no
    tile is lost at two entries a seat, even where a later pass takes an entry pass 0 claimed
    (``taken_in_step``); the same schedules at one entry a seat lose tiles, which shows they
    fill the table."""
    import random

    from vllm.v1.attention.backends import kvarn_attn

    tile = kvarn_attn.TILE
    seats = [f"s{i}" for i in range(3)]

    def drive(seed: int) -> tuple[int, int, int]:
        builder = lone_builder(len(seats), "mtp.layers.0.attn")
        rng = random.Random(seed)
        blocks = {s: list(range(1 + 7 * i, 8 + 7 * i)) for i, s in enumerate(seats)}
        prompt = {s: rng.choice([200, 256, 300, 384]) for s in seats}
        start = dict.fromkeys(seats, 0)
        third = taken = 0
        for _ in range(80):
            passes: list[dict[str, tuple[int, int]]] = [{}, {}, {}]
            for s in seats:
                first = start[s]
                if first < prompt[s]:
                    n = min(prompt[s] - first, rng.choice([100, 128, 156, 228, 256]))
                    accepted = first + n
                else:
                    n, accepted = 4, first + 1 + rng.randint(0, 3)
                passes[0][s] = (first, n)
                passes[1][s] = (accepted, 1)
                passes[2][s] = (accepted + 1, 1)
                spans = first // tile != (first + n - 1) // tile
                third += spans and accepted // tile > (first + n - 1) // tile
                start[s] = accepted
            order = seats if rng.random() < 0.5 else seats[::-1]
            for index, batch in enumerate(passes):
                builder.build_for_drafting(
                    common_metadata({s: batch[s] for s in order}, blocks), index)
                if index == 0:
                    keys = builder._keys.clone()
                    fresh = builder._stamp == builder._step
            # Entries pass 0 claimed that a later pass handed to another tile.
            taken += int((fresh & (keys >= 0) & (builder._keys != keys)).sum())
        return int(builder.lost_tiles), third, taken

    seeds = range(6)
    runs = [drive(seed) for seed in seeds]
    per_seat = kvarn_attn.STAGE_ENTRIES_PER_SEQ
    kvarn_attn.STAGE_ENTRIES_PER_SEQ = 1
    try:
        lost_one = [drive(seed)[0] for seed in seeds]
    finally:
        kvarn_attn.STAGE_ENTRIES_PER_SEQ = per_seat
    return {"entries_a_seat": per_seat, "lost": [run[0] for run in runs],
            "third_claims": [run[1] for run in runs],
            "taken_in_step": [run[2] for run in runs], "lost_at_one_a_seat": lost_one}


def main() -> None:
    result: dict[str, Any] = {"selector": selector_section(),
                              "freed": attempt(freed_section),
                              "drafter": attempt(drafter_section),
                              "drafter_seats": attempt(drafter_seats_section)}
    if len(sys.argv) > 1:
        device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
        result["stream"] = attempt(lambda: stream_section(sys.argv[1], device))
    report(result)


if __name__ == "__main__":
    main()
