"""offload-draft-groups (gotcha 38): only the groups holding drafter layers lose their
trailing chunk from KV offload stores, and the boot log names the uniform-CPU-block waste
factor with the cpu_bytes_to_use multiplier that compensates for it."""

from __future__ import annotations

import pytest

from tests.support.patchprobe import Tree

pytestmark = pytest.mark.patch


def test_only_the_drafter_group_is_flagged(tree: Tree) -> None:
    result = tree.probe("offload_probe")
    assert result["tokens_per_chunk"] == [2176, 2176, 128]
    flags = result["eagle_flags"]
    if tree.patched:
        assert flags == [False, False, True]
    else:
        assert flags == [True, True, True]


def test_boot_log_names_waste_factor_and_multiplier(tree: Tree) -> None:
    log = tree.probe("offload_probe")["log"]
    waste = [line for line in log if "cpu_bytes_to_use" in line]
    if tree.patched:
        assert len(waste) == 1, log
        # 2176 / 128 = 17: the drafter's chunks take 17x the CPU memory per token.
        assert "17.0x" in waste[0]
        assert "cpu_bytes_to_use (4294967296) by 17.0" in waste[0]
    else:
        assert waste == []
