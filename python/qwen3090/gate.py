"""The GPU-free gate: wait until the card is free and stable before vLLM profiles memory.

vLLM sizes its KV pool from one profiling pass at startup; a previous server still releasing
its ~22 GiB at that moment leaves a pool ~40% smaller for the new server's whole life
(gotcha 2). The gate holds the start until the card reads free for ``samples`` consecutive
readings, and on timeout names who holds it.

The decision is :func:`evaluate`, a pure function over a sequence of samples, so every rule
is tested without a GPU; :func:`wait_for_free_gpu` feeds it live samples from a probe.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from qwen3090.gpuprobe import GpuProbe, GpuProcess, GpuSample

# A desktop on the card (Xorg + compositor + browser) holds ~1.3 GiB (gotcha 31), and a card
# with nothing on it reads a few hundred MiB at most. 2 GiB lets a workstation that renders
# on its 3090 pass while a dying vLLM (20+ GiB) or a leftover CUDA context (which is also a
# compute process, and fails the second rule) cannot.
DEFAULT_THRESHOLD_MIB = 2048
# Four readings 0.25 s apart: the card has to stay free for 0.75 s, and a release is seen
# within ~1 s (the target is <= 2 s from release to pass).
DEFAULT_SAMPLES = 4
DEFAULT_INTERVAL_S = 0.25
DEFAULT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class GatePolicy:
    threshold_mib: int = DEFAULT_THRESHOLD_MIB
    samples: int = DEFAULT_SAMPLES
    interval_s: float = DEFAULT_INTERVAL_S
    timeout_s: float = DEFAULT_TIMEOUT_S
    # Our own pids: a process that holds a context for the gate itself is not "foreign".
    own_pids: frozenset[int] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ValueError("samples must be >= 1")
        if self.threshold_mib < 0 or self.interval_s < 0 or self.timeout_s < 0:
            raise ValueError("threshold, interval and timeout must be >= 0")


@dataclass(frozen=True)
class GateOutcome:
    passed: bool
    elapsed_s: float  # first sample to the deciding one
    samples_seen: int
    last: GpuSample | None
    holders: tuple[GpuProcess, ...]  # foreign compute processes at the deciding sample
    reason: str  # why the last sample was not free ("" when it was)


def foreign_processes(sample: GpuSample, policy: GatePolicy) -> tuple[GpuProcess, ...]:
    return tuple(p for p in sample.processes if p.pid not in policy.own_pids)


def busy_reason(sample: GpuSample, policy: GatePolicy) -> str:
    """Why ``sample`` is not free, or "" when it is."""
    parts: list[str] = []
    holders = foreign_processes(sample, policy)
    if holders:
        parts.append("compute process(es) " + ", ".join(p.describe() for p in holders))
    if sample.used_mib >= policy.threshold_mib:
        parts.append(f"{sample.used_mib} MiB used (threshold {policy.threshold_mib} MiB)")
    return "; ".join(parts)


def evaluate(samples: Iterable[GpuSample], policy: GatePolicy) -> GateOutcome:
    """Consume ``samples`` until ``policy.samples`` consecutive free ones (pass) or until a
    sample lies ``policy.timeout_s`` past the first one (fail). Stops reading as soon as it
    decides, so an endless live stream is fine. An exhausted sequence is a failure.
    """
    first_t: float | None = None
    streak = 0
    seen = 0
    last: GpuSample | None = None
    reason = "no sample was taken"
    for sample in samples:
        seen += 1
        last = sample
        if first_t is None:
            first_t = sample.t
        reason = busy_reason(sample, policy)
        streak = 0 if reason else streak + 1
        elapsed = sample.t - first_t
        if streak >= policy.samples:
            return GateOutcome(True, elapsed, seen, sample, (), "")
        if elapsed >= policy.timeout_s:
            return GateOutcome(
                False, elapsed, seen, sample, foreign_processes(sample, policy), reason
            )
    elapsed = 0.0 if last is None or first_t is None else last.t - first_t
    holders = () if last is None else foreign_processes(last, policy)
    return GateOutcome(False, elapsed, seen, last, holders, reason)


def live_samples(
    probe: GpuProbe,
    interval_s: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
    on_sample: Callable[[GpuSample], None] | None = None,
) -> Iterator[GpuSample]:
    """An endless stream of samples from ``probe``, one every ``interval_s`` seconds."""
    while True:
        started = time.monotonic()
        sample = probe.sample()
        if on_sample is not None:
            on_sample(sample)
        yield sample
        # Sleep the rest of the interval, so a slow probe (nvidia-smi) keeps the cadence.
        sleep(max(0.0, interval_s - (time.monotonic() - started)))


def wait_for_free_gpu(
    probe: GpuProbe,
    policy: GatePolicy,
    *,
    on_sample: Callable[[GpuSample], None] | None = None,
) -> GateOutcome:
    return evaluate(live_samples(probe, policy.interval_s, on_sample=on_sample), policy)


def default_policy(
    threshold_mib: int = DEFAULT_THRESHOLD_MIB,
    samples: int = DEFAULT_SAMPLES,
    interval_s: float = DEFAULT_INTERVAL_S,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> GatePolicy:
    return GatePolicy(threshold_mib, samples, interval_s, timeout_s, frozenset({os.getpid()}))


def display_warning(sample: GpuSample, kv_mem_pinned: bool) -> str | None:
    """Gotcha 31: a pinned KV pool assumes a headless card; a desktop on it fails later."""
    if not (kv_mem_pinned and sample.display_active):
        return None
    return (
        f"GPU {sample.index} drives a display and KV_MEM pins the KV pool in bytes: the pin "
        f"assumes a headless card, and the desktop's memory (now {sample.used_mib} MiB in use) "
        "is taken from the transient margin, so the server boots and then dies on a real "
        "request (gotcha 31). Lower KV_MEM by at least what the desktop holds, or set KV_MEM= "
        "empty to size the pool from GPU_UTIL."
    )


def timeout_message(outcome: GateOutcome, policy: GatePolicy, extra_holders: str = "") -> str:
    """The error text for a failed gate: the card, its reading, and each holder."""
    last = outcome.last
    if last is None:
        return "GPU gate: no reading was taken"
    head = (
        f"GPU {last.index} ({last.name}) was not free after {outcome.elapsed_s:.1f} s "
        f"(timeout {policy.timeout_s:g} s): {last.used_mib} of {last.total_mib} MiB used"
    )
    lines = [head]
    if outcome.holders:
        lines.append("held by:")
        lines.extend(f"  {p.describe()}" for p in outcome.holders)
    elif last.used_mib >= policy.threshold_mib:
        lines.append(
            f"no compute process is listed, yet {last.used_mib} MiB are used "
            f"(threshold {policy.threshold_mib} MiB)"
            + (f"; {extra_holders}" if extra_holders else "")
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class GateReport:
    """What a passed (or skipped) gate tells the caller: one summary line and warnings."""

    summary: str
    warnings: tuple[str, ...]
    outcome: GateOutcome | None


@dataclass(frozen=True)
class GateCli:
    """What the command running the gate lets the user change, worded for its error fixes:
    ``qwen3090 gate`` has a flag for every setting, ``serve`` only ``--no-gate``."""

    busy: str
    """The card stayed held until the timeout."""
    read_failed: str
    """A reading failed in the middle of the wait."""
    no_gpu: str
    """No usable NVIDIA GPU (or not the one asked for) for a CUDA plan; follows the probe's fix."""


