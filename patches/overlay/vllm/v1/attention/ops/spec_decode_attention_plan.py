# SPDX-License-Identifier: Apache-2.0
# qwen3090 patch spec-decode-attn: the launch planner of
# spec_decode_attention.py and the Hopper split pass's TMA checks.
#
# Why a module of its own: everything here decides from shapes and numbers
# only (never from context lengths, which a captured CUDA graph does not see
# change), so it imports neither vLLM nor Triton and is tested on its own,
# without a GPU or a patched vLLM tree.

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Rows of one query tile (query tokens x heads per kv head). 128 rows of
# head_dim 256 keep the fp32 accumulator at 128 registers/thread with 8 warps.
MAX_BLOCK_M = 128
# Segment-count ceiling per launch.
MAX_SEGMENTS = 128
# A segment never covers fewer KV tokens than this (see plan_launch).
MIN_SEGMENT_TOKENS = 256
# Workspace budget: segments per slot are granted up to this many bytes; a
# workspace always has at least one slot per (token, head).
WORKSPACE_BUDGET_BYTES = 64 << 20
# Shared memory a program may use when the device does not say (an H200's).
DEFAULT_SHARED_MEM = 227 << 10


@dataclass(frozen=True)
class LaunchPlan:
    """Shapes of one split-KV launch (also what the tests inspect)."""

    block_m: int
    block_q: int
    q_tiles: int
    tile_n: int
    num_segments: int
    min_segment_tokens: int
    num_warps: int
    num_stages: int
    bt_lookahead: int
    split_grid: tuple[int, int, int]
    reduce_grid: tuple[int, int] | None
    # "triton" (portable) or "hopper" (warp-specialised, sm_90); the Hopper
    # kernel's consumer warpgroups and query tokens per warpgroup.
    kernel: str = "triton"
    num_wg: int = 0
    wg_q: int = 0
    # The int8 Hopper pass merges its own partials into the output (a cooperative
    # launch, no reduce pass): see fusable_grid.
    fused_reduce: bool = False


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _prev_pow2(n: int) -> int:
    return 0 if n <= 0 else 1 << (n.bit_length() - 1)


@dataclass(eq=False)
class WorkspaceShape:
    """What the planner reads of a partial-softmax workspace.

    ``max_tokens`` = max_num_seqs x QMAX bounds the query tokens of any batch
    the split-KV path accepts. Each (token, head) gets ``segments_per_token``
    slots; a batch with fewer tokens may use more segments per token, as long
    as tokens x segments stays within the same slots. ``max_shared_mem`` and
    ``hopper`` may be lowered at run time (a launch that did not fit or
    compile), so the shape is mutable and compared by identity.
    """

    max_tokens: int
    num_heads: int
    head_size: int
    num_sms: int
    budget_bytes: int = WORKSPACE_BUDGET_BYTES
    # Shared memory a program may use; plan_launch sizes tiles to fit, and
    # a launch that still runs out shrinks it (see SpecDecodeAttention).
    max_shared_mem: int = DEFAULT_SHARED_MEM
    # Plans use the warp-specialised Hopper split pass.
    hopper: bool = False
    segments_per_token: int = field(init=False)
    slots_per_head: int = field(init=False)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        self.segments_per_token = segments_per_token(
            self.max_tokens, self.num_heads, self.head_size, self.budget_bytes
        )
        self.slots_per_head = self.max_tokens * self.segments_per_token

    @property
    def slots(self) -> int:
        """(max, sum, output) slots of the whole workspace, over all heads."""
        return self.slots_per_head * self.num_heads


