"""The host side of benchmarks/int8_ws_candidate.py (issue 21), on the CPU: how verify lengths
map to consumer warpgroups, and the TMA descriptors over an int8_per_token_head cache. A
device call is scarce; a wrong split or descriptor found here costs none of it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "int8_ws_candidate.py"


@pytest.fixture(scope="module")
def cand() -> ModuleType:
    pytest.importorskip("triton.experimental.gluon")
    spec = importlib.util.spec_from_file_location("int8_ws_candidate_host", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("q", "group", "want"), [
    (1, 6, (1, 1)), (8, 6, (1, 8)), (10, 6, (1, 10)),  # up to 64 rows: one warpgroup
    (11, 6, (2, 6)), (16, 6, (2, 8)),  # tokens split evenly over two
    (16, 4, (1, 16)), (32, 4, (2, 16)),
])
def test_verify_lengths_map_to_warpgroups_of_at_most_64_rows(
    cand: ModuleType, q: int, group: int, want: tuple[int, int]
) -> None:
    num_wg, wg_q = cand.warpgroups(q, group)
    assert (num_wg, wg_q) == want
    assert wg_q * group <= 64 and num_wg * wg_q >= q


def test_more_than_two_warpgroups_of_rows_is_refused(cand: ModuleType) -> None:
    with pytest.raises(ValueError, match="q x G <= 128 rows"):
        cand.warpgroups(22, 6)


def test_descriptors_span_every_token_row_of_the_cache(cand: ModuleType) -> None:
    torch = pytest.importorskip("torch")
    blocks, block, kv_heads, head = 5, 16, 4, 256
    padded = head + 4  # each row: K codes, K scale, V codes, V scale
    buf = torch.zeros(blocks, block, kv_heads, 2 * padded, dtype=torch.int8)
    desc, sc_desc, rows_per_block, s_head = cand.descriptors(buf[..., :padded], 16)
    row_bytes = kv_heads * 2 * padded
    # Every token row of every block, the last block's slots included.
    assert list(desc.shape) == [blocks * block, row_bytes]
    assert list(desc.strides) == [row_bytes, 1]
    assert list(desc.block_shape) == [16, 128] and list(sc_desc.block_shape) == [16, 16]
    # The kernel's K column is head * s_head; its V column s_head / 2 further.
    assert (rows_per_block, s_head) == (block, 2 * padded)


def test_a_cache_that_is_not_per_token_head_is_refused(cand: ModuleType) -> None:
    torch = pytest.importorskip("torch")
    plain = torch.zeros(5, 16, 4, 256, dtype=torch.int8)  # K alone, no scales beside it
    with pytest.raises(ValueError, match="not an int8_per_token_head cache"):
        cand.descriptors(plain, 16)
