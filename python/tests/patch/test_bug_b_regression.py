"""Bug B regression pin (gotcha 33, seeds/001): no patch, a guard for the next vLLM bump.

Bug B: after a prefix-cache hit the scheduler computes the prompt's tail, and when that
tail is exactly as long as a verify step (k+1 tokens) a shape-only classifier dispatches
the prefill as a uniform decode batch and replays the captured FULL verify graph, which
corrupts the output. vLLM 0.28.0's V2 model runner no longer does this:
``gather_batch_req_state`` marks the batch ``has_prefill`` and
``get_uniform_decode_token_count(..., has_prefill=True)`` is None, so no FULL decode graph
is compatible and the batch runs piecewise. These tests pin that on both trees.

The V1 runner is a different matter: its ``GPUModelRunner._is_uniform_decode`` is still
shape-only in 0.28.0 (1 request x 4 tokens is "uniform decode" whether it is a verify step
or a prompt tail). And in 0.28.0 a Qwen3.5-architecture target with MTP runs on V1 by
default: ``Qwen3_5ForConditionalGeneration`` / ``Qwen3_5ForCausalLM`` are ``IsHybrid``,
hybrid models default to V2 only when listed in ``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES``
(they are not), and none of the branches that force V2 (prefill context parallel, dspark,
mixed sliding/full DFlash, DFlash2, diffusion) applies to ``method="mtp"``; only
``VLLM_USE_V2_MODEL_RUNNER=1`` moves it. DFlash2 is forced onto V2.

What that means for PROFILES.md: the ``cudagraph_mode=PIECEWISE`` rule for speculators other
than dflash2 is still needed on 0.28.0. SPEC=mtp runs on the V1 runner, whose classifier
would still send a (k+1)-token prompt tail to the FULL verify graph; the fix in the V2 runner
does not reach it. SPEC=dflash2 runs on V2 and keeps FULL graphs. (From the code: the V1
classifier is the same at every CTX, so SPEC=mtp with PREFIX_CACHE=1 and FULL graphs outside
CTX=huge has the same shape exposure; the gotcha measured the corruption at CTX=huge.)
"""

from __future__ import annotations

import pytest

from tests.support.patchprobe import Tree

pytestmark = pytest.mark.patch


def test_v2_refuses_a_full_decode_graph_to_a_batch_with_a_prefill(tree: Tree) -> None:
    v2 = tree.probe("bug_b_probe")["v2"]
    assert v2["uniform_with_prefill"] is None
    assert v2["uniform_without_prefill"] == 4
    # 25084-token prompt, 25080 from the prefix cache, 4 left: a prefill, not a decode.
    assert v2["gather_prefill"] == [True, None]
    assert v2["gather_decode"] == [False, 4]
    assert v2["full_graph_takes_prefill"] is False
    assert v2["full_graph_takes_decode"] is True
    assert v2["piecewise_takes_prefill"] is True


def test_v1_classifier_is_still_shape_only(tree: Tree) -> None:
    """If this fails, vLLM's V1 runner learned about prefills: revisit PROFILES.md's rule."""
    assert tree.probe("bug_b_probe")["v1_shape_only_uniform"] is True


def test_qwen3_5_mtp_runs_on_v1_by_default(tree: Tree) -> None:
    """If this fails, MTP moved to the V2 runner: revisit PROFILES.md's PIECEWISE rule."""
    runner = tree.probe("bug_b_probe")["runner"]
    assert runner["hybrid"] == {"Qwen3_5ForConditionalGeneration": True,
                                "Qwen3_5ForCausalLM": True}
    assert not any(a.startswith("Qwen3_5") for a in runner["default_v2_architectures"])
    assert runner["mtp"] is False
    assert runner["mtp_forced_v2"] is True
    assert runner["dflash2"] is True
