# SPDX-License-Identifier: Apache-2.0
# qwen3090 patch kvarn-backend: the KVarN attention backend (issue 24) over the
# tiles of vllm/v1/attention/ops/kvarn.py (--kv-cache-dtype kvarn_k4v2_g128).
#
# Store then attend. Each forward first writes this step's K/V into the
# cache, then runs kvarn's split-KV attention over the cache for every query
# (decode, verify and prefill chunks alike: the kernel is causal within a
# request's queries), so there is one attention path and it reads only tiles.
#
# The open tile. store_tiles quantizes a tile from its full-precision rows, and
# a request's last tile fills over many steps. Its rows are kept at full
# precision in a per-layer staging buffer of E entries x 128 rows (E =
# STAGE_ENTRIES_PER_SEQ x max_num_seqs, plus one scratch entry), and the open
# tile is re-quantized whole from them whenever it grows: the cache always
# holds exactly what quantizing the rows so far gives, and a tile that closes
# is quantized from all its 128 exact rows. Tiles a prefill chunk covers whole
# are quantized straight from the chunk and never staged.
#
# Entries are keyed by the tile's physical slot (block id x tiles per block +
# tile), not by request: vLLM hands the backend no request identity, and a
# tile that is still filling sits in a block only its request owns (prefix
# caching shares full blocks only). A step touches at most two tiles of a
# request that need their rows later: the tile holding its first new position
# (continued) and the tile holding its last (opened). A verify step can cross
# a tile boundary and then be rolled back, so the first tile keeps its entry
# while the request's first new position is still in it; the tile before it is
# closed for good, so its entry is freed (only on a step whose first new
# position is settled: a drafter's later passes sit at guessed positions, and
# one past a tile boundary would free the request's open tile, as the MTP life
# at the 27B's widths showed). Freed entries are reused first, then
# the least recently claimed, so an entry survives a request that goes
# unscheduled for a few steps. One that did not is no longer garbage: the
# store restores the tile's earlier rows from what the cache holds for them
# (lossy: their exact values are gone) before it re-quantizes the tile
# (python/docs/kvarn.md, "the open tile").
#
# The builder resolves the entries once a step for every layer of its group
# with fixed-shape tensor ops (no host sync); forward allocates nothing: the
# staging buffers and the split partials are allocated once, at model
# construction, where vLLM's memory profiler counts them with the weights
# (gotcha 17). The split partials are sized by the queries a seat can bring
# (one, plus the drafts it verifies), not the most a verify step may hold.
# Segment counts do not depend on the context (decode/verify: SPLIT_SEGMENTS,
# halved only when a step's partials would not fit; prefill: one) and are
# runtime arguments, so no context length reaches a compile-time constant
# (gotcha 45).

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch

from vllm.config import get_current_vllm_config
from vllm.config.cache import CacheDType
from vllm.logger import init_logger
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionLayer,
    AttentionMetadata,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.attention.ops import kvarn
from vllm.v1.kv_cache_interface import AttentionSpec

logger = init_logger(__name__)

TILE = kvarn.TILE_TOKENS
# Staging entries per max_num_seqs: the two tiles a step touches per request
# (the second only while a verify step that crossed a tile may roll back).
STAGE_ENTRIES_PER_SEQ = 2
# Queries per request up to which a batch takes the split (decode/verify)
# plan; a longer query is a prefill chunk and takes one segment per query
# tile, its parallelism coming from the query tiles.
SPLIT_QUERY_MAX = 16
SPLIT_SEGMENTS = 32
_NEVER_STAMP = torch.iinfo(torch.int64).max
# Seconds between the builder's reads of lost_tiles: a copy to host memory made
# at one check is read at the next, so no step waits for the GPU. Short, so that
# a loss near a server's end is still logged (a copy and an event a check).
LOST_REPORT_S = 5.0


def stage_entries(max_num_seqs: int) -> int:
    return STAGE_ENTRIES_PER_SEQ * max_num_seqs


def split_queries(num_speculative_tokens: int) -> int:
    """The most queries a request brings to a split (decode/verify) step: the token it
    samples and the drafts it verifies, capped where a step becomes a prefill chunk."""
    return min(1 + num_speculative_tokens, SPLIT_QUERY_MAX)


