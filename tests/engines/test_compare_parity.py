"""`servlens compare` where the data is: the same document on the store, on DuckDB reading the export and on chDB.

Real recorded pairs (llama.cpp behind the harness in tools/engine, and LiteLLM in front of it), 40–136 requests a
side, each with the verdict its raw numbers call for (tests/compare/test_real_pairs.py has the numbers):

- prefix cache off → on under docs/canary-policy.toml: pass (TTFT falls ×20);
- prefix cache on → off: fail on TTFT; poisson → burst50: fail on e2e latency (×9.6 at p80);
- gw-healthy → gw-timeout-fallback (LiteLLM's own log, one row an attempt): fail on the error rate (37 attempts
  timed out), the after run with a second model (the fallback group);
- steady-a against a second ingest of itself: the runs cover the same hours, so the time batches are paired
  time-of-day windows (the other pairs are unpaired): inconclusive.

The documents are compared whole (apart from generated_at and coverage.engine): every gate's estimate, interval,
p-value, verdict, chart point and sentence. The engines return only aggregates: per cohort and time batch the bins
of a latency, the sums of the covariate fit, rate counts, the batch cut points and at most 300 scatter points a
side.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from servlens.compare.engine import compare_runs, exit_code
from servlens.compare.policy import load_policy
from servlens.engines.compare import CompareConnection
from servlens.store.schema import open_store

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_logs"
RECORDED = REPO / "tests" / "data" / "recorded"
LLAMACPP = REPO / "tests" / "data" / "shared" / "real-engine" / "llamacpp" / "requests.jsonl"
CANARY = str(REPO / "docs" / "canary-policy.toml")

# (before, after, policy, the verdict the raw numbers call for, how the batches are cut)
PAIRS = [
    ("prefix-cache-off", "prefix-cache-on", CANARY, "pass", "unpaired"),
    ("prefix-cache-on", "prefix-cache-off", None, "fail", "unpaired"),
    pytest.param("poisson", "burst50", None, "fail", "unpaired", marks=pytest.mark.slow, id="poisson-to-burst50"),
    ("gw-healthy", "gw-timeout-fallback", None, "fail", "unpaired"),
    ("steady-a", "steady-a-again", None, "inconclusive", "paired"),
]


@pytest.fixture(scope="module")
def pair_store(tmp_path_factory) -> Path:
    """The pairs' request logs (their scrapes play no part in compare), ingested as a user would."""
    from servlens.ingest.api import ingest_inputs

    path = tmp_path_factory.mktemp("compare-engines") / "store.duckdb"
    con = open_store(path)
    try:
        for name in ("prefix-cache-on", "prefix-cache-off", "steady-a"):
            ingest_inputs(con, [str(SAMPLES / name / "requests.jsonl")], run=name)
        ingest_inputs(con, [str(SAMPLES / "steady-a" / "requests.jsonl")], run="steady-a-again")
        ingest_inputs(con, [str(RECORDED / "gw-healthy" / "litellm_slp.jsonl")], run="gw-healthy")
        ingest_inputs(con, [str(RECORDED / "gw-timeout-fallback" / "litellm_slp.jsonl.zst")], run="gw-timeout-fallback")
        ingest_inputs(con, [str(LLAMACPP)])   # its runs from the recorded run field: poisson, burst50, ...
    finally:
        con.close()
    return path


@pytest.fixture(scope="module")
def pair_export(pair_store, tmp_path_factory) -> Path:
    from servlens.store.export import export_parquet

    folder = tmp_path_factory.mktemp("compare-export") / "servlens"
    con = open_store(pair_store, read_only=True)
    try:
        export_parquet(con, folder)
    finally:
        con.close()
    return folder


def _reference(pair_store, before: str, after: str, policy) -> dict:
    """The reference: compare on the DuckDB store."""
    con = open_store(pair_store, read_only=True)
    try:
        return compare_runs(con, before, after, load_policy(policy))
    finally:
        con.close()


def _strip(doc: dict) -> dict:
    doc = json.loads(json.dumps(doc))
    doc.pop("generated_at")
    doc["coverage"].pop("engine", None)
    return doc


def _differences(got, want, path: str = "") -> list[str]:
    if isinstance(got, dict) and isinstance(want, dict):
        return [d for k in sorted(set(got) | set(want), key=str)
                for d in _differences(got.get(k), want.get(k), f"{path}.{k}")]
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in _differences(g, w, f"{path}[{i}]")]
    return [] if got == want else [f"{path}: {got!r:.120} vs {want!r:.120}"]


