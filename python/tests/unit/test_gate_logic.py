"""The gate's decision over sample sequences: no GPU needed, every rule exercised."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qwen3090.gate import (
    GatePolicy,
    busy_reason,
    display_warning,
    evaluate,
    timeout_message,
)
from qwen3090.gpuprobe import GpuProcess, GpuSample

pytestmark = pytest.mark.unit

VLLM = GpuProcess(4242, "python3", 21850)


def sample(
    t: float,
    used: int,
    procs: tuple[GpuProcess, ...] = (),
    display: bool | None = False,
) -> GpuSample:
    return GpuSample(t, 0, "NVIDIA GeForce RTX 3090", used, 24576, procs, display, "test")


def test_passes_after_n_consecutive_free_samples() -> None:
    policy = GatePolicy(threshold_mib=2048, samples=4, interval_s=0.25, timeout_s=60)
    seq = [sample(0.25 * i, 300) for i in range(10)]
    out = evaluate(seq, policy)
    assert out.passed
    assert out.samples_seen == 4
    assert out.elapsed_s == pytest.approx(0.75)


def test_a_busy_sample_restarts_the_count() -> None:
    policy = GatePolicy(samples=3, timeout_s=60)
    used = [300, 300, 22000, 300, 300, 300, 300]
    out = evaluate([sample(float(i), u) for i, u in enumerate(used)], policy)
    assert out.passed
    # Free at 0, 1; busy at 2; free again 3, 4, 5 -> decided at the sixth sample.
    assert out.samples_seen == 6


def test_release_is_seen_within_the_stability_window() -> None:
    # A dying server drains its memory; the gate passes `samples - 1` intervals after the
    # first free reading, which is what bounds the release-to-pass time on the card.
    policy = GatePolicy(samples=4, interval_s=0.25, timeout_s=60)
    drain = [22000, 22000, 15000, 6000, 1900, 400, 400, 400, 400, 400]
    seq = [sample(0.25 * i, u, (VLLM,) if u > 10000 else ()) for i, u in enumerate(drain)]
    out = evaluate(seq, policy)
    assert out.passed
    first_free = next(s.t for s in seq if not busy_reason(s, policy))
    assert out.last is not None
    assert out.last.t - first_free == pytest.approx(0.75)


def test_threshold_is_exclusive_and_configurable() -> None:
    at = [sample(float(i), 2048) for i in range(5)]
    below = [sample(float(i), 2047) for i in range(5)]
    policy = GatePolicy(threshold_mib=2048, samples=2, timeout_s=3)
    assert not evaluate(at, policy).passed
    assert evaluate(below, policy).passed
    assert evaluate(at, GatePolicy(threshold_mib=4096, samples=2, timeout_s=3)).passed


def test_a_foreign_compute_process_blocks_even_under_the_threshold() -> None:
    small = GpuProcess(777, "leftover", 300)
    seq = [sample(float(i), 500, (small,)) for i in range(10)]
    out = evaluate(seq, GatePolicy(samples=2, timeout_s=5))
    assert not out.passed
    assert out.holders == (small,)
    # Our own pid is not foreign.
    mine = GatePolicy(samples=2, timeout_s=5, own_pids=frozenset({777}))
    assert evaluate(seq, mine).passed


def test_timeout_names_every_holder() -> None:
    other = GpuProcess(5151, "Xorg", None)
    seq = [sample(0.5 * i, 23000, (VLLM, other)) for i in range(100)]
    policy = GatePolicy(samples=4, interval_s=0.5, timeout_s=10)
    out = evaluate(seq, policy)
    assert not out.passed
    assert out.elapsed_s == pytest.approx(10.0)
    assert out.samples_seen == 21
    text = timeout_message(out, policy)
    assert "pid 4242 (python3, 21850 MiB)" in text
    assert "pid 5151 (Xorg, ? MiB)" in text
    assert "23000 of 24576 MiB used" in text


def test_memory_without_a_visible_process_is_reported_as_such() -> None:
    seq = [sample(float(i), 9000) for i in range(5)]
    policy = GatePolicy(samples=2, timeout_s=2)
    out = evaluate(seq, policy)
    assert not out.passed and out.holders == ()
    text = timeout_message(out, policy, "/dev/nvidia0 is open in: pid 99 (python3)")
    assert "no compute process is listed, yet 9000 MiB are used" in text
    assert "pid 99 (python3)" in text


def test_an_exhausted_sequence_is_a_failure() -> None:
    assert not evaluate([], GatePolicy()).passed
    out = evaluate([sample(0.0, 300)], GatePolicy(samples=2))
    assert not out.passed and out.samples_seen == 1


def test_evaluate_stops_reading_once_decided() -> None:
    taken: list[int] = []

    def stream() -> Iterator[GpuSample]:
        i = 0
        while True:
            taken.append(i)
            yield sample(float(i), 100)
            i += 1

    assert evaluate(stream(), GatePolicy(samples=3)).passed
    assert taken == [0, 1, 2]


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        GatePolicy(samples=0)
    with pytest.raises(ValueError):
        GatePolicy(timeout_s=-1)


def test_display_warning_needs_both_a_display_and_a_pinned_pool() -> None:
    desk = sample(0.0, 1300, display=True)
    assert display_warning(desk, kv_mem_pinned=False) is None
    assert display_warning(sample(0.0, 300, display=False), kv_mem_pinned=True) is None
    assert display_warning(sample(0.0, 300, display=None), kv_mem_pinned=True) is None
    text = display_warning(desk, kv_mem_pinned=True)
    assert text is not None and "gotcha 31" in text and "1300 MiB" in text


@given(
    st.lists(st.booleans(), min_size=0, max_size=40),
    st.integers(min_value=1, max_value=6),
)
def test_passes_exactly_when_a_long_enough_free_run_exists(free: list[bool], n: int) -> None:
    policy = GatePolicy(threshold_mib=1000, samples=n, interval_s=1.0, timeout_s=1000)
    seq = [sample(float(i), 10 if f else 5000) for i, f in enumerate(free)]
    out = evaluate(seq, policy)
    run = best = 0
    first_end = None
    for i, f in enumerate(free):
        run = run + 1 if f else 0
        best = max(best, run)
        if run >= n and first_end is None:
            first_end = i
    assert out.passed == (best >= n)
    if out.passed:
        assert out.samples_seen == (first_end or 0) + 1
