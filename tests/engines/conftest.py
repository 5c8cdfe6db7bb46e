"""Engines under test: DuckDB (the reference), chDB in-process, Spark local[2] and a real Spark standalone cluster
on 127.0.0.1 (a master and two workers started from the pyspark distribution). Spark tests carry the `engines`
marker (kept out of the default run and CI: `pytest -m engines tests/engines`); chDB is fast enough for the
default run.

The data are real recordings from tests/data/recorded, ingested through the normal path and exported with
`servlens export`, plus a small table of edge cases (ties, NULLs, one point, an empty group).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "data" / "recorded"
# Three real runs with different shapes: a gateway with fallbacks and timeouts, a concurrency ramp with gauges,
# and reasoning responses with length finishes.
RECORDED_RUNS = ("gw-timeout-fallback", "llamacpp-concurrency-ramp", "llamacpp-reasoning-auto")
SPARK_START_TIMEOUT_S = 240


def _edge_rows(con) -> None:
    """Ties, NULL latencies, a model with one request and one with no latency at all, and prompt block hashes
    (attrs.prefix_blocks, some shared, some rows without), in a run of its own."""
    t0 = datetime(2026, 11, 28, 23, 59, 50)
    rows = []
    for i in range(60):
        model = "tied" if i < 40 else ("single" if i == 40 else "blank")
        ttft = None if model == "blank" or i % 9 == 0 else [0.25, 0.25, 0.5, 1.0, 2.5][i % 5]
        e2e = None if model == "blank" else 1.0 + (i % 7) * 0.5
        labels_finish = "length" if i % 4 == 0 else "stop"
        blocks = None if i % 6 == 5 else f'{{"prefix_blocks": [{i % 3}, {100 + i % 5}, {1000 + i}]}}'
        rows.append(("edge", 1, i + 1, f"e{i}", model, t0 + timedelta(seconds=i * 0.5),
                     None if ttft is None else t0 + timedelta(seconds=i * 0.5 + ttft), ttft, e2e, 10 + i, labels_finish,
                     blocks))
    con.executemany(
        "INSERT INTO requests (run, source_id, source_line, request_id, model, t_arrival, t_first_token, ttft_s, e2e_s,"
        " completion_tokens, finish_reason, attrs) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    con.executemany(
        "INSERT INTO metric_samples (run, source_id, ts, name, name_raw, type, series, le, labels, value) "
        "VALUES ('edge', 2, ?, 'vllm:num_requests_waiting', 'vllm:num_requests_waiting', 'gauge', 'value', NULL, "
        "MAP {'model_name': 'tied', 'engine': '0'}, ?)", [(t0 + timedelta(seconds=5 * k), float(k % 3)) for k in range(8)])


@pytest.fixture(scope="session")
def recorded_store(tmp_path_factory) -> Path:
    """A store holding three real recorded runs and the edge-case run."""
    from servlens.analysis.inputs import ingest_paths
    from servlens.store.schema import open_store

    path = tmp_path_factory.mktemp("engines") / "store.duckdb"
    con = open_store(path)
    try:
        for name in RECORDED_RUNS:
            ingest_paths(con, [str(RECORDED / name)], [], run=name)
        _edge_rows(con)
    finally:
        con.close()
    return path


@pytest.fixture(scope="session")
def export_dir(recorded_store, tmp_path_factory) -> Path:
    from servlens.store.export import export_parquet
    from servlens.store.schema import open_store

    folder = tmp_path_factory.mktemp("export") / "servlens"
    con = open_store(recorded_store, read_only=True)
    try:
        export_parquet(con, folder)
    finally:
        con.close()
    return folder


def _bound(url: str, export_dir: Path):
    from servlens.engines import TableSource, open_engine

    engine = open_engine(url)
    engine.bind(TableSource.parse(f"parquet:{export_dir}"))
    return engine


@pytest.fixture(scope="session")
def duckdb_engine(export_dir):
    engine = _bound("duckdb", export_dir)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def chdb_engine(export_dir):
    pytest.importorskip("chdb", reason="chdb is not installed (pip install 'servlens[engines]')")
    engine = _bound("chdb", export_dir)
    yield engine
    engine.close()


def _need_spark():
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'servlens[engines]')")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17+, and no java is on PATH (nor JAVA_HOME set)")


_SPARK_SESSION: dict = {}


def _spark_engine(url: str, export_dir: Path):
    """One live Spark session per process: pyspark allows one SparkContext, so local[2] and the cluster take
    turns (the one asked for replaces the other)."""
    current = _SPARK_SESSION.get("engine")
    if current is not None and current.url == url:
        return current
    if current is not None:
        current.close()
        _SPARK_SESSION.clear()
    engine = _bound(url, export_dir)
    _SPARK_SESSION["engine"] = engine
    return engine


@pytest.fixture(scope="session", autouse=True)
def _stop_spark():
    yield
    engine = _SPARK_SESSION.pop("engine", None)
    if engine is not None:
        engine.close()


@pytest.fixture
def spark_local_engine(export_dir):
    _need_spark()
    return _spark_engine("spark:local[2]", export_dir)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(predicate, timeout_s: float, what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    tail = "\n".join(p.read_text(errors="replace")[-1500:] for p in logs if p.exists())
    raise RuntimeError(f"{what} did not come up within {timeout_s:.0f} s:\n{tail}")


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    """A real standalone cluster on 127.0.0.1: a master and two workers (1 core, 1 GB each) from the pyspark
    distribution's spark-class, torn down (process groups killed) whatever happens. Yields the master URL."""
    _need_spark()
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    spark_class = spark_home / "bin" / "spark-class"
    logs = tmp_path_factory.mktemp("spark-cluster")
    env = os.environ | {"SPARK_HOME": str(spark_home), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(logs),
                        "SPARK_WORKER_DIR": str(logs / "work")}
    master_port, master_ui = _free_port(), _free_port()
    url = f"spark://127.0.0.1:{master_port}"
    procs: list[subprocess.Popen] = []

    def start(args: list[str], log: Path) -> None:
        procs.append(subprocess.Popen([str(spark_class), *args], env=env, stdout=log.open("w"),
                                      stderr=subprocess.STDOUT, start_new_session=True))

    try:
        start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(master_port),
               "--webui-port", str(master_ui)], logs / "master.log")
        _wait_for(lambda: "Successfully started service 'sparkMaster'" in (logs / "master.log").read_text()
                  or "I have been elected leader" in (logs / "master.log").read_text(),
                  SPARK_START_TIMEOUT_S, "the Spark master", [logs / "master.log"])
        for k in range(2):
            start(["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                   "--webui-port", str(_free_port()), url], logs / f"worker{k}.log")
        worker_logs = [logs / f"worker{k}.log" for k in range(2)]
        _wait_for(lambda: all("Successfully registered with master" in p.read_text() for p in worker_logs),
                  SPARK_START_TIMEOUT_S, "two Spark workers", worker_logs)
        yield {"url": url, "logs": logs, "workers": 2}
    finally:
        engine = _SPARK_SESSION.get("engine")
        if engine is not None and engine.url == url:
            engine.close()
            _SPARK_SESSION.clear()
        for proc in procs:
            try:
                os.killpg(proc.pid, 15)
            except ProcessLookupError:
                pass
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)


@pytest.fixture
def spark_cluster_engine(spark_cluster, export_dir):
    return _spark_engine(spark_cluster["url"], export_dir)


# A ClickHouse server on loopback, when the package registries give one servlens can talk to. Debian bookworm's
# clickhouse-server is 18.16.1 (2018): clickhouse-connect cannot talk to it (its settings probe fails with
# "Unknown identifier: readonly") and it lacks DateTime64, Map and window functions; the fixture says so and skips.
CLICKHOUSE_MIN_MAJOR = 23


def _clickhouse_version(port: int) -> str | None:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/?query=SELECT%20version()", timeout=2) as reply:
            return reply.read().decode().strip()
    except OSError:
        return None


@pytest.fixture(scope="session")
def clickhouse_server(tmp_path_factory, export_dir):
    """clickhouse-server on 127.0.0.1 with the export under its user_files_path; yields the engine URL."""
    binary = shutil.which("clickhouse-server") or shutil.which("clickhouse")
    if binary is None:
        pytest.skip("no clickhouse-server binary on PATH (apt-get install clickhouse-server, or ClickHouse's own "
                    "packages); chDB covers ClickHouse SQL in-process")
    root = tmp_path_factory.mktemp("clickhouse")
    http_port, tcp_port, inter_port = _free_port(), _free_port(), _free_port()
    args = [binary] + (["server"] if Path(binary).name == "clickhouse" else [])
    config = Path("/etc/clickhouse-server/config.xml")
    args += ([f"--config-file={config}"] if config.exists() else []) + [
        "--", f"--path={root}/data/", f"--tmp_path={root}/tmp/", f"--user_files_path={export_dir.parent}/",
        f"--format_schema_path={root}/schemas/", f"--http_port={http_port}", f"--tcp_port={tcp_port}",
        f"--interserver_http_port={inter_port}", "--listen_host=127.0.0.1", f"--logger.log={root}/server.log",
        f"--logger.errorlog={root}/error.log"]
    log = (root / "stdout.log").open("w")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        version = None
        while time.monotonic() < deadline and version is None and proc.poll() is None:
            time.sleep(0.5)
            version = _clickhouse_version(http_port)
        if version is None:
            pytest.skip(f"{binary} did not answer on 127.0.0.1:{http_port} within 60 s (see {root})")
        major = int(version.split(".")[0])
        if major < CLICKHOUSE_MIN_MAJOR:
            pytest.skip(f"the clickhouse-server the package registry gives is {version}: too old for servlens "
                        f"(clickhouse-connect's settings probe fails on it; no DateTime64, Map or window functions); "
                        f"needs {CLICKHOUSE_MIN_MAJOR}.x or newer")
        yield {"url": f"clickhouse://127.0.0.1:{http_port}/default", "version": version, "export": export_dir}
    finally:
        try:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
        log.close()


@pytest.fixture(scope="session")
def clickhouse_server_engine(clickhouse_server):
    """The export loaded into MergeTree tables of the server (read from its user_files_path), bound by name."""
    from servlens.engines import TableSource, open_engine

    engine = open_engine(clickhouse_server["url"])
    name = clickhouse_server["export"].name
    engine.execute("CREATE DATABASE IF NOT EXISTS servlens")
    for table in ("requests", "metric_samples"):
        engine.execute(f"CREATE TABLE IF NOT EXISTS servlens.{table} ENGINE = MergeTree ORDER BY tuple() AS "
                       f"SELECT * FROM file('{name}/{table}/**/*.parquet', Parquet) "
                       "SETTINGS use_hive_partitioning = 0")
    engine.bind(TableSource.parse("servlens.requests"))
    yield engine
    engine.close()
