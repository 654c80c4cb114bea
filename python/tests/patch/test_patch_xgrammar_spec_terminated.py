"""xgrammar-spec-terminated (gotcha 36): tokens after the one that terminates a grammar are
ignored instead of failing the request; a real rejection still fails; reset() clears it."""

from __future__ import annotations

import pytest

from tests.support.patchprobe import Tree

pytestmark = pytest.mark.patch

OPEN, CLOSE, STOP = 0, 1, 7


def test_verify_window_past_the_stop_token(tree: Tree) -> None:
    result = tree.probe("xgrammar_probe")
    if tree.patched:
        assert result["window_accepted"] is True
        # It consumed "{", "}" and the stop token, and ignored the newline after it.
        assert result["window_state"] == {"terminated": True, "num_processed_tokens": 3}
        assert result["accepted_after_termination"] is True
    else:
        assert result["window_accepted"] is False
        assert result["accepted_after_termination"] is False


def test_mid_grammar_rejection_still_fails(tree: Tree) -> None:
    # "}" cannot open a JSON object: a genuine grammar violation on both trees.
    assert tree.probe("xgrammar_probe")["mid_grammar_rejection_accepted"] is False


def test_validate_tokens_stops_at_termination_and_rolls_back(tree: Tree) -> None:
    result = tree.probe("xgrammar_probe")
    assert result["validated"] == [OPEN, CLOSE, STOP]
    assert result["validate_rolled_back"] is True
    assert result["validated_after_termination"] == []


def test_reset_clears_termination(tree: Tree) -> None:
    after_reset = tree.probe("xgrammar_probe")["after_reset"]
    if tree.patched:
        assert after_reset == {"terminated": False, "accepts_again": True}
    else:
        assert after_reset["terminated"] is True
