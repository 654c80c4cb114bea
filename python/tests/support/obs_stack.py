"""Real processes for the observability tests: a vLLM CPU server, the exporter, Prometheus.

Every process is started in its own session so that stopping it takes its children with it
(vLLM's EngineCore and workers); every ``start_*`` returns an object whose ``stop`` is safe
to call twice. Ports come from this area's range, 18500-18599.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from qwen3090.localserver import LocalServer, start_server

REPO = Path(__file__).resolve().parents[3]
PROM_DIR = REPO / "modules" / "prometheus"
RULES = PROM_DIR / "rules.yml"
RULE_TESTS = PROM_DIR / "rules.test.yml"
SCRAPE_CONFIG = PROM_DIR / "scrape-config.yml"
DATA = Path(__file__).resolve().parents[1] / "unit" / "data"


def tool(name: str) -> str:
    """The path of a Debian tool the tests run, or a skip naming the package to install."""
    exe = shutil.which(name)
    if exe is None:
        pytest.skip(f"{name} is not installed (Debian: apt-get install prometheus); .ci/run does")
    return exe


def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    """GET without raising on HTTP errors; (0, b"") when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()
    except (OSError, urllib.error.URLError):
        return 0, b""


def http_post_json(
    url: str, body: Mapping[str, Any], api_key: str | None = None, timeout_s: float = 120.0
) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return int(err.code), {"error": err.read().decode("utf-8", "replace")}


def wait_until(
    what: str, check: Callable[[], bool], timeout_s: float, step_s: float = 0.5
) -> float:
    """Poll ``check`` until it is true; the seconds it took. Fails the test on timeout."""
    start = time.monotonic()
    while True:
        if check():
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(step_s)


