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

