"""DFlash2 with lookup drafting served on a GPU: what the recorded SPEC=dflash2 run shows.

``serve_on_device.sh`` with SPEC=dflash2 serves the demo model with a random DFlash2 drafter
(dflash2_drafter.py) through ``qwen3090 serve`` in up to three server lives: lookup off, lookup
with the fixed verify block, lookup with the adaptive block (issue 22). Each life runs the same
greedy copy task (copy_task.py), alone and beside a request with nothing to copy. The run's
record, ``serve_dflash2_result.json`` beside this file, is its own output committed as data;
QWEN3090_GPU_DFLASH2_RECORD points these tests at another (a fresh ``$OUT/result.json``). A
life the run did not reach or had no budget for is skipped with what stopped it.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import pytest

from qwen3090.patchtool import load_series
from tests.gpu import copy_task
from tests.gpu.test_serve_on_device import PATCHES, RERUN, load_record

pytestmark = pytest.mark.gpu

RECORD = Path(
    os.environ.get("QWEN3090_GPU_DFLASH2_RECORD")
    or Path(__file__).with_name("serve_dflash2_result.json")
)
OFF, FIXED, ADAPTIVE = "lookup=0", "lookup=1 adaptive=0", "lookup=1 adaptive=1"
LOOKUP_LIVES = (FIXED, ADAPTIVE)
# The share of the copy's output positions whose last KEY_TOKENS tokens occur earlier in the
# request (copy_task.repeat_fraction) above which the lookup has matches to draft from.
REPEATS = 0.25
RERUN_DFLASH2 = f"{RERUN} with SPEC=dflash2"
# Nats between the target's top two logprobs within which bf16 rounding under another verify
# block's shape may flip the greedy token (a dozen bf16 steps at the demo model's logit range).
# cycle_head.py makes such ties rare (on the CPU the smallest gap of the copy was 7.1 nats),
# so in practice the outputs must be identical.
NEAR_TIE = 0.05


@pytest.fixture(scope="module")
def record() -> dict[str, Any]:
    data = load_record(RECORD, load_series(PATCHES).digest, RERUN_DFLASH2)
    assert "dflash2" in data, f"{RECORD.name} is not a SPEC=dflash2 record (no 'dflash2' key)"
    return data


def attempts_by_label(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["label"]: a for a in record.get("attempts", [])}


def served_life(record: dict[str, Any], label: str, step: str) -> dict[str, Any]:
    """The life ``label`` of a SPEC=dflash2 record with its ``step`` done; skips naming what
    stopped it (test_serve_int8_long.py reads its CTX=long record the same way)."""
    skipped = {s["label"]: s["reason"] for s in record["dflash2"]["skipped"]}
    if label in skipped:
        pytest.skip(f"the {label} life did not run: {skipped[label]}")
    life = attempts_by_label(record).get(label)
    if life is None:
        pytest.skip(f"the run ended before the {label} life")
    if not life.get("health", {}).get("ok"):
        pytest.skip(f"the {label} life never served; its wall: {life.get('wall')}")
    if step not in life:
        pytest.skip(f"the {label} life served but did not reach its {step} step: "
                    f"{str(life.get('exercise_error'))[-600:]}")
    return life


def _life(record: dict[str, Any], label: str) -> dict[str, Any]:
    """The life ``label`` with its copy task done."""
    return served_life(record, label, "copy")


def _skip_unless(found: object, record: dict[str, Any], what: str) -> None:
    """Skips when ``found`` is empty, naming each attempted life's wall."""
    if not found:
        walls = {label: a.get("wall") or str(a.get("exercise_error"))[-300:]
                 for label, a in attempts_by_label(record).items()}
        pytest.skip(f"{what}; the lives' walls: {walls}")


