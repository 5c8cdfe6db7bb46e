"""`servlens engines check`: the engine's own version and function list decide what runs there."""

from __future__ import annotations

import dataclasses

import json
import subprocess
import sys
from pathlib import Path

import pytest

from servlens.analysis.rules import load_rules
from servlens.engines import TableSource, open_engine
from servlens.engines.check import MAP_PROBES, check_engine, functions_called


def _servlens(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servlens", *args], capture_output=True, text=True, check=False)


def test_chdb_has_every_function_the_map_writes(chdb_engine):
    doc = check_engine(chdb_engine, load_rules(), tables_bound=True)
    assert [p["name"] for p in doc["probes"]] == list(MAP_PROBES)
    assert all(p["ok"] and p["ran"] for p in doc["probes"]), doc["probes"]
    assert doc["missing_columns"] == {"requests": [], "metric_samples": []}
    assert doc["engine"]["version"].startswith(("25.", "26.", "27."))


def test_a_python_detector_runs_where_its_parity_is_tested(chdb_engine):
    """A Python detector's SQL is built as it runs, so the check goes by the rule's `engines` key."""
    rules = load_rules()
    verdicts = {v["rule"]: v for v in check_engine(chdb_engine, rules, tables_bound=False)["rules"]}
    assert verdicts["SL004"] == {"rule": "SL004", "runs": True, "checks": [], "reason": None}
    untested = [dataclasses.replace(r, engines=("duckdb",)) if r.id == "SL004" else r for r in rules]
    doc = check_engine(chdb_engine, untested, tables_bound=False)
    verdict = next(v for v in doc["rules"] if v["rule"] == "SL004")
    assert (verdict["runs"], verdict["reason"]) == (
        False, "a Python detector, whose SQL is built as it runs: its parity is tested on duckdb only")
    assert doc["ok"] is False


def test_a_missing_function_is_named(chdb_engine):
    """What an old engine lacks is found from its function list, not by running and failing."""
    available = chdb_engine.functions() - {"quantileexactinclusive"}
    from servlens.engines.check import check_sql

    result = check_sql(chdb_engine, "p99", "SELECT quantile_cont(ttft_s, 0.99) FROM requests", available, run=False)
    assert result.missing == ["quantileexactinclusive"]
    assert not result.ok


def _xy901_with(tmp_path, select_item: str):
    source = (Path(__file__).resolve().parents[1] / "analysis" / "data" / "user_rules" / "XY901-high-error-rate.toml")
    text = source.read_text().replace("count(*) AS requests,", f"{select_item}, count(*) AS requests,")
    (tmp_path / "XY901-high-error-rate.toml").write_text(text)
    return [r for r in load_rules([tmp_path]) if r.id == "XY901"]


def test_a_rule_calling_a_duckdb_only_udf_is_not_portable(chdb_engine, tmp_path):
    """sl_mannwhitney_less_p takes the samples themselves (no aggregate to compute it from): DuckDB only, named."""
    rules = _xy901_with(tmp_path, "sl_mannwhitney_less_p([1.0, 2.0], [3.0, 4.0]) AS p")
    verdict = check_engine(chdb_engine, rules, tables_bound=False)["rules"][0]
    assert not verdict["runs"]
    assert verdict["reason"] == "XY901 detector.sql: the engine lacks sl_mannwhitney_less_p"


def test_a_statistical_function_servlens_computes_runs_in_a_select_list_only(chdb_engine, tmp_path):
    """sl_fisher_greater_p on an engine: computed by servlens from the engine's aggregates, so the rule runs; inside
    an aggregate its arguments would be rows, and the check says why it cannot go there."""
    rules = _xy901_with(tmp_path, "sl_fisher_greater_p(1, 2, 3, 4) AS p")
    assert check_engine(chdb_engine, rules, tables_bound=False)["rules"][0]["runs"]
    rules = _xy901_with(tmp_path, "sum(sl_normal_sf(ttft_s)) AS p")
    verdict = check_engine(chdb_engine, rules, tables_bound=False)["rules"][0]
    assert not verdict["runs"]
    assert verdict["reason"] == ("XY901 detector.sql: sl_normal_sf() inside an aggregate or a window reads rows, not "
                                 "aggregates: servlens computes it only on an engine's aggregates. Aggregate first, "
                                 "then call sl_normal_sf().")


def test_functions_called_reads_the_translation():
    native = "SELECT quantileExactInclusive(0.99)(x), countIf(y > 1), dateDiff('second', a, b) FROM t"
    # as sqlglot prints them back for ClickHouse (date_diff is ClickHouse's own alias of dateDiff)
    assert functions_called(native, "clickhouse") == {"quantileexactinclusive", "countif", "date_diff"}


def test_engines_check_command_on_the_store(recorded_store):
    result = _servlens("engines", "check", "--db", str(recorded_store), "--format", "json")
    doc = json.loads(result.stdout)
    assert result.returncode == 0, result.stderr
    assert doc["ok"] is True
    assert {v["rule"] for v in doc["rules"] if v["runs"]} == {r.id for r in load_rules()}


def test_engines_check_command_on_chdb(export_dir):
    result = _servlens("engines", "check", "--engine", "chdb", "--table", f"parquet:{export_dir}")
    assert result.returncode == 0, result.stdout  # every built-in rule's parity is tested on chDB
    assert "exact quantile  ok (ran)" in result.stdout
    assert "SL004   runs here" in result.stdout  # a Python detector, by its `engines` key
    assert "SL003   runs here" in result.stdout  # SQL-first: views, detector, decide and evidence all translate


def test_an_unknown_engine_is_one_sentence():
    result = _servlens("engines", "check", "--engine", "oracle://x")
    assert result.returncode == 2
    assert result.stderr == ("Error: Unknown engine 'oracle://x'. --engine takes duckdb, chdb, "
                             "clickhouse://HOST:PORT/DB, spark:local[N], spark://HOST:PORT, sc://HOST:PORT.\n")


def test_an_unreachable_clickhouse_is_one_sentence():
    result = _servlens("engines", "check", "--engine", "clickhouse://127.0.0.1:9/default")
    assert result.returncode == 2
    assert result.stderr.startswith("Error: Cannot reach ClickHouse at 127.0.0.1:9: ")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_a_parquet_folder_that_is_not_an_export(tmp_path):
    engine = open_engine("duckdb")
    try:
        with pytest.raises(Exception, match="is not a servlens Parquet export"):
            engine.bind(TableSource.parse(f"parquet:{tmp_path}"))
    finally:
        engine.close()
