"""The KVarN cache served on a GPU (issue 24): what the recorded LIFE_KV=kvarn runs show.

``serve_on_device.sh`` with LIFE_KV=kvarn serves a qwen3_5 model, given cycle_head.py's looping
LM head (greedy margins of several nats: a repeat's tokens do not hang on rounding, and the head
makes the text depend little on attention, so what this shows of attention is that it serves
and stays finite, not that it is accurate: the patch tier and the kernel benchmark bound its
error), through ``qwen3090 serve`` on ``--kv-cache-dtype kvarn_k4v2_g128``: the MTP tier's
client steps, then long greedy completions that close and open 128-token tiles, each sent
twice (the second reads the first's tiles from the prefix cache).

The lives (``LIVES``), each a record beside this file (the run's own output committed as data;
its environment variable points a test at another):
- the demo model's widths, the kvarn flags in EXTRA_ARGS (session 6, before the planner's
  rows): without a speculator, and with MTP, its drafter's attention on KVARN too;
- the 27B's widths (shape27b.py: head_dim 256, 24/4 heads, Gated DeltaNet 16/48, 8 layers), the
  planner's rows and nothing by hand: ``CTX=huge`` without a speculator (plus a prompt near the
  200,000-token limit, long_context) and with MTP, and ``--profile batch KV=kvarn`` (plus 48
  concurrent requests, seat_burst).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from qwen3090.patchtool import load_series
from qwen3090.resolver.common import AttentionShape, kvarn_staging_bytes, kvarn_workspace_bytes
from tests.gpu.test_serve_on_device import PATCHES, RERUN, load_record

pytestmark = pytest.mark.gpu

TILE = 128
GIB = 1 << 30


@dataclass(frozen=True)
class Life:
    variable: str  # the environment variable that points at another record
    name: str  # the record beside this file
    label: str  # its life's label (exercise_server.py)
    rerun: str  # serve_on_device.sh's variables for it


LIVES = {
    # The demo model's widths serving the planner's CTX=huge rows (before session 10 these
    # two passed the kvarn flags through EXTRA_ARGS, labelled "kv=kvarn spec=...").
    "demo-off": Life("QWEN3090_GPU_KVARN_RECORD", "serve_kvarn_result.json",
                     "single-user CTX=huge spec=off", "LIFE_KV=kvarn SPEC=off"),
    "demo-mtp": Life("QWEN3090_GPU_KVARN_MTP_RECORD", "serve_kvarn_mtp_result.json",
                     "single-user CTX=huge spec=mtp", "LIFE_KV=kvarn SPEC=mtp"),
    "huge-off": Life("QWEN3090_GPU_KVARN_HUGE_RECORD", "serve_kvarn_huge_result.json",
                     "single-user CTX=huge spec=off", "LIFE_KV=kvarn SPEC=off SHAPE=27b"),
    "huge-mtp": Life("QWEN3090_GPU_KVARN_HUGE_MTP_RECORD", "serve_kvarn_huge_mtp_result.json",
                     "single-user CTX=huge spec=mtp", "LIFE_KV=kvarn SPEC=mtp SHAPE=27b"),
    "batch": Life("QWEN3090_GPU_KVARN_BATCH_RECORD", "serve_kvarn_batch_result.json",
                  "batch KV=kvarn spec=off",
                  "LIFE_KV=kvarn PROFILE=batch SPEC=off SHAPE=27b"),
}


def _record(name: str) -> dict[str, Any]:
    life = LIVES[name]
    path = Path(os.environ.get(life.variable) or Path(__file__).with_name(life.name))
    return load_record(path, load_series(PATCHES).digest, f"{RERUN} with {life.rerun}")


def _life(name: str) -> dict[str, Any]:
    """The named life's attempt, with its record's ``model`` (when recorded) beside it."""
    data = _record(name)
    label = LIVES[name].label
    attempt: dict[str, Any] | None = next(
        (a for a in data.get("attempts", []) if a["label"] == label), None)
    assert attempt is not None, f"{LIVES[name].name} has no {label!r} life"
    return {**attempt, "model": data.get("model")}


@pytest.fixture(scope="module", params=sorted(LIVES))
def life(request: pytest.FixtureRequest) -> dict[str, Any]:
    return _life(request.param)


def _exec_line(life: dict[str, Any]) -> str:
    lines: list[str] = life["log"]["exec"]
    assert lines, "the server log has no qwen3090 exec line"
    return lines[0]


def test_the_kvarn_life_served_on_the_kvarn_backend(life: dict[str, Any]) -> None:
    assert life["health"]["ok"], life.get("wall")
    # The planner's lives carry the dtype early in the command (test_the_planner_row_...);
    # the demo lives appended it in EXTRA_ARGS, past the logged line's 600 characters.
    served = _exec_line(life) + " " + life["serve"]["knobs"]["EXTRA_ARGS"]
    assert "--kv-cache-dtype kvarn_k4v2_g128" in served
    assert "KVARN" in life["pool"]["attention_backends"], life["pool"]
    assert life["wall"] is None, life["wall"]
    # The builder checks its lost-tile counter every 5 s and warns when it grew: no life lost
    # a staging entry (to a request unscheduled too long, or, on series 64e96239, to an MTP
    # drafter's guessed pass past a tile boundary freeing the tile its request continued).
    # The life's last two requests, each after a pause, bring its last losses into the log.
    assert (life.get("lost_flush") or {}).get("status") == [200, 200], life.get("lost_flush")
    assert life["log"]["kvarn_lost"] == [], life["log"]["kvarn_lost"]


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
    """SPEC=mtp: the drafter's layer attends over KVARN tiles as well (named in the demo
    life's speculative config; chosen by vLLM's selector in the planner's, which names no
    backend) and drafted on every decode step. The demo's MTP head is random, so acceptance
    says nothing here; that the drafts were made and verified does."""
    if life["serve"]["spec"] != "mtp":
        pytest.skip("a life without a speculator")
    # Target and drafter both logged their backend, and both chose KVARN.
    assert life["pool"]["attention_backends"] == ["KVARN"], life["pool"]
    assert "--speculative-config" in _exec_line(life)
    decode = life["decode"]
    assert decode["spec"] == "mtp" and decode["spec_drafts"], decode
    assert decode["spec_draft_tokens"] >= decode["spec_drafts"], decode


# The planner's rows: the flags each row must give, as the served command carried them.
ROW_FLAGS = {
    "single-user": ("--max-model-len 200000", "--max-num-seqs 8",
                    "--kv-cache-dtype kvarn_k4v2_g128 --block-size 128",
                    "--prefix-match-unit 128", '"cudagraph_mode":"PIECEWISE"'),
    "batch": ("--max-model-len 262144", "--max-num-seqs 64",
              "--kv-cache-dtype kvarn_k4v2_g128 --block-size 128", "--async-scheduling"),
}
PLANNED = ("huge-off", "huge-mtp", "batch")


@pytest.fixture(scope="module", params=PLANNED)
def planned(request: pytest.FixtureRequest) -> dict[str, Any]:
    return _life(request.param)


def test_the_planner_row_served_with_nothing_by_hand(planned: dict[str, Any]) -> None:
    """The row's flags came from ``qwen3090 plan`` (CTX=huge, or batch KV=kvarn); the life
    added only the lent machine's GDN prefill backend."""
    serve = planned["serve"]
    assert serve["knobs"]["EXTRA_ARGS"] == "--gdn-prefill-backend triton", serve["knobs"]
    knobs = {"single-user": {"CTX": "huge"}, "batch": {"KV": "kvarn"}}[serve["profile"]]
    assert {k: serve["knobs"].get(k) for k in knobs} == knobs
    argv = " ".join(planned["plan"]["argv"])
    for flags in ROW_FLAGS[serve["profile"]]:
        assert flags in argv, (flags, argv)
    assert "--attention-backend" not in argv
    # What the engine was started with is the plan (the log keeps a line's first 600
    # characters: compare the first 300 of the command after the interpreter).
    planned_cmd = " ".join(planned["plan"]["argv"]).removeprefix("-m ")
    served_cmd = _exec_line(planned).split(" -m ", 1)[1]
    assert served_cmd[:300] == planned_cmd[:300], (served_cmd, planned_cmd)


