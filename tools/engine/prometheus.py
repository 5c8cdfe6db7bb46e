"""Start and stop real metric servers on 127.0.0.1 scraping given targets: Prometheus (Debian's `prometheus`
package) and VictoriaMetrics (Debian's `victoria-metrics`), from one generated scrape config.

    prom = start_prometheus(["127.0.0.1:8081"], workdir, interval_s=1.0)   # waits until ready
    vm = start_prometheus(["127.0.0.1:8081"], workdir2, kind="victoria-metrics")
    prom.wait_for_scrape(after=time.time())                                 # a scrape that began after a
        moment
    prom.stop()                                                             # by its PID: SIGTERM, then
        SIGKILL
    servers, runs = run_scraped("burst", out, workdir, kinds=("prometheus", "victoria-metrics"))

The config is generated (one job `llamacpp`, the given interval and static targets); the data lives in
`workdir`, so a stopped server leaves nothing running and nothing outside that folder. A target may be down
when the server starts (the engine comes up later): it keeps trying every interval."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import requests

PROMETHEUS_ENV = "SERVLENS_PROMETHEUS_BIN"  # another binary (a newer Prometheus) instead of the one on PATH
JOB = "llamacpp"


def prometheus_binary() -> str | None:
    """The prometheus executable: $SERVLENS_PROMETHEUS_BIN, else `prometheus` on PATH (Debian: /usr/bin)."""
    return os.environ.get(PROMETHEUS_ENV) or shutil.which("prometheus")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def config_text(targets: list[str], interval_s: float, job: str = JOB) -> str:
    interval = f"{int(interval_s * 1000)}ms"
    listed = ", ".join(f'"{t}"' for t in targets)
    return (
        f"global:\n  scrape_interval: {interval}\n  scrape_timeout: {interval}\n  evaluation_interval: 1m\n"
        f"scrape_configs:\n  - job_name: {job}\n    scrape_interval: {interval}\n    scrape_timeout: "
        f"{interval}\n"
        f"    static_configs:\n      - targets: [{listed}]\n"
    )


@dataclass
class RunningPrometheus:
    pid: int
    url: str
    workdir: Path
    targets: list[str]
    interval_s: float
    kind: str = "prometheus"  # or "victoria-metrics"
    _proc: subprocess.Popen | None = field(default=None, repr=False)

    def targets_info(self) -> list[dict]:
        answer = requests.get(self.url + "/api/v1/targets", timeout=5).json()
        return answer["data"]["activeTargets"]

    def wait_for_scrape(self, after: float, timeout: float = 30.0, healthy: bool = True) -> dict:
        """Wait until every target was scraped at or after `after` (Unix s); successfully, with `healthy`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.targets_info()
            done = [
                t
                for t in info
                if _unix(t.get("lastScrape")) >= after and (t.get("health") == "up" or not healthy)
            ]
            if info and len(done) == len(info):
                return {t["scrapeUrl"]: t for t in info}
            time.sleep(0.2)
        raise TimeoutError(f"Prometheus did not scrape {self.targets} after {after} within {timeout:.0f} s")

    def stop(self, timeout: float = 10.0) -> None:
        _RUNNING.pop(self.pid, None)
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        if self._proc is not None:
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self._proc.wait(5)

    def __enter__(self) -> RunningPrometheus:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


_RUNNING: dict[int, RunningPrometheus] = {}


def _unix(text: str | None) -> float:
    """RFC 3339 with nanoseconds (Prometheus) or a dot-less fraction (VictoriaMetrics 1.79), as Unix s."""
    match = re.fullmatch(r"(.*?T\d\d:\d\d:\d\d)(?:\.?(\d+))?(Z|[+-]\d\d:\d\d)", (text or "").strip())
    if not match:
        return 0.0
    head, fraction, zone = match.groups()
    moment = datetime.fromisoformat(head + ("+00:00" if zone == "Z" else zone))
    return moment.timestamp() + (float("0." + fraction) if fraction else 0.0)


# The servers this harness can start: (binary finder, argv, readiness path). Both read the same scrape config.
SERVERS = ("prometheus", "victoria-metrics")


