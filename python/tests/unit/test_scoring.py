"""The bench tools' scoring functions, checked against the gotchas' own numbers and shapes."""

from __future__ import annotations

import math
import random
from math import comb

import pytest

from qwen3090.bench import boot, decode, quality, residues, verbatim

pytestmark = pytest.mark.unit


def _document(chars: int = 3595, seed: int = 7) -> str:
    """A long, non-repetitive English-like document to copy."""
    rng = random.Random(seed)
    words = [
        "river", "stone", "ledger", "amber", "quiet", "harbor", "signal", "copper", "meadow",
        "thread", "window", "lantern", "orbit", "cedar", "marble", "pocket", "violet", "ember",
    ]  # fmt: skip
    out: list[str] = []
    while sum(len(w) + 1 for w in out) < chars:
        out.append(rng.choice(words) + ("." if rng.random() < 0.1 else ""))
    return " ".join(out)[:chars]


SOURCE = _document()


# gotcha 33: the same broken residue came back in three shapes; none of them copies.
def test_the_three_failure_shapes_and_a_correct_copy() -> None:
    assert verbatim.coverage(SOURCE, SOURCE) == 1.0  # "794/794 verbatim"
    assert verbatim.coverage("", SOURCE) == 0.0  # mtp: "" with finish_reason=stop
    assert verbatim.coverage("#", SOURCE) == 0.0  # mtp: one character, "#"
    fluent = (
        "Oversæt venligst den følgende tekst til dansk. Her er oversættelsen af dokumentet, "
        "som du bad om, skrevet i et klart og flydende sprog uden at gentage kilden. " * 6
    )
    assert verbatim.coverage(fluent, SOURCE) == 0.0  # "2/1146 verbatim", fluent Danish


def test_a_degenerate_repeat_of_one_source_block_scores_low() -> None:
    # dflash2 at its broken residue: "4/3595 characters verbatim, one 40-char block x79".
    block = SOURCE[1000:1040]
    answer = SOURCE[:4] + block * 79
    s = verbatim.score(answer, SOURCE)
    assert s.repeats >= 79
    assert s.prefix == 4
    assert s.coverage < 0.05


def test_prefix_is_reported_but_coverage_decides() -> None:
    # One wrong character at offset 38: prefix says 38/791, coverage says almost perfect.
    doc = SOURCE[:791]
    answer = doc[:38] + ("X" if doc[38] != "X" else "Y") + doc[39:]
    s = verbatim.score(answer, doc)
    assert s.prefix == 38
    assert s.coverage > 0.9


def test_flag_low_finds_the_one_broken_residue_of_128() -> None:
    # seeds/001: "127 clean and exactly one broken, and it is 4".
    values = {r: 1.0 for r in range(128)}
    values[4] = 0.0
    values[77] = 0.93  # an ordinary small deviation is not a failure
    assert set(verbatim.flag_low(values)) == {4}
    assert verbatim.flag_low({0: 0.0}) == {}


def test_sampling_five_residues_misses_one_broken_one_96_percent_of_the_time() -> None:
    # gotcha 33's arithmetic, the reason the sweep walks every residue.
    miss = comb(127, 5) / comb(128, 5)
    assert miss == pytest.approx(123 / 128)
    assert round(miss, 2) == 0.96


def test_find_pad_hits_every_templated_length_exactly_once() -> None:
    # A stand-in tokenizer with the two quirks that break naive padding: a chat-template
    # overhead (+12 tokens on Qwen3, gotcha 33) and a merge that makes some pads cost two.
    def count(pad: str) -> int:
        units = pad.count(residues.PAD_UNIT)
        tail = pad[len(residues.PAD_UNIT) * units :]
        merged = units // 9  # every ninth unit merges with its neighbour into one token
        return 300 + 12 + units - merged + len(tail.split(",")) - (0 if tail else 1)

    base = count("")
    plan = []
    units = 0
    for target in range(base + 1, base + 1 + 128):
        pad, units = residues.find_pad(count, target, units, residues.PAD_UNIT)
        assert count(pad) == target
        plan.append(target)
    assert sorted(residues.residue(t) for t in plan) == list(range(128))


def test_decode_rate_from_usage_not_chunks() -> None:
    # seeds/004: completion_tokens / (wall - ttft); the chunk count never enters.
    assert decode.decode_rate(1024, 9.5, 0.5) == pytest.approx(1024 / 9.0)
    assert decode.decode_rate(1, 1.0, 0.5) is None
    assert decode.decode_rate(100, 1.0, None) is None


def test_degenerate_guard_on_the_gotcha_49_figures() -> None:
    loop = " ".join(["echo the instruction again"] * 60)
    ratio = decode.distinct_word_ratio(loop)
    assert ratio is not None and ratio < 0.06  # the loop measured 0.051
    assert decode.degenerate_reasons(loop, None, None)
    prose = _document(1200, seed=3) + " " + " ".join(f"word{i}" for i in range(150))
    r = decode.distinct_word_ratio(prose)
    assert r is not None and r > decode.DISTINCT_MIN
    assert not decode.degenerate_reasons(prose, None, 7)
    # Drafted tokens per round: above the width is ordinary (40% of rows), above 1.2x is not.
    ordinary = decode.SpecDelta(drafts=100, draft_tokens=790, accepted=300)
    collapsed = decode.SpecDelta(drafts=100, draft_tokens=860, accepted=797)
    assert not decode.degenerate_reasons(prose, ordinary, 7)
    assert decode.degenerate_reasons(prose, collapsed, 7)
    assert collapsed.tokens_per_step == pytest.approx(8.97)


