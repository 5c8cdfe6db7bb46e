"""Engines under test: DuckDB (the reference), chDB in-process, Spark local[2] and a real Spark standalone cluster
on 127.0.0.1 (a master and two workers started from the pyspark distribution). Spark tests carry the `engines`
marker (kept out of the default run; .ci/run runs them); chDB is fast enough for the default run.

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
    """Ties, NULL latencies, a model with one request and one with no latency at all, in a run of its own."""
    t0 = datetime(2026, 11, 28, 23, 59, 50)
    rows = []
    for i in range(60):
        model = "tied" if i < 40 else ("single" if i == 40 else "blank")
        ttft = None if model == "blank" or i % 9 == 0 else [0.25, 0.25, 0.5, 1.0, 2.5][i % 5]
        e2e = None if model == "blank" else 1.0 + (i % 7) * 0.5
        labels_finish = "length" if i % 4 == 0 else "stop"
        rows.append(("edge", 1, i + 1, f"e{i}", model, t0 + timedelta(seconds=i * 0.5),
                     None if ttft is None else t0 + timedelta(seconds=i * 0.5 + ttft), ttft, e2e, 10 + i, labels_finish))
    con.executemany(
        "INSERT INTO requests (run, source_id, source_line, request_id, model, t_arrival, t_first_token, ttft_s, e2e_s,"
        " completion_tokens, finish_reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
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
