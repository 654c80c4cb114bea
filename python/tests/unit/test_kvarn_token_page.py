"""kvarn.token_page_bytes, the per-token page that vLLM's hybrid block alignment
(kvarn-cache-spec.patch, platforms/interface.py) multiplies by a block size: it must be exact,
so that block x token_page_bytes is the page kvarn.page_bytes gives for every whole-tile block."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.support.kvarn_ref import load_kvarn

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def kvarn() -> ModuleType:
    return load_kvarn(name="_overlay_kvarn_token_page")


def test_840_at_the_models_shape(kvarn: ModuleType) -> None:
    assert kvarn.token_page_bytes(4, 256) == 840


@pytest.mark.parametrize("head_size", [64, 128, 256, 512])
@pytest.mark.parametrize("num_kv_heads", [1, 2, 4, 8])
def test_block_times_token_bytes_is_the_page(kvarn: ModuleType, num_kv_heads: int,
                                             head_size: int) -> None:
    per_token = kvarn.token_page_bytes(num_kv_heads, head_size)
    assert per_token == kvarn.bytes_per_token_per_layer(num_kv_heads, head_size)
    for tiles in (1, 3, 16, 30):
        block = tiles * kvarn.TILE_TOKENS
        assert block * per_token == kvarn.page_bytes(block, num_kv_heads, head_size)


def test_refuses_what_the_layout_refuses(kvarn: ModuleType) -> None:
    with pytest.raises(ValueError, match="head_size 96"):
        kvarn.token_page_bytes(4, 96)