def test_spec_counters_from_the_exposition_text() -> None:
    before = (
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.\n"
        "# TYPE vllm:spec_decode_num_drafts_total counter\n"
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="qwen3.8-27b"} 10.0\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="qwen3.8-27b"} 40.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="qwen3.8-27b"} 20.0\n'
    )
    after = before.replace("} 10.0", "} 110.0").replace("} 40.0", "} 440.0")
    after = after.replace("} 20.0", "} 295.0")
    delta = decode.spec_delta(
        decode.parse_counters(before, decode.SPEC_COUNTERS),
        decode.parse_counters(after, decode.SPEC_COUNTERS),
    )
    assert delta is not None
    assert delta.drafted_per_round == 4.0
    assert delta.tokens_per_step == pytest.approx(3.75)
    assert decode.spec_delta({}, decode.parse_counters("", decode.SPEC_COUNTERS)) is None


def test_perplexity_and_nan() -> None:
    # gotcha 46: the clean configurations agree on 10.7628 to four decimals.
    lp = -math.log(10.7628)
    assert quality.perplexity([lp] * 300) == pytest.approx(10.7628)
    assert math.isnan(quality.perplexity([lp, float("nan"), lp]))


def test_gsm8k_answers() -> None:
    ref = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72"
    assert quality.reference_answer(ref) == "72"
    assert quality.reference_answer("#### 1,250") == "1250"
    assert quality.extract_answer("so she has $18.00 left.\n#### 18") == "18"
    assert quality.extract_answer("The answer is 5, not 3... it is 7") == "7"
    assert quality.extract_answer("no idea") is None


def test_prompt_logprobs_entries() -> None:
    entries = [None, {"17": {"logprob": -1.5, "rank": 3}}, {"9": {"logprob": -0.5, "rank": 1}}]
    assert quality.prompt_token_logprobs(entries) == [-1.5, -0.5]


def test_quality_warnings_follow_the_server_config() -> None:
    def info(util: str, prefix: str, dtype: str) -> str:
        return (
            f'vllm:cache_config_info{{block_size="128",cache_dtype="{dtype}",'
            f'enable_prefix_caching="{prefix}",gpu_memory_utilization="{util}"}} 1.0\n'
        )

    assert any("gotcha 9" in w for w in quality.server_warnings(info("0.972", "False", "fp8")))
    assert quality.server_warnings(info("0.93", "False", "fp8")) == []
    mtp = info("0.93", "True", "kvarn_k4v2_g128") + "vllm:spec_decode_num_drafts_total 5.0\n"
    assert any("gotcha 46" in w for w in quality.server_warnings(mtp))
    assert any("cannot read" in w for w in quality.server_warnings(None))


GPU_WARM = """\
(EngineCore pid=1) INFO 10-02 12:00:01 [backends.py:293] Directly load the compiled graph(s) \
for compile range (1, 1024) from the cache, took 2.143 s
(EngineCore pid=1) INFO 10-02 12:00:02 [monitor.py:53] torch.compile took 3.97 s in total
(EngineCore pid=1) INFO 10-02 12:00:40 [core.py:354] init engine (profile, create kv cache, \
warmup model) took 41.13 s (compilation: 3.98 s)
"""

CPU_WARM_STOCK = """\
(Worker pid=12680) INFO 11-30 01:22:47 [cpu_model_runner.py:150] Warming up model for the \
compilation...
(Worker pid=12680) WARNING 11-30 01:22:49 [decorators.py:321] Compiling model again due to a \
load failure from /c/torch_compile_cache/torch_aot_compile/30b5/rank_0_0/model, reason: \
'function' object has no attribute 'finalize_loading'
(Worker pid=12680) INFO 11-30 01:22:57 [decorators.py:708] saved AOT compiled function to /c/m
(Worker pid=12680) INFO 11-30 01:22:58 [cpu_model_runner.py:154] Warming up done.
(EngineCore pid=12543) INFO 11-30 01:23:03 [core.py:354] init engine (profile, create kv \
cache, warmup model) took 15.38 s
"""


def test_boot_log_parsing() -> None:
    gpu = boot.parse_boot_log(GPU_WARM)
    assert (gpu.init_s, gpu.compile_s, gpu.compile_source) == (41.13, 3.98, "engine")
    cpu = boot.parse_boot_log(CPU_WARM_STOCK)
    assert cpu.init_s == 15.38
    assert cpu.load_failure and cpu.aot_saved and not cpu.aot_loaded
    assert (cpu.compile_s, cpu.compile_source) == (11.0, "cpu-warmup-span")
    assert boot.ratio(27.2, 49.8) == pytest.approx(0.546, abs=1e-3)