def test_the_27b_widths_page_as_the_cpu_tier_says() -> None:
    """At the 27B's widths, the hybrid alignment sets the attention block to 2,048 tokens
    (16 tiles), the figure test_patch_kvarn_cache_spec.py computes on the CPU."""
    for name in PLANNED:
        life = _life(name)
        assert life["model"]["head_dim"] == 256 and life["model"]["num_key_value_heads"] == 4
        assert life["pool"]["attention_block_size_tokens"] == 2048, (name, life["pool"])


def _buffers_gib(life: dict[str, Any]) -> float:
    """The plan's price of the KVARN backend's buffers for this life's model and seats."""
    model = life["model"]
    argv = life["plan"]["argv"]
    seats = int(argv[argv.index("--max-num-seqs") + 1])
    batched = int(argv[argv.index("--max-num-batched-tokens") + 1])
    speculative = (json.loads(argv[argv.index("--speculative-config") + 1])
                   if "--speculative-config" in argv else {})
    drafter = (model.get("mtp_num_hidden_layers") or 0) if life["serve"]["spec"] == "mtp" else 0
    shape = AttentionShape(layers=model["attention_layers"] + drafter,
                           heads=model["num_attention_heads"],
                           kv_heads=model["num_key_value_heads"], head_dim=model["head_dim"])
    return (kvarn_staging_bytes(seats, shape)
            + kvarn_workspace_bytes(seats, max_batched_tokens=batched, shape=shape,
                                    spec_tokens=speculative.get("num_speculative_tokens", 0))
            ) / GIB


