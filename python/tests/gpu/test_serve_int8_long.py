"""Int8 KV verify attention served on a GPU (issue 21): what the recorded CTX=long run shows.

``serve_on_device.sh`` with ``SPEC=dflash2 LIFE_CTX=long SHAPE=27b`` serves the planner's
CTX=long row (the int8 per-token-head cache on TRITON_ATTN; DFLASH_TOKENS 15, so verify batches
of 16 query tokens) in up to three server lives: with the split-KV verify pass the plan turns
on, with vLLM's stock kernel (``SPEC_ATTN=0``), and with the split pass's Hopper kernel turned
off by the probe (``GPUE2E_SPLIT=triton``: the portable Triton pass an RTX 3090 runs). The
model has the 27B's attention widths (24/4 heads of 256, the shape the int8 Hopper pass is cut
for) and the looping LM head of cycle_head.py, so its greedy tokens have margins of several
nats. Every life runs the copy task (alone and beside another request) and a prompt near the
row's context limit decoded with logprobs (exercise_server.long_verify), then again from the
prefix cache. The record, ``serve_dflash2_long_result.json`` beside this file, is the run's
own output committed as data; QWEN3090_GPU_DFLASH2_LONG_RECORD points these tests at another.
A life the run did not reach is skipped with what stopped it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest

from qwen3090.patchtool import load_series
from tests.gpu import copy_task
from tests.gpu.test_serve_dflash2 import attempts_by_label, served_life
from tests.gpu.test_serve_on_device import PATCHES, RERUN, load_record

pytestmark = pytest.mark.gpu

RECORD = Path(
    os.environ.get("QWEN3090_GPU_DFLASH2_LONG_RECORD")
    or Path(__file__).with_name("serve_dflash2_long_result.json")
)
SPLIT, STOCK, TRITON = "ctx=long split", "ctx=long stock", "ctx=long split triton"
RERUN_LONG = f"{RERUN} with SPEC=dflash2 LIFE_CTX=long SHAPE=27b"
# exercise_server.LONG_VERIFY_DECODE, and the least prompt that still splits the context into
# many segments (its target is 120,000 tokens, counted by the server's tokenizer).
LONG_DECODE = 128
LONG_PROMPT_MIN = 100_000
# Nats within which two kernels reading the same int8 cache may round a logprob differently,
# and the top-2 gap at which a greedy token may flip: a dozen bf16 steps at the demo model's
# logit range (test_serve_dflash2.NEAR_TIE's reasoning).
NEAR_TIE = 0.05


@pytest.fixture(scope="module")
def record() -> dict[str, Any]:
    data = load_record(RECORD, load_series(PATCHES).digest, RERUN_LONG)
    assert (data.get("dflash2") or {}).get("ctx") == "long", \
        f"{RECORD.name} is not a SPEC=dflash2 CTX=long record"
    return data


def _life(record: dict[str, Any], label: str) -> dict[str, Any]:
    """The life ``label`` with its long-context step done."""
    return served_life(record, label, "long_verify")


def _runs(life: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {"copy": life["copy"], "mixed copy": life["mixed_batch"]["copy"],
            "mixed other": life["mixed_batch"]["other"], "long": life["long_verify"]}


def test_every_life_ran_or_is_named_skipped(record: dict[str, Any]) -> None:
    planned = record["dflash2"]["lives"]
    # Session 28's record was made before the third life (the Triton split pass) existed.
    assert planned in ([SPLIT, STOCK], [SPLIT, STOCK, TRITON]), planned
    attempted = [a["label"] for a in record.get("attempts", [])]
    skipped = [s["label"] for s in record["dflash2"]["skipped"]]
    assert len(set(attempted)) == len(attempted), f"a life is recorded twice: {attempted}"
    assert sorted(attempted + skipped) == sorted(planned)
    assert attempted, "no life was attempted"


def test_the_plan_serves_int8_kv_on_triton_attn(record: dict[str, Any]) -> None:
    """The row's own plan (no backend or cache in EXTRA_ARGS) picks TRITON_ATTN and the int8
    per-token-head cache; the split life keeps the split pass on, at 16 query tokens, and
    the launcher exec'd exactly that."""
    want = {SPLIT: "1", STOCK: "0", TRITON: "1"}
    checked = 0
    for label, life in attempts_by_label(record).items():
        if not life.get("health", {}).get("ok"):
            continue
        plan = life["plan"]
        argv = plan["argv"]
        pairs = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
        assert pairs.get("--attention-backend") == "TRITON_ATTN", (label, argv)
        assert pairs.get("--kv-cache-dtype") == "int8_per_token_head", (label, argv)
        assert plan["env"].get("VLLM_SPEC_DECODE_ATTN") == want[label], (label, plan["env"])
        assert plan["env"].get("VLLM_SPEC_DECODE_ATTN_QMAX") == "16", (label, plan["env"])
        # (exercise_server's --speculative-config, naming the drafter's backend, does override)
        for name in ("--attention-backend", "--kv-cache-dtype"):
            assert not any(f"overrides the plan's {name}" in w
                           for w in plan.get("warnings") or []), (label, plan["warnings"])
        assert any("int8_per_token_head" in line for line in life["log"]["exec"]), label
        checked += 1
    if not checked:
        pytest.skip("no life served")