def _ran(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The lives that served and ran the copy task, by label."""
    return {label: a for label, a in attempts_by_label(record).items()
            if a.get("health", {}).get("ok") and "copy" in a}


def test_every_life_ran_or_is_named_skipped(record: dict[str, Any]) -> None:
    planned = record["dflash2"]["lives"]
    assert planned == [OFF, ADAPTIVE, FIXED]
    labels = [a["label"] for a in record.get("attempts", [])]
    attempted = list(attempts_by_label(record))
    assert len(labels) == len(attempted), f"a life is recorded twice: {labels}"
    skipped = record["dflash2"]["skipped"]
    # A resumed record (exercise_server.py --resume) lists the lives carried over first.
    assert sorted(attempted + [s["label"] for s in skipped]) == sorted(planned)
    assert all(s["reason"] for s in skipped)
    assert attempted, "no life was attempted"


def test_the_plan_and_the_server_saw_the_lookup_knobs(record: dict[str, Any]) -> None:
    """Each life's plan emits its lookup variables with synchronous scheduling, and the
    patched speculator logged what it read: nothing with lookup off, the lookup without or
    with the adaptive block otherwise, and no async-scheduling warning."""
    want: dict[str, tuple[dict[str, str], bool | None]] = {
        OFF: ({"VLLM_DFLASH2_LOOKUP": "0"}, None),
        FIXED: ({"VLLM_DFLASH2_LOOKUP": "1", "VLLM_DFLASH2_LOOKUP_ADAPTIVE": "0"}, False),
        ADAPTIVE: ({"VLLM_DFLASH2_LOOKUP": "1", "VLLM_DFLASH2_LOOKUP_ADAPTIVE": "1"}, True),
    }
    checked = 0
    for label, life in attempts_by_label(record).items():
        if not life.get("health", {}).get("ok"):
            continue
        env_want, adaptive_want = want[label]
        plan = life["plan"]
        assert {k: plan["env"].get(k) for k in env_want} == env_want, (label, plan)
        assert plan["async_scheduling"] is False, (label, plan)
        lines = life["log"]["lookup"]
        drafting = [ln for ln in lines if "DFlash2 lookup drafting on" in ln]
        if adaptive_want is None:
            assert drafting == [], (label, lines)
        else:
            # "...; adaptive verify block off" or "...; adaptive verify block 7/15 draft tokens"
            blocks = [ln.rsplit("adaptive verify block", 1)[-1].strip() for ln in drafting]
            assert blocks, (label, lines)
            assert all((b != "off") == adaptive_want for b in blocks), (label, lines)
        assert not any("has no effect with async scheduling" in ln for ln in lines), label
        checked += 1
    _skip_unless(checked, record, "no life served")


def test_no_error_responses(record: dict[str, Any]) -> None:
    ran = _ran(record)
    _skip_unless(ran, record, "no life ran the copy task")
    for label, life in ran.items():
        assert life["models"]["status"] == 200, label
        assert "exercise_error" not in life, (label, life.get("exercise_error"))
        runs = {"copy": life["copy"]}
        batch = life.get("mixed_batch")
        assert batch is not None, f"{label}: the mixed batch did not run"
        runs.update({f"mixed {k}": batch[k] for k in ("copy", "other")})
        for name, run in runs.items():
            assert run["status"] == 200 and run["error"] is None, (label, name, run)
        assert life["copy"]["completion_tokens"] == copy_task.COPY_MAX_TOKENS, label
        assert len(life["copy"]["output_token_ids"]) == copy_task.COPY_MAX_TOKENS, label
        assert len(batch["other"]["output_token_ids"]) == copy_task.OTHER_MAX_TOKENS, label


def test_the_drafter_ran_in_every_life(record: dict[str, Any]) -> None:
    ran = _ran(record)
    _skip_unless(ran, record, "no life ran the copy task")
    for label, life in ran.items():
        spec = life["copy"]["spec"]
        assert spec["drafts"] and spec["drafts"] > 0, (label, spec)
        assert spec["draft_tokens"] >= spec["drafts"], (label, spec)


def _margin_at(ran: dict[str, dict[str, Any]], reference: list[int], at: int) -> float | None:
    """The smallest top-1/top-2 logprob gap any life's target showed at output position ``at``
    of the copy, from lives whose copy output agrees with ``reference`` before it (the gap
    there depends on those tokens only)."""
    gaps = []
    for life in ran.values():
        own = life["copy"]["output_token_ids"]
        got = (life.get("copy_margins") or {}).get("output_margins") or []
        if own[:at] == reference[:at] and at < len(got) and got[at] is not None:
            gaps.append(got[at])
    return min(gaps) if gaps else None


def test_greedy_output_is_the_same_in_every_life(record: dict[str, Any]) -> None:
    """Lookup proposes, the target decides: no lookup setting may change a greedy token. The
    one parting allowed is at a recorded near-tie of the copy (top-1 and top-2 within NEAR_TIE
    nats): there a verify block of another length may round the target's logits the other way,
    which no drafter decides; the tokens after it are then another text, not compared."""
    ran = _ran(record)
    _skip_unless(len(ran) >= 2, record, f"{len(ran)} life ran the copy task: nothing to compare")
    outputs = {
        label: {
            "copy": life["copy"]["output_token_ids"],
            "mixed copy": life["mixed_batch"]["copy"]["output_token_ids"],
            "mixed other": life["mixed_batch"]["other"]["output_token_ids"],
        }
        for label, life in ran.items()
    }
    for (a, out_a), (b, out_b) in itertools.combinations(outputs.items(), 2):
        for step in out_a:
            at = copy_task.first_divergence(out_a[step], out_b[step])
            if at is None:
                continue
            where = (f"{step}: {a} and {b} differ from output token {at}: "
                     f"{out_a[step][max(0, at - 4):at + 4]} vs "
                     f"{out_b[step][max(0, at - 4):at + 4]}")
            gap = _margin_at(ran, out_a[step], at) if step != "mixed other" else None
            assert gap is not None and gap <= NEAR_TIE, f"{where}; target's top-2 gap {gap}"
            print(f"{where}, at a near-tie (top-2 gap {gap} nats)")


def test_lookup_gives_more_tokens_per_step_where_the_output_repeats(
    record: dict[str, Any],
) -> None:
    off = _life(record, OFF)["copy"]
    repeats = copy_task.repeat_fraction(off["prompt_token_ids"], off["output_token_ids"])
    base = off["spec"]["tokens_per_step"]
    figures = [f"copy task, {len(off['output_token_ids'])} greedy tokens, "
               f"{repeats:.0%} of them at a repeated {copy_task.KEY_TOKENS}-token key",
               f"  {OFF}: {base:.2f} tokens per step"]
    lookups = {label: attempts_by_label(record)[label] for label in LOOKUP_LIVES
               if label in _ran(record)}
    for label, life in lookups.items():
        figures.append(f"  {label}: {life['copy']['spec']['tokens_per_step']:.2f} tokens per "
                       f"step ({life['copy']['seconds']} s against {off['seconds']} s)")
    print("\n".join(figures))
    if not lookups:
        pytest.skip("no lookup life ran the copy task")
    if repeats < REPEATS:
        pytest.skip(f"the greedy output repeats its context at {repeats:.0%} of positions "
                    f"(< {REPEATS:.0%}): nothing for the lookup to copy")
    for label, life in lookups.items():
        got = life["copy"]["spec"]["tokens_per_step"]
        assert got > base, f"{label}: {got:.2f} tokens per step, lookup off {base:.2f}"


def test_the_adaptive_block_captures_decode_graphs_for_both_lengths(
    record: dict[str, Any],
) -> None:
    """Gotcha 23: with the adaptive block on, the target's FULL uniform-decode graphs are
    captured at the short block's length as well as at DFLASH_TOKENS + 1, one set per batch
    size each: twice the fixed block's count. The PIECEWISE graphs do not change."""
    adaptive, fixed = _life(record, ADAPTIVE), _life(record, FIXED)
    if "graphs" not in adaptive or "graphs" not in fixed:
        pytest.skip("the record predates the graph counts (exercise_server.graph_captures)")
    print(f"\n  FULL graphs: {adaptive['graphs'].get('FULL')} adaptive, "
          f"{fixed['graphs'].get('FULL')} fixed block")
    assert fixed["graphs"].get("FULL"), f"the fixed-block life captured no FULL graph: {fixed}"
    assert adaptive["graphs"]["FULL"] == 2 * fixed["graphs"]["FULL"]
    assert adaptive["graphs"].get("PIECEWISE") == fixed["graphs"].get("PIECEWISE")