GATE_CLI = GateCli(
    busy="stop those processes (or wait for them), or raise --timeout / --threshold-mib if "
    "what holds the card is meant to stay",
    read_failed="check the driver (nvidia-smi), or choose the other source with --source",
    no_gpu="(--device-index picks the GPU); where no NVIDIA GPU is meant to be, pass "
    "--plan-device cpu",
)
SERVE_CLI = GateCli(
    busy="stop those processes (or wait for them), then serve again; wait longer first with "
    "`qwen3090 gate --timeout SECONDS`; if what holds the card is meant to stay, serve with "
    "--no-gate (vLLM then sizes its KV pool around it)",
    read_failed="check the driver (nvidia-smi), or serve with --no-gate",
    no_gpu="; without an NVIDIA GPU, serve on the CPU with --device cpu and a small model "
    "(`qwen3090 demo-model DIR`, then --model DIR)",
)


def run_gate(
    policy: GatePolicy,
    *,
    device_index: int = 0,
    kv_mem_pinned: bool = False,
    plan_device: str = "cuda",
    prefer: str = "auto",
    on_sample: Callable[[GpuSample], None] | None = None,
    cli: GateCli = SERVE_CLI,
) -> GateReport:
    """Gate a start on GPU ``device_index``; the API ``serve`` calls before exec'ing vLLM.

    Returns a report when the card is free (or when there is no GPU and the plan is for the
    CPU); raises :class:`~qwen3090.errors.Qwen3090Error` on timeout or when there is no GPU
    for a CUDA plan, its fix worded for the command ``cli`` describes.
    """
    from qwen3090.errors import Qwen3090Error
    from qwen3090.gpuprobe import NoNvidiaGpu, device_node_holders, open_probe
    from qwen3090.wsl import WSL2_CHANGES, detect_wsl

    warnings: list[str] = []
    wsl = detect_wsl()
    if wsl.is_wsl2:
        warnings.append(
            "WSL2 detected (" + "; ".join(wsl.evidence) + "). What it changes:\n  - "
            + "\n  - ".join(WSL2_CHANGES)
        )
    try:
        probe = open_probe(device_index, prefer=prefer)
    except NoNvidiaGpu as err:
        if plan_device == "cpu":
            return GateReport(f"{err.message}; the plan is for the CPU: nothing to gate", (), None)
        raise NoNvidiaGpu(err.message, fix=f"{err.fix} {cli.no_gpu}") from err
    try:
        outcome = wait_for_free_gpu(probe, policy, on_sample=on_sample)
    except Qwen3090Error:
        raise
    except Exception as err:  # a driver hiccup mid-wait: say which source failed, no traceback
        raise Qwen3090Error(
            f"reading GPU {device_index} through {probe.source} failed: {err}",
            fix=cli.read_failed,
        ) from err
    finally:
        probe.close()
    last = outcome.last
    if not outcome.passed or last is None:
        extra = ""
        if last is not None and not outcome.holders:
            seen = device_node_holders(device_index)
            if seen:
                extra = f"/dev/nvidia{device_index} is open in: " + ", ".join(
                    f"pid {pid} ({name or '?'})" for pid, name in seen
                )
        raise Qwen3090Error(
            timeout_message(outcome, policy, extra),
            fix=cli.busy,
            exit_code=3,
        )
    warn = display_warning(last, kv_mem_pinned)
    if warn:
        warnings.append(warn)
    summary = (
        f"GPU {last.index} ({last.name}) is free: {last.used_mib} of {last.total_mib} MiB "
        f"used, no foreign compute process, stable over {policy.samples} samples "
        f"({outcome.elapsed_s:.2f} s since the first) [{last.source}]"
    )
    return GateReport(summary, tuple(warnings), outcome)