def test_the_split_pass_took_int8_verify_batches_inside_cuda_graphs(
    record: dict[str, Any],
) -> None:
    """The probe saw the split pass take int8 verify batches while a CUDA graph was being
    captured (so every replay runs it), with the int8 Hopper pass on an sm_90 card; no layer
    was declined and the Hopper pass did not fall back."""
    life = _life(record, SPLIT)
    probe = life["log"]["probe"]
    taken = [line for line in probe if "spec-decode-attn taken" in line]
    captured = [line for line in taken if "capturing=True" in line and "cache=int8" in line]
    assert captured, probe
    if any(card in str(record.get("gpu")) for card in ("H100", "H200")):
        assert all("kernel=hopper" in line for line in captured), captured
    said = life["log"]["spec_decode_attention"]
    assert not any("declines" in line or "does not compile" in line for line in said), said


def test_the_triton_split_pass_took_int8_verify_batches_inside_cuda_graphs(
    record: dict[str, Any],
) -> None:
    """With the Hopper pass turned off (GPUE2E_SPLIT=triton), the portable Triton split pass,
    the one an RTX 3090 runs, took the int8 verify batches, inside graph capture too."""
    life = _life(record, TRITON)
    probe = life["log"]["probe"]
    assert any("Hopper pass turned off" in line for line in probe), probe
    taken = [line for line in probe if "spec-decode-attn taken" in line]
    captured = [line for line in taken if "capturing=True" in line and "cache=int8" in line]
    assert captured, probe
    assert all("kernel=triton" in line for line in taken), taken
    said = life["log"]["spec_decode_attention"]
    assert not any("declines" in line for line in said), said


def test_the_stock_life_took_no_split_call(record: dict[str, Any]) -> None:
    life = _life(record, STOCK)
    taken = [line for line in life["log"]["probe"] if "spec-decode-attn taken" in line]
    assert taken == [], taken