def test_the_profiler_charges_what_the_plan_prices() -> None:
    """vLLM's "Model loading took X GiB" is the weights plus what the KVARN backend allocates
    at model construction (staging and workspace; resolver.common prices them for the plan's
    warning). Between the batch life (64 seats) and the single-user one (8 seats) of the same
    weights, the difference is the buffers' alone (the staging of 56 more seats)."""
    rest = {}
    for name in PLANNED:
        life = _life(name)
        loaded = life["pool"]["model_loading_gib"]
        weights = life["model"]["weights_bytes"] / GIB
        rest[name] = loaded - weights - _buffers_gib(life)
        # What else model construction holds (rotary tables and the like): small, and the
        # same in every life (the log rounds to 0.01 GiB).
        assert 0 <= rest[name] < 0.06, (name, loaded, weights, _buffers_gib(life))
    assert abs(rest["batch"] - rest["huge-off"]) < 0.02, rest


def test_a_prompt_near_the_context_limit_serves() -> None:
    """CTX=huge's point: a prompt of over 190,000 tokens prefills, decodes with finite
    logprobs, and its decode reads the prefix cache's tiles."""
    long = _life("huge-off")["long_context"]
    assert long["prompt_tokens"] > 190_000, long
    for step in ("short", "prefill", "decode"):
        assert long[step]["status"] == 200 and long[step]["nonfinite_logprobs"] == 0, long
    assert long["prefill"]["prompt_tokens"] == long["prompt_tokens"]
    assert long["decode"]["completion_tokens"] == 128
    # All but the last, partial 2,048-token block came from the cache.
    assert long["decode"]["cached_tokens"] >= long["prompt_tokens"] - 2048, long["decode"]


def test_batch_seats_decode_together_as_they_do_alone() -> None:
    """48 requests at once on the batch row (staging entries for 48 seats' open tiles in
    use together): every one answered with finite logprobs and the same greedy text as the
    same prompt alone, and the engine ran them together."""
    burst = _life("batch")["seat_burst"]
    n = burst["requests"]
    assert n >= 32 and burst["status"] == [200] * n and burst["alone_status"] == [200] * n
    assert burst["nonfinite_logprobs"] == 0
    assert burst["identical_to_alone"] == n, burst
    assert burst["max_running"] is not None and burst["max_running"] > 8, burst