def compare_on(engine, export: Path, before: str, after: str, policy) -> tuple[dict, list[tuple[str, int]]]:
    """compare_runs through the engine adapter, as compare_where_the_data_is runs it, and the queries it sent."""
    from servlens.engines import TableSource
    from servlens.engines.analysis import engine_manifest

    engine.bind(TableSource.parse(f"parquet:{export}"), [before, after])
    first = len(engine.stats.log)
    doc = compare_runs(CompareConnection(engine, engine_manifest(engine), (before, after)), before, after, policy)
    doc["coverage"]["engine"] = engine.describe() | {"rows_moved": sum(n for _, n in engine.stats.log[first:])}
    return doc, engine.stats.log[first:]


def check_compare_parity(engine, export: Path, reference: dict, before: str, after: str, policy) -> dict:
    """The pair on the engine: the store's document exactly (apart from generated_at and coverage.engine), and what
    moved."""
    doc, log = compare_on(engine, export, before, after, load_policy(policy))
    differences = _differences(_strip(doc), _strip(reference))
    assert not differences, f"{before} → {after} on {engine.name}:\n" + "\n".join(differences[:20])
    assert exit_code(doc) == exit_code(reference)
    moved = {"pair": (before, after), "log": log, "doc": doc,
             "requests": doc["before"]["requests"] + doc["after"]["requests"]}
    _bounded(moved)
    return moved


def _real_numbers(reference: dict, before: str, after: str) -> None:
    """Each pair judges what its raw numbers call for (the parity then covers estimates, intervals and p-values
    that matter)."""
    gates = {g["id"]: g for g in reference["gates"]}
    if (before, after) == ("prefix-cache-off", "prefix-cache-on"):
        assert reference["reason"] == "All 2 critical gates pass."
    elif (before, after) == ("prefix-cache-on", "prefix-cache-off"):
        assert reference["reason"].startswith(
            "4 gates failed: roll back: TTFT p50 (covariate-adjusted over 1 cohort) rose ×21.5")
    elif (before, after) == ("poisson", "burst50"):
        e2e = gates["e2e_p99"]
        assert (e2e["verdict"], e2e["judged_at"]) == ("fail", "p80") and e2e["ratio"] > 9 and e2e["ci_low"] > 2.5
    elif (before, after) == ("gw-healthy", "gw-timeout-fallback"):
        assert reference["reason"].startswith("1 gate failed: roll back: error rate (mix-adjusted over 1 cohort) "
                                              "rose 74.00 pp (0.00% → 74.00%)")
        assert reference["after"]["models"] == ["chat", "chat-small"]
    else:
        paired = [g for g in reference["gates"] if g.get("batch_means", {}).get("paired")]
        assert paired and all(g["ratio"] == 1.0 for g in paired)   # the same requests twice: no change


def _bounded(moved: dict) -> None:
    """Only aggregates move. Each query answers with one row (counts, a fit's sums, the batch cuts as one list),
    a row per cohort and side (rates: per batch too), a row per side × batch × cohort × latency bin, or the residual
    chart's sample; none with more rows than the two runs have requests, the sample with at most its 300 a side."""
    from servlens.compare.engine import SCATTER_POINTS

    log = moved["log"]
    assert log and sum(rows for _, rows in log) == moved["doc"]["coverage"]["engine"]["rows_moved"]
    for sql, rows in log:
        if sql.startswith("SELECT ln("):
            assert rows <= SCATTER_POINTS, (moved["pair"], sql)
        elif "quantile_disc" in sql or sql.startswith("SELECT count(*), count(t_arrival)"):
            assert rows == 1, (moved["pair"], sql)
        else:
            assert rows <= moved["requests"], (moved["pair"], sql, rows)


def _pair_id(pair) -> str:
    return pair.id if hasattr(pair, "id") else f"{pair[0]}-to-{pair[1]}"


@pytest.mark.parametrize("before, after, policy, verdict, batches", PAIRS, ids=[_pair_id(p) for p in PAIRS])
def test_compare_is_the_stores_on_duckdb_and_chdb(pair_store, pair_export, before, after, policy, verdict, batches):
    pytest.importorskip("chdb", reason="chdb is not installed (pip install 'servlens[engines]')")
    from servlens.engines import open_engine

    reference = _reference(pair_store, before, after, policy)
    assert reference["verdict"] == verdict, reference["reason"]
    assert reference["method"]["batches"].startswith(batches)
    _real_numbers(reference, before, after)
    with open_engine("duckdb") as engine:
        on_duckdb = check_compare_parity(engine, pair_export, reference, before, after, policy)
    with open_engine("chdb") as engine:
        on_chdb = check_compare_parity(engine, pair_export, reference, before, after, policy)
    # the same aggregates as DuckDB reading the export, query for query
    assert [rows for _, rows in on_chdb["log"]] == [rows for _, rows in on_duckdb["log"]]


