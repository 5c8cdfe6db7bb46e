"""`servlens analyze` where the data is: the same findings on every engine, on real recordings.

- DuckDB reading the export (`--table parquet:DIR`) gives the very document the store gives (every rule, workload,
  chains, goodput): the export round-trips at the level users see.
- chDB and Spark run every SQL rule through the function map with the same state, severity and headline numbers as
  DuckDB; a Python-detector rule is not evaluable there, with the reason, never silently skipped.
- Only aggregates move: one metrics row per SQL finding, a bounded handful of rows per scope.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from servlens.analysis.rules import load_rules
from servlens.analysis.runner import analyze
from servlens.engines.analysis import analyze_on_engine
from servlens.engines.base import same_number
from servlens.store.schema import open_store

USER_RULES = Path(__file__).resolve().parents[1] / "analysis" / "data" / "user_rules"
# a SQL-first user rule (the contract's example): views, windows, a chart, a severity upgrade
SQL_USER_RULES = Path(__file__).resolve().parents[1] / "analysis" / "data" / "sql_user_rules"
RUNS = ["gw-timeout-fallback", "llamacpp-concurrency-ramp", "llamacpp-reasoning-auto", "edge"]


def _rules():
    return load_rules([USER_RULES, SQL_USER_RULES])


def _sql_rule_ids(rules) -> set[str]:
    return {r.id for r in rules if r.sql}


def _key(f: dict) -> tuple:
    return f["rule"], f["scope"]["run"], f["scope"]["model"], f["scope"]["deployment"]


def _strip(doc: dict) -> dict:
    doc = json.loads(json.dumps(doc))
    doc.pop("generated_at")
    doc["coverage"].pop("engine", None)
    return doc


def test_duckdb_on_the_export_gives_the_stores_document(recorded_store, duckdb_engine):
    rules = _rules()
    store = open_store(recorded_store, read_only=True)
    try:
        expected = analyze(store, rules, RUNS)
    finally:
        store.close()
    got = analyze(duckdb_engine.con, rules, RUNS)
    assert _strip(got) == _strip(expected)
    assert sum(f["state"] == "fired" for f in got["findings"]) >= 5  # real findings, not an empty comparison


def check_engine_parity(duckdb_engine, engine) -> dict:
    rules = _rules()
    reference_doc = analyze(duckdb_engine.con, rules, RUNS)
    reference = {_key(f): f for f in reference_doc["findings"]}
    before = engine.stats.rows_moved, engine.stats.queries
    doc = analyze_on_engine(engine, rules, RUNS)
    _same_workload(reference_doc["workload"], doc["workload"])
    moved = engine.stats.rows_moved - before[0], engine.stats.queries - before[1]
    got = {_key(f): f for f in doc["findings"]}
    assert set(got) == set(reference)
    problems = []
    sql_rules = _sql_rule_ids(rules)
    contract_rules = {r.id for r in rules if r.sql and r.contract}
    assert {"XY901", "SL003", "UR001"} <= sql_rules and {"SL003", "UR001"} <= contract_rules
    for key, ref in reference.items():
        finding = got[key]
        if key[0] in sql_rules:
            if (finding["state"], finding["severity"]) != (ref["state"], ref["severity"]):
                problems.append(f"{key}: {finding['state']}/{finding['severity']} vs {ref['state']}/{ref['severity']}")
            for name, value in ref["evidence"]["metrics"].items():
                if not same_number(value, finding["evidence"]["metrics"].get(name), rel=1e-12):
                    problems.append(f"{key} {name}: {finding['evidence']['metrics'].get(name)!r} vs {value!r}")
            if key[0] in contract_rules:  # the whole finding: sentences, table, chart, windows, examples
                for part in ("summary", "reason", "remediation", "rollback", "examples"):
                    if finding[part] != ref[part]:
                        problems.append(f"{key} {part}: {finding[part]!r} vs {ref[part]!r}")
                for part in ("table", "chart", "windows"):
                    if finding["evidence"].get(part) != ref["evidence"].get(part):
                        problems.append(f"{key} evidence.{part} differs")
        else:
            assert finding["state"] == "not_evaluable"
            assert f"not evaluable on {engine.name}: {key[0]}'s detector is Python" in finding["reason"]
    assert not problems, "\n".join(problems)
    states = {f["state"] for k, f in got.items() if k[0] in sql_rules}
    assert states >= {"fired", "clear"}  # both outcomes compared, not one
    return {"rows_moved": moved[0], "queries": moved[1], "scopes": len({k[1:] for k in got}),
            "requests": doc["coverage"]["requests"], "shown": _values_shown(doc),
            "metric_names": len(doc["coverage"]["metrics_present"])}


def _values_shown(doc: dict) -> int:
    """Table rows and chart points the document shows, plus the coverage lists: what may come back."""
    shown = len(doc["coverage"]["models"]) + len(doc["coverage"]["metrics_present"]) + 4
    for profile in doc["workload"]["runs"].values():
        for part in ("lengths", "latency"):
            for item in (profile.get(part) or {}).values():
                if isinstance(item, dict) and "rows" in item:
                    shown += len(item["rows"])
                if isinstance(item, dict) and "series" in item:
                    shown += max((len(series["x"]) for series in item["series"]), default=0)
        shown += 2  # its counts row and the window origin
    for finding in doc["findings"]:
        evidence = finding["evidence"]
        shown += len((evidence.get("table") or {}).get("rows", []))
        shown += sum(len(series["x"]) for series in (evidence.get("chart") or {}).get("series", []))
        shown += len((evidence.get("chart") or {}).get("hlines", [])) + len(evidence.get("windows") or [])
        shown += len(finding["examples"])
        shown += 4  # a SQL finding's metrics row and its decide predicates (not evaluable, fired, severity)
    return shown


def _same_workload(reference: dict, got: dict) -> None:
    """The workload parts every engine computes: the same tables and per-window charts as DuckDB's profile."""
    for run in RUNS:
        ref, mine = reference["runs"][run], got["runs"][run]
        for key in ("requests", "start", "end", "span_s", "mean_rate_rps", "error_share"):
            assert same_number(mine.get(key), ref.get(key)), (run, key, mine.get(key), ref.get(key))
        for part in ("lengths", "latency"):
            assert mine[part] == ref[part], (run, part)
        assert "rate, prefix sharing, concurrency, context budget are profiled on DuckDB only" in mine["note"]


