"""The KVarN cache served on a GPU (issue 24): what the recorded LIFE_KV=kvarn run shows.

``serve_on_device.sh`` with LIFE_KV=kvarn SPEC=off serves the demo model, given cycle_head.py's
looping LM head (greedy margins of several nats: a repeat's tokens do not hang on rounding, and
the head makes the text depend little on attention, so what this shows of attention is that it
serves and stays finite, not that it is accurate: the patch tier and the kernel benchmark
bound its error), through ``qwen3090 serve`` on ``--kv-cache-dtype kvarn_k4v2_g128``
(exercise_server.KVARN_ARGS): the MTP tier's client steps without a speculator, then long
greedy completions that close and open 128-token tiles, each sent twice (the second
reads the first's tiles from the prefix cache). SPEC=mtp serves the same steps with MTP, its
drafter's attention on KVARN too. The records beside this file, ``serve_kvarn_result.json``
(SPEC=off) and ``serve_kvarn_mtp_result.json`` (SPEC=mtp), are the runs' own output committed
as data; QWEN3090_GPU_KVARN_RECORD and QWEN3090_GPU_KVARN_MTP_RECORD point these tests at
others.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from qwen3090.patchtool import load_series
from tests.gpu.test_serve_on_device import PATCHES, RERUN, load_record

pytestmark = pytest.mark.gpu


def _record(variable: str, name: str) -> Path:
    return Path(os.environ.get(variable) or Path(__file__).with_name(name))


# speculator -> the record of that LIFE_KV=kvarn life
RECORDS = {
    "off": _record("QWEN3090_GPU_KVARN_RECORD", "serve_kvarn_result.json"),
    "mtp": _record("QWEN3090_GPU_KVARN_MTP_RECORD", "serve_kvarn_mtp_result.json"),
}
TILE = 128


@pytest.fixture(scope="module", params=sorted(RECORDS))
def life(request: pytest.FixtureRequest) -> dict[str, Any]:
    spec: str = request.param
    record = RECORDS[spec]
    data = load_record(record, load_series(PATCHES).digest,
                       f"{RERUN} with LIFE_KV=kvarn SPEC={spec}")
    label = f"kv=kvarn spec={spec}"
    attempt: dict[str, Any] | None = next(
        (a for a in data.get("attempts", []) if a["label"] == label), None)
    assert attempt is not None, f"{record.name} has no {label!r} life"
    return attempt


def test_the_kvarn_life_served_on_the_kvarn_backend(life: dict[str, Any]) -> None:
    assert life["health"]["ok"], life.get("wall")
    assert "--kv-cache-dtype kvarn_k4v2_g128" in life["serve"]["knobs"]["EXTRA_ARGS"]
    assert "KVARN" in life["pool"]["attention_backends"], life["pool"]
    assert life["wall"] is None, life["wall"]


def test_the_attention_block_is_a_whole_number_of_tiles(life: dict[str, Any]) -> None:
    block = life["pool"].get("attention_block_size_tokens")
    if block is None:
        pytest.skip("the engine logged no hybrid attention block size")
    assert block % TILE == 0, block


def test_every_client_step_answered(life: dict[str, Any]) -> None:
    assert life["chat"]["ok"]
    assert life["prefix_cache"]["status"] == [200, 200]
    assert life["decode"]["status"] == 200
    assert life["decode"]["completion_tokens"] == 3 * 96
    runs = life["structured_output"]["choice_runs"]
    assert all(r["status"] == 200 and r["content"] in ("yes", "no") for r in runs), runs


def test_the_prefix_cache_hits_on_kvarn_tiles(life: dict[str, Any]) -> None:
    cached = life["prefix_cache"]["cached_tokens"]
    assert cached and cached >= TILE, life["prefix_cache"]


def test_long_completions_stay_finite_and_repeat(life: dict[str, Any]) -> None:
    runs = life["kvarn_long"]
    assert len(runs) == 3
    for case in runs:
        for out in case["runs"]:
            assert out["status"] == 200, out
            # Prompts of several tiles, decoded past the next tile boundary.
            assert out["prompt_tokens"] > 2 * TILE, out["prompt_tokens"]
            assert out["completion_tokens"] == 160
            assert out["logprobs"] == 160 and out["nonfinite_logprobs"] == 0, out
        # The repeat reads the first request's tiles from the prefix cache: greedy over the
        # same quantized tiles gives the same tokens.
        assert case["repeat_identical"], [o["text"][:200] for o in case["runs"]]


def test_the_server_stopped_cleanly(life: dict[str, Any]) -> None:
    assert life["sigint"]["exit_code"] == 0, life["sigint"]


def test_no_kvarn_kernel_compiles_after_warm_up(life: dict[str, Any]) -> None:
    """The impl compiles its kernels at model construction (gotcha 45); vLLM's JIT monitor
    names any Triton kernel compiled after warm-up."""
    jit = life["jit"]
    if not jit["monitor_active"]:
        pytest.skip("vLLM's JIT monitor did not run in this life")
    late = [k for k in jit["kernels"] if "kvarn" in k]
    assert late == [], jit["kernels"]


def test_the_mtp_drafter_ran_on_kvarn(life: dict[str, Any]) -> None:
    """SPEC=mtp: the drafter's layer attends over KVARN tiles as well (its speculative config
    names the backend) and drafted on every decode step. The demo's MTP head is random, so
    acceptance says nothing here; that the drafts were made and verified does."""
    if life["serve"]["spec"] != "mtp":
        pytest.skip("a life without a speculator")
    assert '"attention_backend": "KVARN"' in life["serve"]["knobs"]["EXTRA_ARGS"]
    assert life["pool"]["attention_backends"] == ["KVARN"], life["pool"]
    decode = life["decode"]
    assert decode["spec"] == "mtp" and decode["spec_drafts"], decode
    assert decode["spec_draft_tokens"] >= decode["spec_drafts"], decode