@pytest.mark.engines
@pytest.mark.parametrize("before, after, policy, verdict, batches", PAIRS, ids=[_pair_id(p) for p in PAIRS])
def test_compare_is_the_stores_on_spark(pair_store, pair_export, spark_local_engine, export_dir, before, after,
                                        policy, verdict, batches):
    from servlens.engines import TableSource

    try:
        check_compare_parity(spark_local_engine, pair_export, _reference(pair_store, before, after, policy), before,
                             after, policy)
    finally:   # the session's engine is shared with the analyze tests: give it back their export
        spark_local_engine.bind(TableSource.parse(f"parquet:{export_dir}"))


@pytest.mark.engines
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("before, after, policy, verdict, batches", PAIRS, ids=[_pair_id(p) for p in PAIRS])
def test_compare_is_the_stores_on_a_spark_standalone_cluster(pair_store, pair_export, spark_cluster_engine, export_dir,
                                                             before, after, policy, verdict, batches):
    """The same documents from a master and two workers on loopback: the binned counts are aggregated across
    executors, so a bin or a batch cut that depended on one partition's order would show here."""
    from servlens.engines import TableSource

    try:
        check_compare_parity(spark_cluster_engine, pair_export, _reference(pair_store, before, after, policy), before,
                             after, policy)
    finally:
        spark_cluster_engine.bind(TableSource.parse(f"parquet:{export_dir}"))


def _servlens(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servlens", *args], capture_output=True, text=True, check=False,
                          cwd=cwd)


def test_the_issues_commands(tmp_path, monkeypatch, cli_runner):
    """Issue #17's form, word for word: export a store, then compare two of its runs on chDB."""
    from servlens.cli import cli
    from servlens.ingest.api import ingest_inputs

    con = open_store(tmp_path / "store.duckdb")
    try:
        ingest_inputs(con, [str(SAMPLES / "prefix-cache-on" / "requests.jsonl")], run="prod-1127")
        ingest_inputs(con, [str(SAMPLES / "prefix-cache-off" / "requests.jsonl")], run="canary-1128")
    finally:
        con.close()
    monkeypatch.chdir(tmp_path)

    def servlens(line: str):
        return cli_runner.invoke(cli, line.split()[1:], catch_exceptions=False)

    assert servlens("servlens export --db store.duckdb --parquet out/servlens/").exit_code == 0
    on_chdb = servlens("servlens compare --engine chdb --table parquet:out/servlens --before prod-1127 "
                       "--after canary-1128 --format json")
    on_store = servlens("servlens compare --db store.duckdb --before prod-1127 --after canary-1128 --format json")
    assert (on_store.exit_code, on_chdb.exit_code) == (1, 1), on_chdb.output
    want, got = json.loads(on_store.output), json.loads(on_chdb.output)
    engine = got["coverage"]["engine"]
    assert (engine["name"], engine["table"]) == ("chdb", "parquet:out/servlens")
    assert 0 < engine["rows_moved"] < 2000 and engine["queries"] > 10
    assert _strip(got) == _strip(want)
    assert got["verdict"] == "fail"
    assert got["reason"].startswith("4 gates failed: roll back: TTFT p50 (covariate-adjusted over 1 cohort) rose ×21.5")


def test_user_errors_on_an_engine_are_one_sentence(pair_export, tmp_path):
    unknown = _servlens("compare", "--engine", "chdb", "--table", f"parquet:{pair_export}", "--before", "poisson",
                        "--after", "nope", cwd=tmp_path)
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    assert unknown.stderr.startswith(f"Error: The export {pair_export} has no run 'nope' (runs: burst50, ")
    files = _servlens("compare", str(SAMPLES / "steady-a"), str(SAMPLES / "steady-b"), "--engine", "chdb",
                      cwd=tmp_path)
    assert files.returncode == 2
    assert files.stderr.startswith("Error: --engine and --table compare runs where they are, not files")
    slo = _servlens("compare", "--engine", "chdb", "--table", f"parquet:{pair_export}", "--before", "poisson",
                    "--after", "burst50", "--slo", "ttft=2s", cwd=tmp_path)
    assert slo.returncode == 2
    assert slo.stderr.startswith("Error: --slo's goodput gate is computed on DuckDB only, not on chdb")


def test_compares_row_cap_is_its_own_and_leaves_the_engines_analysis_cap(pair_export):
    """compare's binned counts may exceed the analysis cap (a 1M-request pair moved 5.3M rows); the larger cap is the
    compare connection's, so an analysis on the same engine still refuses a detail table."""
    from servlens.engines import TableSource, open_engine
    from servlens.engines.base import MAX_RESULT_ROWS
    from servlens.engines.compare import COMPARE_MAX_ROWS
    from servlens.errors import ConfigError

    with open_engine("duckdb") as engine:
        engine.bind(TableSource.parse(f"parquet:{pair_export}"))
        engine.max_rows = 10
        conn = CompareConnection(engine)
        assert conn.max_rows == COMPARE_MAX_ROWS > MAX_RESULT_ROWS
        assert len(conn.execute("SELECT request_id FROM requests LIMIT 50").fetchall()) == 50
        assert engine.max_rows == 10
        with pytest.raises(ConfigError, match="returned more than 10 rows"):
            engine.query("SELECT request_id FROM requests LIMIT 50")