def _bounded(moved: dict) -> None:
    """Only aggregates move: per scope its presence row, its metric names and one metrics row per SQL rule; the
    rest is what the document shows (coverage lists, workload tables, per-window and per-band chart points)."""
    assert moved["rows_moved"] <= moved["scopes"] * (2 + moved["metric_names"]) + moved["shown"], moved


def test_chdb_finds_what_duckdb_finds(duckdb_engine, chdb_engine):
    _bounded(check_engine_parity(duckdb_engine, chdb_engine))


def test_a_sql_finding_moves_one_row(chdb_engine):
    from servlens.analysis.runner import Scope
    from servlens.engines.analysis import EngineConnection, scope_views

    conn = EngineConnection(chdb_engine)
    conn.views = scope_views(Scope("gw-timeout-fallback", "chat", None))
    rule = next(r for r in _rules() if r.id == "XY901")
    before = chdb_engine.stats.rows_moved
    cursor = conn.execute(rule.sql, {"min_requests": 10, "max_error_share": 0.05})
    assert chdb_engine.stats.rows_moved - before == 1
    row = dict(zip([d[0] for d in cursor.description], cursor.fetchone()))
    known = chdb_engine.one("SELECT count(*) AS n FROM requests WHERE run = 'gw-timeout-fallback' AND model = 'chat' "
                            "AND deployment IS NULL AND status IS NOT NULL")["n"]
    assert (row["state"], row["requests"]) == ("clear" if known >= 10 else "not_evaluable", known)


# The JVM error first seen here ("Exception thrown in awaitResult") was Java's Formatter refusing a DECIMAL share in
# printf (Spark keeps x * 1.0 / n a DECIMAL): division is a DOUBLE division and printf is mapped for Spark now
# (tests/engines/test_function_map.py). Then (tests/engines/test_spark_sql.py): `FROM t WHERE (c)` read as an alias
# (SL002), untyped NULLs in the metrics row, a renamed CTE losing its column list (SL013), LISTAGG DISTINCT's
# ClassCastException (SL006), Spark's [] for DuckDB's NULL list (SL010), the local driver's memory. Spark local is at
# parity (measured 2026-12-02: 1,355 s on 2 shared cores). The standalone cluster, run once since (2026-12-02,
# --runxfail), hit the 1,800 s timeout with the driver out of Java heap ("Spark Context Cleaner"
# OutOfMemoryError): the 2g driver memory is set for spark:local only (LOCAL_DRIVER_CONF); untried for a cluster.
SPARK_CLUSTER_UNVERIFIED = pytest.mark.xfail(
    strict=True, reason="issue 17: Spark local is at parity; the standalone cluster has not been run since the fixes "
    "that brought it there (tests/engines/test_spark_sql.py)")


@pytest.mark.engines
@pytest.mark.timeout(1800)  # every built-in rule on every scope: over 600 s on 2 shared cores under load
def test_spark_local_finds_what_duckdb_finds(duckdb_engine, spark_local_engine):
    _bounded(check_engine_parity(duckdb_engine, spark_local_engine))


@pytest.mark.engines
@SPARK_CLUSTER_UNVERIFIED
@pytest.mark.timeout(1800)
def test_spark_standalone_cluster_finds_what_duckdb_finds(duckdb_engine, spark_cluster_engine):
    _bounded(check_engine_parity(duckdb_engine, spark_cluster_engine))


def test_analyze_command_on_chdb(export_dir):
    result = subprocess.run(
        [sys.executable, "-m", "servlens", "analyze", "--engine", "chdb", "--table", f"parquet:{export_dir}",
         "--run", "edge", "--rules", str(USER_RULES), "--preview", "--format", "json"], capture_output=True, text=True,
        check=False)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["coverage"]["engine"]["name"] == "chdb"
    assert doc["coverage"]["requests"] == 60 and doc["run"] == "edge"
    xy = [f for f in doc["findings"] if f["rule"] == "XY901"]
    assert xy and all(f["state"] == "not_evaluable" for f in xy)  # the edge run has no status column


def test_analyze_command_with_files_and_an_engine_is_refused(export_dir, tmp_path):
    result = subprocess.run([sys.executable, "-m", "servlens", "analyze", str(tmp_path), "--engine", "chdb"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert result.stderr.startswith("Error: --engine and --table analyse tables where they are, not files")


def test_an_unknown_run_on_an_engine(export_dir, chdb_engine):
    from servlens.errors import ConfigError

    with pytest.raises(ConfigError, match="No run named 'nope' in chdb's tables"):
        analyze_on_engine(chdb_engine, _rules(), ["nope"])