def workspace_rows(max_num_seqs: int, max_num_batched_tokens: int,
                   num_speculative_tokens: int) -> int:
    """Rows (one per query token and segment) of the split partials: every seat's split
    step at SPLIT_SEGMENTS segments, or a whole batch's tokens at one segment. Sized by
    what a seat can ask (a batch with no speculator verifies nothing), not by fewer
    segments: a long request among short ones needs all of them (python/docs/kvarn.md)."""
    split = max_num_seqs * split_queries(num_speculative_tokens) * SPLIT_SEGMENTS
    return max(split, max_num_batched_tokens)


def segments_for(tokens: int, rows: int) -> int:
    """SPLIT_SEGMENTS, halved until a step's partials fit the rows (a short prefill
    chunk beside a full batch). The count is not a compile-time constant."""
    segments = SPLIT_SEGMENTS
    while segments > 1 and tokens * segments > rows:
        segments //= 2
    return segments


class KVarNAttentionBackend(AttentionBackend):
    """Attention over kvarn_k4v2_g128 tiles; the only backend that reads them."""

    accept_output_buffer: bool = True
    forward_includes_kv_cache_update: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = [
        cast(CacheDType, kvarn.CACHE_DTYPE)]

    @staticmethod
    def get_name() -> str:
        return "KVARN"

    @staticmethod
    def get_impl_cls() -> type[KVarNAttentionImpl]:
        return KVarNAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[KVarNMetadataBuilder]:
        return KVarNMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        cache_dtype_str: str = kvarn.CACHE_DTYPE,
    ) -> tuple[int, ...]:
        # uint8 [blocks, tiles, kv heads, head tile bytes]: exactly the
        # spec's page_bytes per block (kvarn-cache-spec.patch).
        return kvarn.cache_shape(num_blocks, block_size, num_kv_heads, head_size)

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[int | MultipleOf]:
        return [MultipleOf(TILE)]

    @classmethod
    def supports_kv_cache_dtype(cls, kv_cache_dtype: CacheDType | None) -> bool:
        return kv_cache_dtype == kvarn.CACHE_DTYPE

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        # The Hadamard rotation and the 2-bit packing (kvarn.HeadTileLayout).
        return head_size >= 64 and head_size & (head_size - 1) == 0

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER


@dataclass
class KVarNMetadata(AttentionMetadata):
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor  # int32 [reqs + 1]
    seq_lens: torch.Tensor  # int32 [reqs]: context including this step
    block_table: torch.Tensor  # int32 [reqs, blocks]
    # Staging row of each new token ([num_actual_tokens]); tokens of tiles
    # quantized straight from the chunk go to the scratch entry.
    stage_dst: torch.Tensor  # int64
    # Two tiles a request re-quantized from staging (store_tiles arguments);
    # a request without a second tile has a 0-row placeholder, skipped.
    staged_src: torch.Tensor  # int32
    staged_len: torch.Tensor  # int32
    staged_slot: torch.Tensor  # int64
    # Rows of each staged tile restored from the cache first (its entry was lost).
    staged_keep: torch.Tensor  # int32
    # Tiles a prefill chunk covers whole, quantized from the chunk's rows.
    direct_src: torch.Tensor  # int32
    direct_len: torch.Tensor  # int32
    direct_slot: torch.Tensor  # int64