def test_compares_frames_are_the_stores(pair_store, pair_export, monkeypatch):
    """The frames compare's numpy code reads (cohorts._frame) come from the engine's Arrow result as the store's come
    from DuckDB's: the store's values, in the store's very types on DuckDB reading the export, integers as integers
    on chDB (its own widths: UInt8 sides, UInt64 counts), and an empty result's columns typed. Python rows made
    every integer column Int64 and an empty result's columns untyped (polars' Null)."""
    pytest.importorskip("chdb", reason="chdb is not installed (pip install 'servlens[engines]')")
    from polars.testing import assert_frame_equal

    from servlens.compare import cohorts
    from servlens.engines import open_engine

    before, after = "gw-healthy", "gw-timeout-fallback"   # one of its latency queries answers with no row
    frames: list = []
    frame = cohorts._frame

    def recorded(*args, **kwargs):
        frames.append(frame(*args, **kwargs))
        return frames[-1]

    monkeypatch.setattr(cohorts, "_frame", recorded)

    def in_order(found: list) -> list:
        return [f.sort(f.columns) for f in found]

    _reference(pair_store, before, after, None)
    on_store = in_order(frames)
    found = {}
    for name in ("duckdb", "chdb"):
        frames.clear()
        with open_engine(name) as engine:
            compare_on(engine, pair_export, before, after, load_policy(None))
        found[name] = in_order(frames)
    assert len(on_store) == len(found["duckdb"]) == len(found["chdb"]) > 5
    assert any(f.height == 0 for f in on_store)
    for want, on_duckdb, on_chdb in zip(on_store, found["duckdb"], found["chdb"]):
        assert_frame_equal(on_duckdb, want)
        assert_frame_equal(on_chdb, want, check_dtypes=False)
        assert [(c.dtype.is_integer(), c.dtype == pl.String) for c in on_chdb] == \
            [(c.dtype.is_integer(), c.dtype == pl.String) for c in want]


def _arrow_is_the_rows(engine, export: Path) -> None:
    """Engine.query_arrow answers what Engine.query answers, value for value, and is counted and capped the same."""
    from servlens.engines import TableSource
    from servlens.errors import ConfigError

    engine.bind(TableSource.parse(f"parquet:{export}"))
    # a time (ClickHouse's and Spark's carry their zone), an empty list (NULL on DuckDB, [] on the others), decimals:
    # 1.1 as float() reads it (Arrow's own cast to double makes it 1.0999999999999999), an unsigned count on ClickHouse
    sql = """SELECT run, coalesce(model, '(no model)') AS m, count(*) AS n, min(t_arrival) AS t,
                    list(request_id) FILTER (WHERE ttft_s < 0) AS none, CAST(1.1 AS DECIMAL(18, 6)) AS d,
                    CAST(sum(prompt_tokens) AS DECIMAL(38, 6)) / 7 AS mean
             FROM requests GROUP BY ALL ORDER BY run, m"""
    rows = engine.query(sql)
    table = engine.query_arrow(sql)
    assert rows and table.to_pylist() == rows
    assert rows[0]["none"] is None and rows[0]["d"] == 1.1
    assert engine.stats.log[-1] == engine.stats.log[-2] == (" ".join(sql.split())[:80], len(rows))
    empty = engine.query_arrow(sql.replace("GROUP BY", "WHERE run = 'none' GROUP BY"))
    assert empty.num_rows == 0 and empty.column_names == list(rows[0])
    with pytest.raises(ConfigError, match="returned more than 1 rows"):
        engine.query_arrow(sql, max_rows=1)


@pytest.mark.parametrize("name", ["duckdb", "chdb"])
def test_arrow_results_are_the_rows(pair_export, name):
    if name == "chdb":
        pytest.importorskip("chdb", reason="chdb is not installed (pip install 'servlens[engines]')")
    from servlens.engines import open_engine

    with open_engine(name) as engine:
        _arrow_is_the_rows(engine, pair_export)


@pytest.mark.engines
def test_arrow_results_are_the_rows_on_spark(pair_export, spark_local_engine, export_dir):
    from servlens.engines import TableSource

    try:
        _arrow_is_the_rows(spark_local_engine, pair_export)
    finally:   # the session's engine is shared with the analyze tests: give it back their export
        spark_local_engine.bind(TableSource.parse(f"parquet:{export_dir}"))