def _served_lives(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The split and stock lives (skips without either), and the Triton one when it ran."""
    lives = {label: _life(record, label) for label in (SPLIT, STOCK)}
    triton = attempts_by_label(record).get(TRITON)
    if triton and triton.get("health", {}).get("ok") and "long_verify" in triton:
        lives[TRITON] = triton
    return lives


def test_every_request_answered_with_finite_logprobs(record: dict[str, Any]) -> None:
    for label, life in _served_lives(record).items():
        assert "exercise_error" not in life, (label, life.get("exercise_error"))
        for name, run in _runs(life).items():
            assert run["status"] == 200 and run["error"] is None, (label, name, run)
        assert len(life["copy"]["output_token_ids"]) == copy_task.COPY_MAX_TOKENS, label
        long = life["long_verify"]
        assert long["prompt_tokens"] >= LONG_PROMPT_MIN, (label, long["prompt_tokens"])
        lps = long["token_logprobs"]
        assert len(lps) == len(long["output_token_ids"]) == LONG_DECODE, label
        assert all(x is not None and math.isfinite(x) for x in lps), (label, lps)
        for step in ("copy", "long_verify"):
            spec = life[step]["spec"]
            assert spec["drafts"] and spec["drafts"] > 0, (label, step, spec)


def _near_tie_at(life: dict[str, Any], run: str, at: int) -> bool:
    """Whether the target was at a near-tie at output position ``at``: the recorded top-2
    gap (the copy) or, for the long prompt, a chosen token whose probability is at most
    a half plus NEAR_TIE (a top-2 gap within NEAR_TIE needs that)."""
    if run == "copy":
        gaps = (life.get("copy_margins") or {}).get("output_margins") or []
        return at < len(gaps) and gaps[at] is not None and gaps[at] <= NEAR_TIE
    if run == "long":
        lps = life["long_verify"]["token_logprobs"]
        return at < len(lps) and lps[at] <= math.log(0.5) + NEAR_TIE
    return False


def _same_as_stock(record: dict[str, Any], label: str) -> None:
    """The life ``label`` and the stock one read the same int8 cache: every greedy token is
    the same in both, except at a near-tie (the tokens after it are another text, not
    compared), and the long prompt's logprobs agree within NEAR_TIE. The seconds are printed
    side by side (a figure, not a check)."""
    split, stock = _life(record, label), _life(record, STOCK)
    runs_split, runs_stock = _runs(split), _runs(stock)
    for run in runs_split:
        a, b = runs_split[run]["output_token_ids"], runs_stock[run]["output_token_ids"]
        at = copy_task.first_divergence(a, b)
        if at is not None:
            where = (f"{run}: {label} and stock differ from output token {at}: "
                     f"{a[max(0, at - 4):at + 4]} vs {b[max(0, at - 4):at + 4]}")
            assert _near_tie_at(split, run, at) or _near_tie_at(stock, run, at), where
            print(f"{where}, at a near-tie")
    long_a, long_b = split["long_verify"], stock["long_verify"]
    same = copy_task.first_divergence(long_a["output_token_ids"], long_b["output_token_ids"])
    n = LONG_DECODE if same is None else same
    diffs = [abs(x - y) for x, y in zip(long_a["token_logprobs"][:n],
                                         long_b["token_logprobs"][:n], strict=True)]
    print(f"\n  long prompt, {long_a['prompt_tokens']} tokens, {LONG_DECODE} decoded: "
          f"{label} {long_a['seconds']} s, stock {long_b['seconds']} s; largest logprob "
          f"difference {max(diffs, default=0.0):.2e} nats over {n} tokens")
    print(f"  copy task: {label} {split['copy']['seconds']} s, "
          f"stock {stock['copy']['seconds']} s")
    assert n > 0, "the long prompt's first token already differs"
    assert max(diffs) <= NEAR_TIE, diffs


def test_split_and_stock_decode_the_same_tokens_and_logprobs(record: dict[str, Any]) -> None:
    _same_as_stock(record, SPLIT)


def test_triton_split_and_stock_decode_the_same_tokens_and_logprobs(
    record: dict[str, Any],
) -> None:
    _same_as_stock(record, TRITON)


def test_the_cached_long_prompt_decodes_the_same_tokens(record: dict[str, Any]) -> None:
    """The long prompt a second time: the prefix cache serves nearly all of it, so the
    request is the decode alone (the verify batches at ~120k tokens of context). Its greedy
    tokens are the first request's (except at a near-tie); its seconds, split against stock,
    are printed side by side (a figure, not a check)."""
    lives = _served_lives(record)
    if not all("long_repeat" in life for life in lives.values()):
        pytest.skip("the record predates the cached long prompt (exercise_server.long_verify)")
    seconds = {}
    for label, life in lives.items():
        first, again = life["long_verify"], life["long_repeat"]
        assert again["status"] == 200 and again["error"] is None, (label, again)
        assert again["cached_tokens"] >= 0.9 * again["prompt_tokens"], (label, again)
        lps = again["token_logprobs"]
        assert len(lps) == LONG_DECODE and all(math.isfinite(x) for x in lps), label
        at = copy_task.first_divergence(first["output_token_ids"], again["output_token_ids"])
        assert at is None or _near_tie_at(life, "long", at), (label, at)
        seconds[label] = again["seconds"]
    steps = lives[SPLIT]["long_repeat"]["spec"]["drafts"]
    print(f"\n  cached long prompt, {LONG_DECODE} tokens decoded in {steps} verify steps: "
          + ", ".join(f"{label} {t} s ({seconds[STOCK] / t:.2f}x stock's speed)"
                      for label, t in seconds.items()))
