"""Reading one NVIDIA GPU's memory and compute processes: NVML first, ``nvidia-smi`` after.

The gate (``qwen3090.gate``) decides; this module only observes. Every reading becomes a
:class:`GpuSample`, whichever source produced it, so the decision logic is tested on plain
sample sequences and the sources are tested on their own (the ``nvidia-smi`` parser on real
CSV text here, NVML on a real card).
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from qwen3090.errors import Qwen3090Error

MIB = 1 << 20


@dataclass(frozen=True)
class GpuProcess:
    """A process with a compute context on the card; ``used_mib`` is None where the driver
    cannot attribute memory per process (WDDM under WSL2)."""

    pid: int
    name: str
    used_mib: int | None

    def describe(self) -> str:
        mib = "? MiB" if self.used_mib is None else f"{self.used_mib} MiB"
        return f"pid {self.pid} ({self.name or '?'}, {mib})"


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU. ``t`` is a monotonic timestamp in seconds."""

    t: float
    index: int
    name: str
    used_mib: int
    total_mib: int
    processes: tuple[GpuProcess, ...]
    display_active: bool | None
    source: str


class NoNvidiaGpu(Qwen3090Error):
    """Neither NVML nor nvidia-smi found a usable NVIDIA GPU."""


class GpuProbe(Protocol):
    source: str

    def sample(self) -> GpuSample: ...

    def close(self) -> None: ...


# --- nvidia-smi -------------------------------------------------------------------------------

QUERY_GPU_FIELDS = (
    "index", "uuid", "name", "memory.used", "memory.total", "display_active", "display_mode",
)
QUERY_APPS_FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")


@dataclass(frozen=True)
class SmiGpuRow:
    index: int
    uuid: str
    name: str
    used_mib: int
    total_mib: int
    display_active: bool | None


@dataclass(frozen=True)
class SmiAppRow:
    gpu_uuid: str
    pid: int
    name: str
    used_mib: int | None


def _csv_fields(line: str) -> list[str]:
    # nvidia-smi's csv has no quoting; names never contain ", " in practice, and the
    # process name is the one field that may hold commas, so it is re-joined by the caller.
    return [f.strip() for f in line.split(",")]


def _int_or_none(text: str) -> int | None:
    # "[N/A]", "[Not Supported]", "N/A" and friends are what WDDM and MIG report.
    try:
        return int(float(text))
    except ValueError:
        return None


def _display(text: str) -> bool | None:
    low = text.strip().lower()
    if low == "enabled":
        return True
    if low == "disabled":
        return False
    return None


def parse_query_gpu(text: str) -> list[SmiGpuRow]:
    """Parse ``nvidia-smi --query-gpu=<QUERY_GPU_FIELDS> --format=csv,noheader,nounits``."""
    rows: list[SmiGpuRow] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = _csv_fields(line)
        if len(fields) < len(QUERY_GPU_FIELDS):
            raise ValueError(f"unexpected nvidia-smi --query-gpu line: {line!r}")
        # The name may itself contain a comma: everything between uuid and the last four.
        index, uuid = fields[0], fields[1]
        used, total, active, mode = fields[-4:]
        name = ", ".join(fields[2:-4])
        used_mib = _int_or_none(used)
        total_mib = _int_or_none(total)
        if used_mib is None or total_mib is None:
            raise ValueError(f"nvidia-smi reports no memory figures: {line!r}")
        shown = [d for d in (_display(active), _display(mode)) if d is not None]
        display = any(shown) if shown else None
        rows.append(SmiGpuRow(int(index), uuid, name, used_mib, total_mib, display))
    return rows


