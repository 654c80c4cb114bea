"""hybrid-sw-block-promote (gotchas 28, 47): a drafter sliding-window layer whose page does
not divide the primary page gets a promoted block instead of a padded page, and every
group's block still divides the largest one (the scheduler's block size is their LCM)."""

from __future__ import annotations

import pytest

from tests.support.patchprobe import Tree

pytestmark = pytest.mark.patch


@pytest.fixture
def cases(tree: Tree) -> dict[str, dict[str, object]]:
    result = tree.probe("sw_promote_probe")
    return {name: case for name, case in result.items() if name != "_output"}


def test_int8_k7_drafter_block(tree: Tree, cases: dict[str, dict[str, object]]) -> None:
    case = cases["int8_k7"]
    assert case["primary_page"] == 1_797_120
    if tree.patched:
        assert case["draft"] == {"block": 864, "page": 1_824_768, "padded": False,
                                 "blocks_per_request": 9, "used_fraction": 1.0}
        assert case["full"] == {"block": 864, "page": 1_824_768, "padded": True}
        assert case["mamba"] == {"block": 864, "page": 1_824_768}
    else:
        # Gotcha 28: 385 blocks of a whole primary page, each 1.88% used.
        draft = case["draft"]
        assert isinstance(draft, dict)
        assert (draft["block"], draft["page"], draft["padded"]) == (16, 1_797_120, True)
        assert draft["blocks_per_request"] == 385
        assert round(draft["used_fraction"] * 100, 2) == 1.88


def test_int4_k15_promotes_to_a_divisor_of_the_primary_block(
    tree: Tree, cases: dict[str, dict[str, object]]
) -> None:
    case = cases["int4_k15"]
    assert case["primary_page"] == 1_943_040
    if tree.patched:
        # The covering block would be 928, which does not divide 1840 (gotcha 47).
        assert case["draft"] == {"block": 1840, "page": 3_886_080, "padded": False,
                                 "blocks_per_request": 5, "used_fraction": 1.0}
        assert case["full"] == {"block": 3680, "page": 3_886_080, "padded": False}
        assert case["mamba"] == {"block": 1840, "page": 3_886_080}
    else:
        draft = case["draft"]
        assert isinstance(draft, dict)
        assert (draft["block"], draft["padded"], draft["blocks_per_request"]) == (16, True, 385)


def test_int8_k15_block(tree: Tree, cases: dict[str, dict[str, object]]) -> None:
    draft = cases["int8_k15"]["draft"]
    assert isinstance(draft, dict)
    assert draft["block"] == (944 if tree.patched else 16)


def test_int4_k7_divides_already_and_is_unchanged(cases: dict[str, dict[str, object]]) -> None:
    case = cases["int4_k7"]
    assert case["draft"] == {"block": 848, "page": 1_790_976, "padded": False,
                             "blocks_per_request": 9, "used_fraction": 1.0}
    assert case["full"] == {"block": 1696, "page": 1_790_976, "padded": False}


def test_every_block_divides_the_largest(tree: Tree, cases: dict[str, dict[str, object]]) -> None:
    for name, case in cases.items():
        assert case["lcm_block"] == case["max_block"], name
