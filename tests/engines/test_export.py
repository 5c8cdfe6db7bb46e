"""`servlens export --parquet DIR` round-trips: read back as `--table parquet:DIR` binds it, every row and value of
requests and metric_samples equals the store's, and the folders are the run/day partitions."""

from __future__ import annotations

import json

from servlens.cli import cli
from servlens.engines import TableSource, open_engine
from servlens.engines.base import export_runs, partition_value
from servlens.store.schema import REQUEST_COLUMNS, open_store

from .conftest import RECORDED_RUNS

ORDER = {"requests": "run, source_id, source_line, request_id", "metric_samples": "run, ts, source_id, name, series, le, value"}


def _rows(con, table):
    cursor = con.execute(f"SELECT * FROM {table} ORDER BY {ORDER[table]}")
    names = [d[0] for d in cursor.description]
    return names, cursor.fetchall()


def test_export_round_trips_every_row(recorded_store, export_dir):
    store = open_store(recorded_store, read_only=True)
    engine = open_engine("duckdb")
    engine.bind(TableSource.parse(f"parquet:{export_dir}"))
    try:
        for table in ("requests", "metric_samples"):
            names, expected = _rows(store, table)
            got_names, got = _rows(engine.con, table)
            assert got_names == names
            assert len(got) == len(expected) > 0
            assert got == expected
        assert list(REQUEST_COLUMNS) == _rows(engine.con, "requests")[0]
    finally:
        engine.close()
        store.close()


def test_export_is_partitioned_by_run_and_day(export_dir):
    runs = sorted(RECORDED_RUNS + ("edge",))
    assert export_runs(export_dir) == runs
    days = sorted(p.name for p in (export_dir / "requests" / "run=edge").iterdir())
    assert days == ["day=2026-11-28", "day=2026-11-29"]  # the edge run crosses midnight
    manifest = json.loads((export_dir / "_servlens.json").read_text())
    assert manifest["runs"]["edge"]["requests"] == 60
    assert manifest["runs"]["edge"]["metric_samples"] == 8
    assert manifest["runs"]["gw-timeout-fallback"]["sources"][0]["format"]


def test_an_export_reads_only_the_runs_asked_for(export_dir):
    engine = open_engine("duckdb")
    engine.bind(TableSource.parse(f"parquet:{export_dir}"), runs=["edge"])
    try:
        assert engine.query("SELECT DISTINCT run FROM requests") == [{"run": "edge"}]
    finally:
        engine.close()


def test_run_names_are_percent_encoded_in_folders():
    assert partition_value("prod/11-28 a=b") == "prod%2F11-28 a%3Db"


def test_export_command(recorded_store, tmp_path, cli_runner):
    out = tmp_path / "out"
    result = cli_runner.invoke(cli, ["export", "--db", str(recorded_store), "--parquet", str(out), "--run", "edge"])
    assert result.exit_code == 0, result.output
    assert "edge: 60 requests, 8 metric samples" in result.output
    assert export_runs(out) == ["edge"]
    again = cli_runner.invoke(cli, ["export", "--db", str(recorded_store), "--parquet", str(out), "--run", "edge"])
    assert again.exit_code == 0
    assert len(list((out / "requests").rglob("*.parquet"))) == 2  # replaced, not appended


def test_export_of_an_unknown_run_is_one_sentence(recorded_store, tmp_path):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "servlens", "export", "--db", str(recorded_store), "--parquet",
                             str(tmp_path / "o"), "--run", "nope"], check=False, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.startswith("Error: No run named 'nope' in the store")
    assert "Traceback" not in result.stderr


def test_a_row_without_a_time_goes_to_the_null_day_and_reads_back(tmp_path):
    """A request with no time at all is exported under day=__HIVE_DEFAULT_PARTITION__ and binds back with the rest;
    each day is its own sorted file (one sorted partitioned COPY ran out of memory on a 10M-request day)."""
    from datetime import datetime

    from servlens.store.export import export_parquet

    con = open_store(None)
    con.executemany("INSERT INTO requests (run, source_id, source_line, request_id, t_arrival) VALUES (?, 1, ?, ?, ?)",
                    [("r1", 3, "late", datetime(2026, 11, 28, 9)), ("r1", 1, "timeless", None),
                     ("r1", 2, "early", datetime(2026, 11, 27, 23))])
    export_parquet(con, tmp_path / "out")
    con.close()
    run_dir = tmp_path / "out" / "requests" / "run=r1"
    assert sorted(p.name for p in run_dir.iterdir()) == ["day=2026-11-27", "day=2026-11-28",
                                                          "day=__HIVE_DEFAULT_PARTITION__"]
    assert all([f.name for f in d.iterdir()] == ["data_0.parquet"] for d in run_dir.iterdir())
    engine = open_engine("duckdb")
    engine.bind(TableSource.parse(f"parquet:{tmp_path / 'out'}"))
    try:
        assert engine.query("SELECT request_id FROM requests ORDER BY source_line") == [
            {"request_id": "timeless"}, {"request_id": "early"}, {"request_id": "late"}]
    finally:
        engine.close()


def test_chdb_reads_a_file_without_a_null_as_nullable_columns(tmp_path):
    """A counter series' first sample has no previous value on every engine. ClickHouse's default schema inference
    made a column Nullable only where the file held a NULL: an export file of samples that all had a value read
    `value` as Float64, and lag() gave 0 for the first sample (an increase from zero, a restart that never was)."""
    from datetime import datetime

    from servlens.store.export import export_parquet

    con = open_store(None)
    con.executemany("INSERT INTO metric_samples (run, source_id, ts, name, name_raw, type, series, labels, value) "
                    "VALUES ('r1', 1, ?, 'c', 'c_total', 'counter', 'value', MAP {}, ?)",
                    [(datetime(2026, 11, 28, 9, 0, s), v) for s, v in ((0, 70.0), (1, 76.0), (2, 79.0))])
    export_parquet(con, tmp_path / "out")
    con.close()
    engine = open_engine("chdb")
    engine.bind(TableSource.parse(f"parquet:{tmp_path / 'out'}"))
    try:
        assert engine.query("SELECT lag(value) OVER (ORDER BY ts) AS prev FROM metric_samples ORDER BY ts") == [
            {"prev": None}, {"prev": 70.0}, {"prev": 76.0}]
    finally:
        engine.close()