def parse_compute_apps(text: str) -> list[SmiAppRow]:
    """Parse ``nvidia-smi --query-compute-apps=<QUERY_APPS_FIELDS> --format=csv,...``.

    An empty output (or the informational "No running processes found") is no processes.
    """
    rows: list[SmiAppRow] = []
    for line in text.splitlines():
        if not line.strip() or line.lower().startswith("no running"):
            continue
        fields = _csv_fields(line)
        if len(fields) < len(QUERY_APPS_FIELDS):
            raise ValueError(f"unexpected nvidia-smi --query-compute-apps line: {line!r}")
        pid = _int_or_none(fields[1])
        if pid is None:
            continue
        name = ", ".join(fields[2:-1])
        rows.append(SmiAppRow(fields[0], pid, name, _int_or_none(fields[-1])))
    return rows


Runner = Callable[[list[str]], str]


def _run_nvidia_smi(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=15, check=False)
    if done.returncode != 0:
        msg = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(msg[-1] if msg else f"exit status {done.returncode}")
    return done.stdout


class NvidiaSmiProbe:
    """Samples through the ``nvidia-smi`` CLI (two calls per sample, ~50-100 ms each)."""

    source = "nvidia-smi"

    def __init__(
        self,
        index: int,
        executable: str = "nvidia-smi",
        runner: Runner = _run_nvidia_smi,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        self.executable = executable
        self._run = runner
        self._clock = clock

    def _gpu_rows(self) -> list[SmiGpuRow]:
        query = ",".join(QUERY_GPU_FIELDS)
        text = self._run([self.executable, f"--query-gpu={query}", "--format=csv,noheader,nounits"])
        return parse_query_gpu(text)

    def device_count(self) -> int:
        return len(self._gpu_rows())

    def sample(self) -> GpuSample:
        t = self._clock()
        rows = {r.index: r for r in self._gpu_rows()}
        if self.index not in rows:
            raise NoNvidiaGpu(
                f"nvidia-smi lists no GPU with index {self.index} (it lists {sorted(rows)})",
                fix=f"gate a GPU index nvidia-smi lists: {sorted(rows)}",
            )
        gpu = rows[self.index]
        query = ",".join(QUERY_APPS_FIELDS)
        apps = parse_compute_apps(
            self._run(
                [self.executable, f"--query-compute-apps={query}", "--format=csv,noheader,nounits"]
            )
        )
        procs = tuple(
            GpuProcess(a.pid, a.name, a.used_mib) for a in apps if a.gpu_uuid == gpu.uuid
        )
        return GpuSample(
            t, gpu.index, gpu.name, gpu.used_mib, gpu.total_mib, procs, gpu.display_active,
            self.source,
        )

    def close(self) -> None:
        pass


# --- NVML -------------------------------------------------------------------------------------


def _proc_comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class NvmlProbe:
    """Samples through NVML (nvidia-ml-py's ``pynvml``): a few milliseconds per sample."""

    source = "nvml"

    def __init__(self, index: int, nvml: ModuleType) -> None:
        self._nvml = nvml
        self.index = index
        nvml.nvmlInit()
        try:
            count = int(nvml.nvmlDeviceGetCount())
            if count == 0:
                raise NoNvidiaGpu(
                    "NVML loaded but reports no NVIDIA GPU",
                    fix="check the driver and the card with nvidia-smi",
                )
            if not 0 <= index < count:
                raise NoNvidiaGpu(
                    f"NVML reports {count} GPU(s); there is no GPU with index {index}",
                    fix=f"gate a GPU index between 0 and {count - 1}",
                )
            self._handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = nvml.nvmlDeviceGetName(self._handle)
            self.name = name.decode() if isinstance(name, bytes) else str(name)
        except BaseException:
            nvml.nvmlShutdown()
            raise

    def _used_total_mib(self) -> tuple[int, int]:
        nvml = self._nvml
        try:
            # v2 reports driver-reserved memory apart from "used", as nvidia-smi does.
            mem: Any = nvml.nvmlDeviceGetMemoryInfo(self._handle, version=nvml.nvmlMemory_v2)
        except (nvml.NVMLError, AttributeError, TypeError):
            mem = nvml.nvmlDeviceGetMemoryInfo(self._handle)
        return int(mem.used) // MIB, int(mem.total) // MIB

    def _processes(self) -> tuple[GpuProcess, ...]:
        nvml = self._nvml
        found: dict[int, GpuProcess] = {}
        try:
            infos = nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except nvml.NVMLError_FunctionNotFound:
            # Drivers older than the v3 entry point still answer the v2 one.
            infos = nvml.nvmlDeviceGetComputeRunningProcesses_v2(self._handle)
        for info in infos:
            pid = int(info.pid)
            used = info.usedGpuMemory
            name = ""
            try:
                raw = nvml.nvmlSystemGetProcessName(pid)
                name = raw.decode() if isinstance(raw, bytes) else str(raw)
            except nvml.NVMLError:
                name = _proc_comm(pid)
            mib = None if used is None else int(used) // MIB
            found[pid] = GpuProcess(pid, os.path.basename(name), mib)
        return tuple(found.values())

    def _display_active(self) -> bool | None:
        nvml = self._nvml
        answered = False
        # Display *mode* is a monitor attached; display *active* is a desktop initialised on
        # it. Either means the card renders something besides our server (gotcha 31).
        for getter in ("nvmlDeviceGetDisplayActive", "nvmlDeviceGetDisplayMode"):
            try:
                value = int(getattr(nvml, getter)(self._handle))
            except (nvml.NVMLError, AttributeError):
                continue
            answered = True
            if value == 1:
                return True
        return False if answered else None

    def sample(self) -> GpuSample:
        t = time.monotonic()
        used, total = self._used_total_mib()
        return GpuSample(
            t, self.index, self.name, used, total, self._processes(), self._display_active(),
            self.source,
        )

    def close(self) -> None:
        self._nvml.nvmlShutdown()


# --- choosing a source ------------------------------------------------------------------------


def _import_pynvml() -> ModuleType | None:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


def open_probe(index: int = 0, *, prefer: str = "auto") -> GpuProbe:
    """The best available probe for GPU ``index``: NVML, else nvidia-smi.

    ``prefer`` is "auto", "nvml" or "nvidia-smi". Raises :class:`NoNvidiaGpu` with both
    reasons when neither can see a GPU.
    """
    reasons: list[str] = []
    if prefer in ("auto", "nvml"):
        nvml = _import_pynvml()
        if nvml is None:
            reasons.append("nvidia-ml-py (pynvml) is not installed")
        else:
            try:
                return NvmlProbe(index, nvml)
            except NoNvidiaGpu:
                raise
            except Exception as err:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                reasons.append(f"NVML: {err}")
    if prefer in ("auto", "nvidia-smi"):
        exe = shutil.which("nvidia-smi")
        if exe is None:
            reasons.append("nvidia-smi is not on PATH")
        else:
            probe = NvidiaSmiProbe(index, executable=exe)
            try:
                probe.sample()
            except NoNvidiaGpu:
                raise
            except Exception as err:
                reasons.append(f"nvidia-smi: {err}")
            else:
                return probe
    # For a CPU plan the gate reports only the message: there, no GPU is expected.
    raise NoNvidiaGpu(
        "no NVIDIA GPU found (" + "; ".join(reasons) + ")",
        fix="install nvidia-ml-py or put nvidia-smi on PATH, and check the driver with nvidia-smi",
    )


def device_node_holders(index: int, *, self_pid: int | None = None) -> list[tuple[int, str]]:
    """Processes that hold ``/dev/nvidia<index>`` open, by scanning ``/proc/*/fd``.

    NVML lists compute processes by the pid the driver recorded, which names nothing inside
    another PID namespace (a container); this scan names what *this* namespace can see.
    Processes of other users are skipped silently (their fds are unreadable).
    """
    node = f"/dev/nvidia{index}"
    me = os.getpid() if self_pid is None else self_pid
    found: list[tuple[int, str]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == node:
                    found.append((int(entry.name), _proc_comm(int(entry.name))))
                    break
            except OSError:
                continue
    return sorted(found)
