"""hybrid-kv-groups-v2-cudagraph (gotcha 15): the V2 runner reports VLLM_V2_CUDAGRAPH_MEM_MIB
as its CUDA graph memory, so the KV pool leaves room for the graphs; and hybrid KV groups are
sized so that the layers whose memory grows with the context get no padding slots."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.support.patchprobe import Tree

pytestmark = pytest.mark.patch

GIB = 1 << 30
ESTIMATE = 1229 << 20


def test_v2_runner_reports_the_configured_graph_memory(tree: Tree) -> None:
    estimate = tree.probe("kv_groups_probe")["runner_estimate"]
    assert estimate["NONE"] == 0
    assert estimate["FULL_AND_PIECEWISE"] == (ESTIMATE if tree.patched else 0)


def test_worker_takes_the_graph_memory_out_of_the_pool(tree: Tree) -> None:
    available = tree.probe("kv_groups_probe")["available_kv_bytes"]
    # 22 GiB requested - 15 GiB non-KV = 7.0 GiB; minus the 1229 MiB estimate = 5.80 GiB.
    assert available == 7 * GIB - (ESTIMATE if tree.patched else 0)
    assert round(available / GIB, 2) == (5.80 if tree.patched else 7.0)


def test_full_attention_layers_get_no_padding_slots(tree: Tree) -> None:
    groups = tree.probe("kv_groups_probe")["groups"]
    assert sum(g["layers"] for g in groups) == 69
    counts = Counter(g["kind"] for g in groups)
    group_size = max(g["layers"] for g in groups)
    full_slots = counts["FullAttentionSpec"] * group_size
    if tree.patched:
        assert (len(groups), group_size) == (9, 8)
        assert full_slots == 16
    else:
        # Sized by the smallest bucket (the 5 drafter layers): 16 layers in 20 slots.
        assert (len(groups), group_size) == (15, 5)
        assert full_slots == 20