class KVarNMetadataBuilder(AttentionMetadataBuilder[KVarNMetadata]):
    """Attention metadata plus this step's staging entries and tile lists.

    No CUDA graph of the attention itself yet (PIECEWISE graphs leave it
    eager): the derived tensors are fresh each step, not persistent buffers.
    """

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names: list[str],
                 vllm_config: Any, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.tiles_per_block = kv_cache_spec.block_size // TILE
        entries = stage_entries(vllm_config.scheduler_config.max_num_seqs)
        self.entries = entries
        # Named in the lost-tile warning: the target's group or a drafter's.
        self._layers = ", ".join(layer_names[:2]) + (", ..." if len(layer_names) > 2 else "")
        # Entry `entries` is the scratch entry: never keyed, never handed out.
        self._keys = torch.full((entries + 1,), -1, dtype=torch.int64, device=device)
        self._stamp = torch.zeros(entries + 1, dtype=torch.int64, device=device)
        self._stamp[entries] = _NEVER_STAMP
        # Rows each entry holds for its tile after the last step it was claimed.
        self._rows = torch.zeros(entries + 1, dtype=torch.int64, device=device)
        self._step = 0
        # Continued tiles whose exact rows were gone (an entry reused while its
        # request was unscheduled): their earlier rows restored from the cache.
        # It should stay 0; _report_lost warns when it grows.
        self.lost_tiles = torch.zeros((), dtype=torch.int64, device=device)
        self._lost_seen = 0
        self._lost_next = time.monotonic() + LOST_REPORT_S
        self._lost_event: Any = None
        if device.type == "cuda":
            self._lost_host = torch.zeros((), dtype=torch.int64, pin_memory=True)
            self._lost_event = cast(Any, torch.cuda).Event()  # untyped in torch

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> KVarNMetadata:
        return self._build(common_attn_metadata, settled=True)

    def build_for_drafting(self, common_attn_metadata: CommonAttentionMetadata,
                           draft_index: int) -> KVarNMetadata:
        # A drafter's first pass starts at the accepted length; each later pass
        # one guessed token further, which the next step may roll back.
        return self._build(common_attn_metadata, settled=draft_index == 0)

    def _build(self, cam: CommonAttentionMetadata, settled: bool) -> KVarNMetadata:
        reqs = cam.num_reqs
        tokens = cam.num_actual_tokens
        qsl = cam.query_start_loc[:reqs + 1].long()
        end = cam.seq_lens[:reqs].long()
        q_len = qsl[1:] - qsl[:-1]
        pre = end - q_len
        live = q_len > 0
        tile_a = torch.where(live, pre // TILE, 0)
        tile_b = torch.where(live, (end - 1).clamp(min=0) // TILE, 0)
        table = cam.block_table_tensor[:reqs]

        def slot(tile: torch.Tensor, req: torch.Tensor | None = None) -> torch.Tensor:
            rows = table if req is None else table[req]
            col = (tile // self.tiles_per_block).clamp(max=table.shape[1] - 1)
            block = rows.gather(1, col[:, None]).squeeze(1).long()
            return block * self.tiles_per_block + tile % self.tiles_per_block

        two = tile_b != tile_a
        key_a = torch.where(live, slot(tile_a), -1)
        key_b = torch.where(live & two, slot(tile_b), -1)
        # The tile before a: every row of it is accepted, so nothing stages it
        # again; but only when a's first position is: past a guessed one, the
        # tile before may be the open tile the next step continues.
        closed = torch.where(live & (tile_a > 0) & settled,
                             slot((tile_a - 1).clamp(min=0)), -1)
        entry, found = self._claim(torch.stack([key_a, key_b], 1).reshape(-1), closed)
        entry = entry.view(reqs, 2)
        entry_a = entry[:, 0]
        entry_b = torch.where(two, entry[:, 1], entry_a)
        # Tile a continues: its first pre - start rows must be staged already.
        kept = pre - tile_a * TILE
        lost = live & (kept > 0) & (~found.view(reqs, 2)[:, 0] | (self._rows[entry_a] < kept))
        self.lost_tiles += lost.sum()
        self._report_lost()

        # New tokens of tile a or b go to their entry's row; others to scratch.
        # (searchsorted, not repeat_interleave: a token past the last query,
        # padding, finds no request and goes to scratch too.)
        token = torch.arange(tokens, device=qsl.device)
        req_of = torch.searchsorted(qsl[1:], token, right=True)
        in_req = req_of < reqs
        req_of = req_of.clamp(max=max(reqs - 1, 0))
        pos = pre[req_of] + token - qsl[req_of]
        tile = pos // TILE
        row = pos % TILE
        stage_dst = torch.where(
            in_req & (tile == tile_a[req_of]), entry_a[req_of] * TILE + row,
            torch.where(in_req & (tile == tile_b[req_of]), entry_b[req_of] * TILE + row,
                        self.entries * TILE))

        # Re-quantize tiles a and b from staging: their rows so far, this
        # step's included. A missing tile is a placeholder of 0 rows in the
        # null block, which the store skips (half a decode step's programs).
        len_a = torch.minimum(end, (tile_a + 1) * TILE) - tile_a * TILE
        len_b = end - tile_b * TILE
        null = torch.zeros_like(key_a)
        staged_src = torch.stack([torch.where(live, entry_a, self.entries),
                                  torch.where(live & two, entry_b, self.entries)], 1) * TILE
        staged_len = torch.stack([torch.where(live, len_a, 0),
                                  torch.where(live & two, len_b, 0)], 1)
        staged_slot = torch.stack([torch.where(live, key_a, null),
                                   torch.where(live & two, key_b, null)], 1)
        # A lost tile a is rebuilt from the cache's rows before its new ones.
        staged_keep = torch.stack([torch.where(lost, kept, 0), null], 1)
        self._rows.index_copy_(0, (staged_src // TILE).reshape(-1),
                               torch.where(staged_slot > 0, staged_len, 0).reshape(-1))
        self._rows[self.entries] = 0

        # Whole tiles strictly between a and b: at most q_len // 128 a request,
        # a bound the host knows exactly (query lengths are never optimistic).
        q_len_cpu = (cam.query_start_loc_cpu[1:reqs + 1]
                     - cam.query_start_loc_cpu[:reqs]).long()
        per_req = q_len_cpu // TILE
        n_direct = int(per_req.sum())
        if n_direct:
            d_req = torch.repeat_interleave(torch.arange(reqs), per_req).to(qsl.device)
            first = torch.cumsum(per_req, 0) - per_req
            d_k = (torch.arange(n_direct) - first.repeat_interleave(per_req)).to(qsl.device)
            d_tile = tile_a[d_req] + 1 + d_k
            ok = d_tile < tile_b[d_req]
            d_src = qsl[d_req] + d_tile * TILE - pre[d_req]
            direct_src = torch.where(ok, d_src, 0)
            direct_len = torch.where(ok, TILE, 0)
            direct_slot = torch.where(ok, slot(d_tile, d_req), 0)
        else:
            direct_src = direct_len = direct_slot = torch.zeros(
                0, dtype=torch.int64, device=qsl.device)

        return KVarNMetadata(
            num_actual_tokens=tokens,
            max_query_len=cam.max_query_len,
            max_seq_len=cam.max_seq_len,
            query_start_loc=cam.query_start_loc[:reqs + 1],
            seq_lens=cam.seq_lens[:reqs],
            block_table=table,
            stage_dst=stage_dst,
            staged_src=staged_src.reshape(-1).int(),
            staged_len=staged_len.reshape(-1).int(),
            staged_slot=staged_slot.reshape(-1),
            staged_keep=staged_keep.reshape(-1).int(),
            direct_src=direct_src.int(),
            direct_len=direct_len.int(),
            direct_slot=direct_slot.long(),
        )

    def _report_lost(self) -> None:
        """A warning when lost_tiles grew, checked at most every LOST_REPORT_S
        (on CUDA from the copy the previous check made)."""
        now = time.monotonic()
        # Never while a CUDA graph is captured: an event query there is an error.
        if now < self._lost_next or (self._lost_event is not None
                                     and torch.cuda.is_current_stream_capturing()):
            return
        self._lost_next = now + LOST_REPORT_S
        if self._lost_event is None:
            total = int(self.lost_tiles)
        else:
            total = int(self._lost_host) if self._lost_event.query() else self._lost_seen
            self._lost_host.copy_(self.lost_tiles, non_blocking=True)
            self._lost_event.record()
        if total > self._lost_seen:
            logger.warning(
                "KVARN: %d open tile(s) lost their staging rows (%d since start) in the "
                "builder of %s: a tile's entry (%d in all) was taken before its request "
                "continued it, so its earlier rows were rebuilt from the cache, quantized "
                "twice (python/docs/kvarn.md, the open tile).", total - self._lost_seen, total,
                self._layers, self.entries)
            self._lost_seen = total

    def _claim(self, keys: torch.Tensor,
               closed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Staging entry of each tile slot key (-1: none, the scratch entry), and
        whether the key already had one.

        Entries of the ``closed`` keys are freed first. A key already in the
        table keeps its entry; a new key takes a free entry, else the unclaimed
        entry claimed longest ago. Fixed-shape ops only: no sync."""
        self._step += 1
        dead = ((self._keys[None, :] == closed[:, None]) & (closed >= 0)[:, None]).any(0)
        self._keys.masked_fill_(dead, -1)
        self._stamp.masked_fill_(dead, 0)
        keyed = keys >= 0
        match = (self._keys[None, :] == keys[:, None]) & keyed[:, None]
        found = match.any(1)
        hit = match.to(torch.int32).argmax(1)
        claimed = match.any(0)
        need = keyed & ~found
        rank = (need.long().cumsum(0) - 1).clamp(min=0, max=self.entries - 1)
        order = torch.argsort(torch.where(claimed, _NEVER_STAMP, self._stamp), stable=True)
        scratch = torch.full_like(hit, self.entries)
        entry = torch.where(found, hit, torch.where(need, order[rank].to(hit.dtype), scratch))
        entry64 = entry.long()
        self._keys.index_copy_(0, entry64, torch.where(keyed, keys, -1))
        self._stamp.index_copy_(0, entry64, torch.full_like(keys, self._step))
        self._keys[self.entries] = -1
        self._stamp[self.entries] = _NEVER_STAMP
        return entry64, found


@dataclass
class _Workspace:
    acc: torch.Tensor  # fp32 flat: split partials
    ml: torch.Tensor  # fp32 flat: running (max, sum) pairs


_WORKSPACES: dict[tuple[str, int], _Workspace] = {}
# Layer shapes whose kernels this process has compiled (KVarNAttentionImpl._warm_kernels).
_WARMED: set[tuple[str, int, int, int, torch.dtype]] = set()


def _workspace(device: torch.device, floats: int, head_size: int) -> _Workspace:
    """One workspace per device and size, shared by every layer (they run in
    turn), allocated at model construction and never again."""
    key = (str(device), floats)
    if key not in _WORKSPACES:
        _WORKSPACES[key] = _Workspace(
            torch.empty(floats, dtype=torch.float32, device=device),
            torch.empty(floats // head_size * 2, dtype=torch.float32, device=device))
    return _WORKSPACES[key]


class KVarNAttentionImpl(AttentionImpl[KVarNMetadata]):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = kvarn.CACHE_DTYPE,
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        unsupported = {
            "alibi_slopes": alibi_slopes, "sliding_window": sliding_window,
            "logits_soft_cap": logits_soft_cap,
            "kv_sharing_target_layer_name": kv_sharing_target_layer_name,
            "sinks": kwargs.get("sinks"),
        }
        given = [name for name, value in unsupported.items() if value is not None]
        if given or attn_type != AttentionType.DECODER:
            raise ValueError(
                f"--kv-cache-dtype {kvarn.CACHE_DTYPE}: the KVARN backend serves causal "
                f"decoder attention without {', '.join(given) or attn_type}; this layer "
                "needs it, so serve the model with --kv-cache-dtype fp8")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype = kv_cache_dtype
        kvarn.HeadTileLayout(head_size)  # refuses a head size the layout cannot hold

        config = get_current_vllm_config()
        device = torch.device(config.device_config.device or "cpu")
        max_num_seqs = config.scheduler_config.max_num_seqs
        # The staging rows hold K/V as the model computes them.
        model_dtype = config.model_config.dtype if config.model_config else None
        dtype = model_dtype if isinstance(model_dtype, torch.dtype) else torch.bfloat16
        rows = (stage_entries(max_num_seqs) + 1) * TILE
        self.stage_k = torch.empty(rows, self.num_kv_heads, head_size, dtype=dtype,
                                   device=device)
        self.stage_v = torch.empty_like(self.stage_k)
        spec = config.speculative_config
        self.split_rows = workspace_rows(
            max_num_seqs, config.scheduler_config.max_num_batched_tokens,
            (spec.num_speculative_tokens or 0) if spec is not None else 0)
        self.workspace = _workspace(device, self.split_rows * num_heads * head_size,
                                    head_size)
        self._warm_kernels(device, dtype)

    def _warm_kernels(self, device: torch.device, dtype: torch.dtype) -> None:
        """Compile this layer shape's kernels now, at model construction, instead of
        on the first requests (gotcha 45: the profile run hands forward no metadata,
        so nothing else compiles them before serving). One scratch tile, one request:
        the store without and with restored rows, then the split pass's two query
        tilings (decode, and verify/prefill) and the reduce, with the arguments
        forward passes (the same dtypes, contiguity and per-shape strides), so
        Triton's specialisation keys match the later calls. Once per process and
        shape."""
        key = (str(device), self.num_heads, self.num_kv_heads, self.head_size, dtype)
        if device.type != "cuda" or key in _WARMED:
            return
        _WARMED.add(key)
        cache = torch.zeros(kvarn.cache_shape(1, TILE, self.num_kv_heads, self.head_size),
                            dtype=torch.uint8, device=device)

        def ints(*values: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        self.stage_k.zero_()
        self.stage_v.zero_()
        kvarn.store_tiles(self.stage_k, self.stage_v, cache, ints(0), ints(TILE),
                          ints(0, dtype=torch.int64))
        # forward's staged store: tile_keep given, so the restore kernel compiles too.
        kvarn.store_tiles(self.stage_k, self.stage_v, cache, ints(0), ints(TILE),
                          ints(0, dtype=torch.int64), ints(TILE // 2))
        for queries in (1, SPLIT_QUERY_MAX):
            md = KVarNMetadata(
                num_actual_tokens=queries, max_query_len=queries, max_seq_len=TILE,
                query_start_loc=ints(0, queries), seq_lens=ints(TILE),
                block_table=ints(0).view(1, 1),
                stage_dst=ints(0, dtype=torch.int64), staged_src=ints(0), staged_len=ints(1),
                staged_slot=ints(0, dtype=torch.int64), staged_keep=ints(0),
                direct_src=ints(), direct_len=ints(),
                direct_slot=ints(dtype=torch.int64))
            q = torch.zeros(queries, self.num_heads * self.head_size, dtype=dtype,
                            device=device)
            out = torch.empty_like(q)
            shape = (-1, self.num_heads, self.head_size)
            self._attend(q.view(shape), cache, md, out.view(shape))
        torch.cuda.synchronize(device)

    def forward(
        self,
        layer: AttentionLayer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: KVarNMetadata,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("KVARN: fused output quantization is not supported")
        if attn_metadata is None:  # profiling run
            return output.fill_(0)
        md = attn_metadata
        n = md.num_actual_tokens
        shape = (-1, self.num_kv_heads, self.head_size)
        key = key[:n].view(shape)
        value = value[:n].view(shape)
        self.stage_k.index_copy_(0, md.stage_dst, key.to(self.stage_k.dtype))
        self.stage_v.index_copy_(0, md.stage_dst, value.to(self.stage_v.dtype))
        kvarn.store_tiles(self.stage_k, self.stage_v, kv_cache, md.staged_src, md.staged_len,
                          md.staged_slot, md.staged_keep)
        if md.direct_src.numel():
            kvarn.store_tiles(key, value, kv_cache, md.direct_src, md.direct_len,
                              md.direct_slot)
        q = query[:n].view(-1, self.num_heads, self.head_size)
        out = output[:n].view(-1, self.num_heads, self.head_size)
        self._attend(q, kv_cache, md, out)
        return output

    def _attend(self, q: torch.Tensor, cache: torch.Tensor, md: KVarNMetadata,
                out: torch.Tensor) -> None:
        """kvarn.attention's two passes over this layer's preallocated partials."""
        tokens = q.shape[0]
        group = self.num_heads // self.num_kv_heads
        split = md.max_query_len <= SPLIT_QUERY_MAX
        plan = kvarn.plan_split(md.max_query_len, group, md.max_seq_len,
                                segments_for(tokens, self.split_rows) if split else 1)
        parts = tokens * self.num_heads * plan.num_segments
        part_acc = self.workspace.acc[:parts * self.head_size].view(
            tokens, self.num_heads, plan.num_segments, self.head_size)
        part_ml = self.workspace.ml[:parts * 2].view(
            tokens, self.num_heads, plan.num_segments, 2)
        lay = kvarn._layout_constexprs(self.head_size)
        reqs = md.seq_lens.shape[0]
        grid = (reqs * plan.q_tiles, self.num_kv_heads, plan.num_segments)
        kvarn._kvarn_split_kernel[grid](
            q, cache, cache.view(torch.float16), md.block_table, md.seq_lens,
            md.query_start_loc, part_acc, part_ml, self.scale * math.log2(math.e),
            plan.q_tiles, plan.num_segments, cache.shape[1],
            q.stride(0), q.stride(1), md.block_table.stride(0),
            cache.stride(0), cache.stride(1), cache.stride(2),
            NUM_HEADS=self.num_heads, GROUP=group, BLOCK_Q=plan.block_q,
            BLOCK_M=plan.block_m, SUB_N=kvarn.CHUNK_TOKENS, num_warps=4, **lay,
        )
        kvarn._kvarn_reduce_kernel[(tokens, self.num_heads)](
            part_acc, part_ml, out, plan.num_segments, out.stride(0), out.stride(1),
            NUM_HEADS=self.num_heads, D=self.head_size, LOG2_D=lay["LOG2_D"],
        )