def segments_per_token(
    max_tokens: int, num_heads: int, head_size: int, budget_bytes: int
) -> int:
    """Segments each (token, head) may split into: a power of two, at most
    MAX_SEGMENTS, as many as ``budget_bytes`` allow, and always at least one."""
    # A slot: head_size fp32 partial outputs plus an fp32 max and sum.
    per_segment = max_tokens * num_heads * (head_size + 2) * 4
    return max(1, min(MAX_SEGMENTS, _prev_pow2(budget_bytes // per_segment)))


def _smem_estimate(block_m: int, tile_n: int, num_stages: int, head_size: int) -> int:
    return (num_stages * 2 * tile_n + block_m) * head_size * 2


def _hopper_smem_estimate(num_wg: int, tile_n: int, num_stages: int, head_size: int) -> int:
    # K and V stages plus each warpgroup's 64 query rows, and room for the
    # mbarriers and alignment (Triton allocated 248 bytes more than the tiles).
    return (num_stages * 2 * tile_n + num_wg * 64) * head_size * 2 + 512


def plan_smem(plan: LaunchPlan, head_size: int, int8_hopper: bool = False) -> int:
    """Estimated shared memory of one split program of this plan; with
    ``int8_hopper``, of the int8 Hopper pass that walks a Hopper plan over an
    int8_per_token_head cache."""
    if plan.kernel == "hopper" and int8_hopper:
        return INT8_HOPPER_SMEM[plan.num_wg]
    if plan.kernel == "hopper":
        return _hopper_smem_estimate(plan.num_wg, plan.tile_n, plan.num_stages, head_size)
    return _smem_estimate(plan.block_m, plan.tile_n, plan.num_stages, head_size)


def _hopper_shape_ok(head_size: int, group: int) -> bool:
    # Whole 64-column head_dim chunks (one accumulator each, at most four),
    # and one query token's heads within a 64-row warpgroup.
    return head_size % 64 == 0 and head_size <= 256 and group <= 64


def _plan_hopper(
    num_seqs: int,
    max_query_len: int,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    workspace: WorkspaceShape,
    num_segments: int | None,
    tile_n: int | None,
    num_stages: int | None,
    min_segment_tokens: int | None,
) -> LaunchPlan:
    g = num_heads // num_kv_heads
    # One consumer warpgroup of 64 rows while the verify block fits (q <= 10
    # at G=6), else two; longer blocks take more query tiles.
    per_wg = 64 // g
    num_wg = 1 if max_query_len <= per_wg else 2
    wg_q = min(per_wg, -(-max_query_len // num_wg))
    block_q = wg_q * num_wg
    q_tiles = -(-max_query_len // block_q)
    # H200 (python/benchmarks/spec_decode_attn.md): 64-token tiles in two
    # stages beat 32-token ones in three or four (192 KiB with two warpgroups,
    # 160 KiB with one); either way one program per SM.
    if tile_n is None:
        tile_n = 64
    if num_stages is None:
        num_stages = 2
    while _hopper_smem_estimate(num_wg, tile_n, num_stages, head_size) > workspace.max_shared_mem:
        if num_stages > 2:
            num_stages -= 1
        elif tile_n > 16:
            tile_n //= 2
        elif num_stages > 1:
            num_stages -= 1
        else:
            break
    if num_segments is None:
        programs = num_seqs * q_tiles * num_kv_heads
        capacity = workspace.slots_per_head // max(num_seqs * max_query_len, 1)
        num_segments = max(
            1,
            min(MAX_SEGMENTS, _prev_pow2(workspace.num_sms // programs), _prev_pow2(capacity)),
        )
    if num_segments < 1 or num_segments & (num_segments - 1):
        raise ValueError(f"num_segments must be a power of two, got {num_segments}")
    if min_segment_tokens is None:
        rows = min(max_query_len, block_q) * g
        min_segment_tokens = max(MIN_SEGMENT_TOKENS, _next_pow2(4 * rows))
    min_segment_tokens = -(-min_segment_tokens // tile_n) * tile_n
    return LaunchPlan(
        block_m=64 * num_wg,
        block_q=block_q,
        q_tiles=q_tiles,
        tile_n=tile_n,
        num_segments=num_segments,
        min_segment_tokens=min_segment_tokens,
        num_warps=4,
        num_stages=num_stages,
        bt_lookahead=0,
        split_grid=(num_seqs * q_tiles, num_kv_heads, num_segments),
        # The Hopper split pass always leaves partials, even in one segment.
        reduce_grid=(num_seqs * max_query_len, num_heads),
        kernel="hopper",
        num_wg=num_wg,
        wg_q=wg_q,
    )


def plan_launch(
    num_seqs: int,
    max_query_len: int,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    workspace: WorkspaceShape,
    num_segments: int | None = None,
    tile_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    min_segment_tokens: int | None = None,
    block_m: int | None = None,
    bt_lookahead: int | None = None,
    kernel: str | None = None,
    max_block_m: int | None = None,
    programs_per_sm: int | None = None,
) -> LaunchPlan:
    """Choose tiles and segments from shapes only (never from context lengths,
    which a captured graph does not see change). Defaults come from an H200
    sweep (python/benchmarks/spec_decode_attn.md in qwen3090). max_block_m
    caps the Triton split pass's query tile (rows) where block_m is left to
    the planner: a longer verify block then takes more query tiles.
    programs_per_sm: the split programs one SM holds at once, which sizes the
    KV split to one wave (default: one for 128-row tiles, two below)."""
    g = num_heads // num_kv_heads
    if kernel is None:
        kernel = (
            "hopper" if workspace.hopper and _hopper_shape_ok(head_size, g) else "triton"
        )
    if kernel == "hopper":
        if not _hopper_shape_ok(head_size, g):
            raise ValueError(
                f"the Hopper split pass takes head sizes in 64-column chunks up to "
                f"256 and at most 64 heads per kv head, not {head_size} / {g}"
            )
        return _plan_hopper(
            num_seqs, max_query_len, num_heads, num_kv_heads, head_size, workspace,
            num_segments, tile_n, num_stages, min_segment_tokens,
        )
    if kernel != "triton":
        raise ValueError(f"kernel must be 'triton' or 'hopper', not {kernel!r}")
    if max_block_m is not None and (max_block_m < 16 or max_block_m & (max_block_m - 1)):
        raise ValueError(f"max_block_m must be a power of two >= 16, got {max_block_m}")
    if block_m is None:
        block_m = min(max_block_m or MAX_BLOCK_M, _next_pow2(max_query_len * g))
    block_m = max(16, block_m, _next_pow2(g))
    block_q = block_m // g
    q_tiles = -(-max_query_len // block_q)
    tokens_bound = num_seqs * max_query_len
    capacity = workspace.slots_per_head // max(tokens_bound, 1)
    # On an H200 a 128-row tile fills an SM's shared memory (one program per
    # SM) and smaller tiles run two per SM; a card's own plan may say how many
    # its kernel holds (the RTX 3090's: one). Aim for one full wave of
    # programs: fewer, longer segments cost less partial-output traffic than
    # extra waves.
    if programs_per_sm is not None and programs_per_sm < 1:
        raise ValueError(f"programs_per_sm must be >= 1, got {programs_per_sm}")
    per_sm = programs_per_sm or (1 if block_m >= 128 else 2)
    if num_segments is None:
        programs = num_seqs * q_tiles * num_kv_heads
        want = _prev_pow2(per_sm * workspace.num_sms // programs)
        num_segments = max(1, min(MAX_SEGMENTS, want, _prev_pow2(capacity)))
    # 32-token KV tiles with the block table read a tile ahead: the loads of
    # three tiles in flight, and no spilled registers at 128 rows (64-token
    # tiles spill there; see the sweeps in the benchmark notes).
    if num_segments < 1 or num_segments & (num_segments - 1):
        raise ValueError(f"num_segments must be a power of two, got {num_segments}")
    if tile_n is None:
        tile_n = 32
    if num_warps is None:
        num_warps = 8 if block_m >= 128 else 4
    if num_stages is None:
        # Two 64-row programs share an SM; two stages leave room for both. A
        # 128-row program has an SM to itself: four stages (192 KiB with its
        # query tile) measured 0.5-1.5% faster than three.
        num_stages = 2 if block_m == 64 else 4 if block_m >= 128 else 3
    # Block-table entries are read this many tiles ahead of their K/V loads: 1, or 0
    # (in the same iteration, kept for the benchmark's comparison; H200: 1.45x slower).
    if bt_lookahead is None:
        bt_lookahead = 1
    if bt_lookahead not in (0, 1):
        raise ValueError(f"bt_lookahead must be 0 or 1, got {bt_lookahead}")
    # Fit shared memory (an RTX 3090 allows 99 KiB a program, an H200 227):
    # K and V tiles per stage plus the query tile. Keep two stages as long as
    # possible (narrower KV tiles first), then give up pipelining, then query
    # rows (more query tiles).
    while _smem_estimate(block_m, tile_n, num_stages, head_size) > workspace.max_shared_mem:
        if num_stages > 2:
            num_stages -= 1
        elif tile_n > 16:
            tile_n //= 2
        elif num_stages > 1:
            num_stages -= 1
        elif block_m > max(16, _next_pow2(g)):
            block_m //= 2
            block_q = block_m // g
            q_tiles = -(-max_query_len // block_q)
        else:
            break
    if min_segment_tokens is None:
        # Partial outputs cost rows x 4 bytes per head_size element against
        # segment tokens x 4 (bf16 K and V): keep them near 1/4 of the KV.
        rows = min(max_query_len, block_q) * g
        min_segment_tokens = max(MIN_SEGMENT_TOKENS, _next_pow2(4 * rows))
    # Whole tiles only: the split pass walks a segment tile by tile.
    min_segment_tokens = -(-min_segment_tokens // tile_n) * tile_n
    reduce_grid = None if num_segments == 1 else (num_seqs * max_query_len, num_heads)
    return LaunchPlan(
        block_m=block_m,
        block_q=block_q,
        q_tiles=q_tiles,
        tile_n=tile_n,
        num_segments=num_segments,
        min_segment_tokens=min_segment_tokens,
        num_warps=num_warps,
        num_stages=num_stages,
        bt_lookahead=bt_lookahead,
        split_grid=(num_seqs * q_tiles, num_kv_heads, num_segments),
        reduce_grid=reduce_grid,
    )


def fusable_grid(plan: LaunchPlan, head_size: int, num_sms: int) -> bool:
    """Whether the int8 Hopper pass may merge its partials itself under this plan:
    its programs wait for each other, so all of them must be resident at once (one
    a streaming multiprocessor: each takes most of one's shared memory, and the
    cooperative launch refuses a grid that does not fit), and each takes a whole
    share of head_size's columns."""
    programs = plan.split_grid[0] * plan.split_grid[1] * plan.split_grid[2]
    return (plan.kernel == "hopper" and plan.q_tiles == 1 and programs <= num_sms
            and head_size % plan.num_segments == 0)


def box_tokens(block_size: int, tile_n: int) -> int | None:
    """Tokens per TMA box: the largest run that divides both the tile and the
    cache block, so that no box crosses a block (tiles start at multiples of
    tile_n); None if it would split the 8-row swizzle atom. Hybrid models'
    attention blocks (864, 944, ... tokens) get 32- or 16-token boxes."""
    box = math.gcd(block_size, tile_n)
    return None if box % 8 else box


def tma_compatible(
    key_cache: "torch.Tensor", value_cache: "torch.Tensor", tile_n: int
) -> bool:
    """The paged caches as one 2-D TMA view each: rows (block, slot) at a
    fixed stride, 16-byte aligned; K and V laid out alike; whole boxes."""
    if key_cache.stride() != value_cache.stride() or key_cache.stride(-1) != 1:
        return False
    if box_tokens(key_cache.shape[1], tile_n) is None:
        return False
    s_blk, s_slot, s_head = key_cache.stride()[:3]
    size = key_cache.element_size()
    return (
        s_blk % s_slot == 0
        and (s_slot * size) % 16 == 0
        and (s_head * size) % 16 == 0
        and key_cache.data_ptr() % 16 == 0
        and value_cache.data_ptr() % 16 == 0
    )


# The int8 Hopper split pass (spec_decode_attention_hopper_int8.py): keys a
# tile, tokens a TMA box, and the head size its chunks are cut for.
INT8_HOPPER_TILE_N = 64
INT8_HOPPER_BOX_TOKENS = 16
INT8_HOPPER_HEAD_SIZE = 256
# Shared memory Triton allocates the int8 Hopper pass, by consumer warpgroups
# (its own tiles and stages, whatever the plan's): the patch tier's compile
# report holds these to the compiled kernel. One warpgroup's figure includes
# the widener's float32 K scales (1 KiB) and their two barriers; two
# warpgroups' the 512 bytes of row maxima their chunked query quantization
# writes.
INT8_HOPPER_SMEM = {1: 210_264, 2: 214_072}


def int8_hopper_unsupported(
    key_cache: "torch.Tensor",
    value_cache: "torch.Tensor",
    k_scale_cache: "torch.Tensor",
    v_scale_cache: "torch.Tensor",
    plan: LaunchPlan,
) -> str | None:
    """Why the int8 Hopper split pass cannot take this int8_per_token_head cache
    under this Hopper plan, or None when it can. It reads the whole cache buffer
    through TMA as rows of (token, every kv head) with each head's row
    [K | K scale | V | V scale] (TRITON_ATTN's layout), so the four views must be
    exactly that, 16-byte aligned, in blocks of whole 16-token boxes."""
    head_size = key_cache.shape[3] - 4
    if head_size != INT8_HOPPER_HEAD_SIZE:
        return f"head size {head_size} (its tiles are cut for {INT8_HOPPER_HEAD_SIZE})"
    if plan.kernel != "hopper":
        return f"a {plan.kernel} plan (it runs the Hopper planner's)"
    if plan.q_tiles != 1 or plan.num_wg not in (1, 2):
        return (f"a plan of {plan.q_tiles} query tiles on {plan.num_wg} warpgroups "
                "(it takes one tile of one or two)")
    if plan.tile_n % INT8_HOPPER_TILE_N:
        return f"{plan.tile_n}-key plan tiles (it walks {INT8_HOPPER_TILE_N}-key ones)"
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    if block_size % INT8_HOPPER_BOX_TOKENS:
        return (f"cache blocks of {block_size} tokens (it copies "
                f"{INT8_HOPPER_BOX_TOKENS}-token boxes)")
    padded = head_size + 4
    s_blk, s_slot, s_head, s_byte = key_cache.stride()
    base = key_cache.data_ptr()
    if (s_byte != 1 or s_head != 2 * padded or s_slot != num_kv_heads * s_head
            or s_blk % s_slot or value_cache.stride() != key_cache.stride()
            or value_cache.data_ptr() != base + padded):
        return (f"K/V views with strides {tuple(key_cache.stride())} / "
                f"{tuple(value_cache.stride())} (not [K | K scale | V | V scale] a head)")
    scale_strides = (s_blk // 4, s_slot // 4, s_head // 4)
    if (k_scale_cache.data_ptr() != base + head_size
            or v_scale_cache.data_ptr() != base + padded + head_size
            or tuple(k_scale_cache.stride()) != scale_strides
            or tuple(v_scale_cache.stride()) != scale_strides):
        return "scale views that are not the ones stored after each head's K and V"
    if s_slot % 16 or base % 16:
        return f"token rows of {s_slot} bytes at {base % 16} past 16 (TMA needs 16-byte rows)"
    return None