def _stop_session(proc: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
    """SIGTERM the process's session (its own group), then SIGKILL what is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    # Children (EngineCore, workers) may outlive the leader: the group is swept regardless.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.wait(timeout=10)


def descendants(pid: int) -> list[int]:
    """All descendant pids of ``pid`` (from /proc), breadth first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The comm field may hold spaces and parentheses: the ppid follows the LAST ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    queue = [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            out.append(child)
            queue.append(child)
    return out


def process_name(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


def find_engine_core(root_pid: int) -> int:
    """The pid of vLLM's engine core process under ``root_pid`` (comm ``VLLM::EngineCor``)."""
    found = [p for p in descendants(root_pid) if process_name(p).startswith("VLLM::EngineCor")]
    if len(found) != 1:
        names = {p: process_name(p) for p in descendants(root_pid)}
        pytest.fail(f"expected one EngineCore process under {root_pid}, found: {names}")
    return found[0]


# --- vLLM CPU server -------------------------------------------------------------------------


@dataclass
class Server:
    local: LocalServer
    api_key: str
    model: str
    api_key_file: Path

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.local.process

    @property
    def base_url(self) -> str:
        return self.local.base_url

    @property
    def log_path(self) -> Path:
        return self.local.log_path

    def stop(self) -> None:
        self.local.stop()

    def wait_healthy(self, timeout_s: float) -> float:
        return self.local.wait_healthy(timeout_s)


def start_cpu_server(
    model_dir: Path, port: int, workdir: Path, extra_env: Mapping[str, str] | None = None
) -> Server:
    """A real vLLM 0.28.0 CPU server of our own (not the shared ``cpu_server``), started the
    way a user starts the CPU tier: ``qwen3090 serve --device cpu`` with the knobs in the
    environment, prefix caching on and an API key."""
    api_key = "obs-test-key"
    key_file = workdir / "api-key"
    key_file.write_text(api_key + "\n")
    env = dict(os.environ)
    for knob in ("SPEC", "CTX", "KV_MEM", "EXTRA_ARGS", "API_KEY_FILE", "HOST"):
        env.pop(knob, None)  # a developer's shell must not change what the test serves
    env.update(
        MODEL=str(model_dir),
        PREFIX_CACHE="1",
        PORT=str(port),
        VLLM_API_KEY=api_key,
        VLLM_CPU_KVCACHE_SPACE="1",
    )
    env.update(extra_env or {})
    argv = [sys.executable, "-m", "qwen3090", "serve", "--device", "cpu", "--no-gate"]
    local = start_server(argv, env, port, workdir / "vllm.log")
    return Server(local, api_key, "qwen3.8-27b", key_file)


# --- the exporter ----------------------------------------------------------------------------


@dataclass
class ExporterProc:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def stop(self) -> None:
        _stop_session(self.proc, grace_s=10)

    def metrics_text(self) -> str:
        status, body = http_get(f"{self.url}/metrics")
        assert status == 200, f"exporter /metrics answered {status}"
        return body.decode()

    def sample(self, name: str) -> float | None:
        """The value of an unlabelled sample in the exporter's current output."""
        for line in self.metrics_text().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None


def start_exporter(
    server: Server,
    port: int,
    workdir: Path,
    interval_s: float,
    timeout_s: float,
    extra: tuple[str, ...] = (),
) -> ExporterProc:
    log_path = workdir / "exporter.log"
    argv = [
        sys.executable, "-m", "qwen3090", "exporter",
        "--server", server.base_url, "--api-key-file", str(server.api_key_file),
        "--interval", str(interval_s), "--timeout", str(timeout_s),
        "--host", "127.0.0.1", "--port", str(port), "--server-log", str(server.log_path),
        *extra,
    ]  # fmt: skip
    env = dict(os.environ)
    env.pop("VLLM_API_KEY", None)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    exp = ExporterProc(proc, f"http://127.0.0.1:{port}", log_path)

    def serving() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"exporter exited with {proc.returncode}:\n{log_path.read_text()}")
        return http_get(f"{exp.url}/metrics", 2.0)[0] == 200

    wait_until("the exporter's /metrics", serving, 30)
    return exp


# --- Prometheus ------------------------------------------------------------------------------


def render_prometheus_config(
    vllm_target: str, exporter_target: str, interval: str, rules: Path
) -> dict[str, Any]:
    """The shipped scrape-config.yml with the test's targets and intervals.

    The jobs (names, paths, labels) stay exactly as shipped, so the alerts that select on the
    job label are exercised against the configuration users get.
    """
    config: dict[str, Any] = yaml.safe_load(SCRAPE_CONFIG.read_text())
    config["global"] = {"scrape_interval": interval, "evaluation_interval": interval}
    config["rule_files"] = [str(rules)]
    targets = {"qwen3090-vllm": vllm_target, "qwen3090-exporter": exporter_target}
    for job in config["scrape_configs"]:
        job["scrape_interval"] = interval
        job["scrape_timeout"] = interval
        for static in job["static_configs"]:
            static["targets"] = [targets[job["job_name"]]]
    return config


@dataclass
class PrometheusProc:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def stop(self) -> None:
        _stop_session(self.proc, grace_s=10)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query through the HTTP API: the result vector."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        status, body = http_get(url)
        assert status == 200, f"query {expr!r}: HTTP {status} {body[:300]!r}"
        data = json.loads(body)
        assert data["status"] == "success", data
        result: list[dict[str, Any]] = data["data"]["result"]
        return result

    def values(self, expr: str) -> list[float]:
        return [float(r["value"][1]) for r in self.query(expr)]

    def wait_values(
        self, expr: str, ok: Callable[[list[float]], bool], what: str, timeout_s: float
    ) -> list[float]:
        seen: list[float] = []

        def check() -> bool:
            nonlocal seen
            seen = self.values(expr)
            return ok(seen)

        try:
            wait_until(what, check, timeout_s)
        except pytest.fail.Exception:
            pytest.fail(f"{what}: {expr!r} last returned {seen} after {timeout_s:.0f} s")
        return seen


def start_prometheus(config: Mapping[str, Any], port: int, workdir: Path) -> PrometheusProc:
    exe = tool("prometheus")
    cfg_path = workdir / "prometheus.yml"
    cfg_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    log_path = workdir / "prometheus.log"
    argv = [
        exe,
        f"--config.file={cfg_path}",
        f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1h",
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    prom = PrometheusProc(proc, f"http://127.0.0.1:{port}", log_path)

    def ready() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"prometheus exited with {proc.returncode}:\n{log_path.read_text()}")
        return http_get(f"{prom.url}/-/ready", 2.0)[0] == 200

    wait_until("Prometheus ready", ready, 60)
    return prom


def rule_exprs() -> dict[str, str]:
    """alert or record name -> its PromQL expression, from the shipped rules.yml."""
    doc = yaml.safe_load(RULES.read_text())
    out: dict[str, str] = {}
    for group in doc["groups"]:
        for rule in group["rules"]:
            out[rule.get("alert") or rule["record"]] = " ".join(rule["expr"].split())
    return out