def server_binary(kind: str = "prometheus") -> str | None:
    """The binary of `kind`: prometheus ($SERVLENS_PROMETHEUS_BIN, else PATH) or victoria-metrics (PATH)."""
    return prometheus_binary() if kind == "prometheus" else shutil.which("victoria-metrics")


def _argv(kind: str, binary: str, config: Path, data: Path, port: int) -> list[str]:
    if kind == "prometheus":
        return [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ]
    # VictoriaMetrics hides the last 30 s from range queries by default (-search.latencyOffset): a test reads
    # at once.
    return [
        binary,
        f"-promscrape.config={config}",
        f"-storageDataPath={data}",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-search.latencyOffset=0s",
        "-retentionPeriod=1d",
        "-loggerLevel=ERROR",
        "-promscrape.config.strictParse=false",
    ]


def start_prometheus(
    targets: list[str],
    workdir: Path,
    interval_s: float = 1.0,
    port: int | None = None,
    ready_timeout: float = 30.0,
    kind: str = "prometheus",
) -> RunningPrometheus:
    """Start Prometheus (or VictoriaMetrics, `kind`) on 127.0.0.1:`port` (a free one by default) scraping
    `targets` every `interval_s`."""
    binary = server_binary(kind)
    if binary is None:
        raise FileNotFoundError(f"no {kind} binary (apt-get install {kind})")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(config_text(targets, interval_s), encoding="utf-8")
    port = port or free_port()
    with open(workdir / f"{kind}.log", "ab") as log:
        proc = subprocess.Popen(
            _argv(kind, binary, config, workdir / "data", port), stdout=log, stderr=log, cwd=str(workdir)
        )
    server = RunningPrometheus(
        proc.pid, f"http://127.0.0.1:{port}", workdir, list(targets), interval_s, kind, proc
    )
    _RUNNING[proc.pid] = server
    ready = "/-/ready" if kind == "prometheus" else "/health"
    deadline = time.monotonic() + ready_timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{kind} exited with code {proc.returncode} (log: {workdir / f'{kind}.log'})"
                )
            try:
                if requests.get(server.url + ready, timeout=2).status_code == 200:
                    return server
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{kind} was not ready within {ready_timeout:.0f} s")
    except BaseException:
        server.stop()
        raise


def run_scraped(
    scenario: str,
    out_dir: Path,
    workdir: Path,
    interval_s: float = 1.0,
    log=print,
    kinds: tuple[str, ...] = ("prometheus",),
) -> tuple[dict[str, RunningPrometheus], list[dict]]:
    """Run a scenario's runs (tools.engine.scenarios) with real metric servers (`kinds`: prometheus,
    victoria-metrics) scraping each engine beside the harness's own scraper; each engine stays up until every
    server has scraped it after its load ended. Returns the still running servers by kind (the caller stops
    them) and the run summaries."""
    from dataclasses import replace

    from .scenarios import SCENARIOS, run_one

    spec_of = SCENARIOS[scenario]
    ports = [free_port() for _ in spec_of.runs]
    started = time.time()
    servers: dict[str, RunningPrometheus] = {}
    summaries = []

    def scraped_after(moment: float) -> None:
        for server in servers.values():
            server.wait_for_scrape(moment, healthy=False)

    try:
        for kind in kinds:
            servers[kind] = start_prometheus(
                [f"127.0.0.1:{port}" for port in ports], Path(workdir) / kind, interval_s, kind=kind
            )
        # Prometheus applies new targets on a 5 s tick: wait until the scrape loops run (the engines are not
        # up
        # yet, so the first tries fail), so that the load's first seconds are scraped too.
        scraped_after(started)
        for port, spec in zip(ports, spec_of.runs):
            spec = replace(spec, server=replace(spec.server, port=port))
            summaries.append(
                run_one(
                    spec,
                    Path(out_dir),
                    spec_of,
                    None,
                    1234,
                    log,
                    before_stop=lambda: scraped_after(time.time()),
                )
            )
            # One failed scrape after the engine stopped: the series are then marked stale, so a range query
            # does
            # not carry the last values on for its 5-minute lookback.
            scraped_after(time.time())
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers, summaries


def stop_all() -> None:
    """Stop every Prometheus this process started (by PID)."""
    for server in list(_RUNNING.values()):
        server.stop(timeout=5)


atexit.register(stop_all)
