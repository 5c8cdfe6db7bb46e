"""What Spark is given for the constructs the rules use (issue 17), and single rules on Spark local against DuckDB.

The translation tests need no engine; the ones marked `engines` start Spark local (`pytest -m engines`).
"""

from __future__ import annotations

import pytest

from servlens.engines.analysis import EngineConnection, _typed_literal
from servlens.engines.base import with_views
from servlens.engines.functions import parse, translate


def test_a_table_read_without_an_alias_gets_its_own_name_on_spark():
    # Spark's default grammar reads `length_requests WHERE (capped)` as the alias WHERE with one column name and
    # refused rule SL002's examples query: ASSIGNMENT_ARITY_MISMATCH, 17 aliased vs 1 source expression
    sql = "SELECT count(*) AS n FROM length_requests WHERE (capped)"
    assert translate(sql, "spark") == "SELECT COUNT(*) AS n FROM length_requests AS length_requests WHERE (capped)"
    assert translate("SELECT x FROM t a JOIN u ON a.x = u.x WHERE (u.y)", "spark") == (
        "SELECT x FROM t AS a JOIN u AS u ON a.x = u.x WHERE (u.y)")
    assert translate(sql, "chdb") == "SELECT COUNT(*) AS n FROM length_requests WHERE (capped)"


def test_a_views_cte_keeps_its_column_list_when_renamed():
    # rule SL013 names a CTE's columns only in its column list: `t(error_class, ...) AS (VALUES ...)`
    tree = with_views(parse("SELECT s FROM v"), {"v": "WITH t(a, b) AS (VALUES (1, 2)) SELECT a + b AS s FROM t"})
    assert translate(tree, "spark") == (
        "WITH v__t(a, b) AS (SELECT * FROM VALUES (1, 2) AS _values), v AS (SELECT a + b AS s FROM v__t AS t) "
        "SELECT s FROM v AS v")


def test_a_fetched_value_goes_back_typed():
    assert _typed_literal(None, "DOUBLE", "spark") == "CAST(NULL AS DOUBLE)"
    assert _typed_literal(float("nan"), "DOUBLE", "spark") == "CAST(NULL AS DOUBLE)"
    assert _typed_literal(None, "VARCHAR[]", "spark") == "CAST(NULL AS VARCHAR[])"
    assert _typed_literal(None, "VARCHAR[]", "clickhouse") == "NULL"  # ClickHouse has no NULL array
    assert _typed_literal(3, "BIGINT", "clickhouse") == "CAST(3 AS BIGINT)"
    assert _typed_literal("a'b", None, "spark") == "'a''b'"  # no type known: the literal as before


METRICS_SQL = ("CREATE TEMP TABLE rule_metrics AS SELECT count(*) AS n, CAST(NULL AS DOUBLE) AS share, "
               "max(model) FILTER (WHERE false) AS none_model, list(model) FILTER (WHERE model = 'no such') AS models "
               "FROM requests WHERE run = 'edge'")
READ_METRICS = ("SELECT n, count(*) FILTER (WHERE share IS NULL AND none_model IS NULL) AS blanks, "
                "max(coalesce(share, 0.5) * 2) AS doubled FROM rule_metrics GROUP BY n")


def test_the_metrics_row_is_typed_literals_on_chdb(chdb_engine):
    conn = EngineConnection(chdb_engine)
    conn.execute(METRICS_SQL)
    assert conn.views["rule_metrics"] == ('SELECT CAST(60 AS BIGINT) AS "n", CAST(NULL AS DOUBLE) AS "share", '
                                          'CAST(NULL AS VARCHAR) AS "none_model", NULL AS "models"')
    assert conn.execute(READ_METRICS).fetchall() == [(60, 1, 1.0)]


@pytest.mark.engines
def test_the_metrics_row_is_typed_literals_on_spark(spark_local_engine):
    # an untyped NULL is Spark's NullType: FILTER (WHERE share IS NULL ...) refused it
    conn = EngineConnection(spark_local_engine)
    conn.execute(METRICS_SQL)
    assert conn.views["rule_metrics"] == ('SELECT CAST(60 AS BIGINT) AS "n", CAST(NULL AS DOUBLE) AS "share", '
                                          'CAST(NULL AS VARCHAR) AS "none_model", CAST(NULL AS VARCHAR[]) AS "models"')
    assert conn.execute(READ_METRICS).fetchall() == [(60, 1, 1.0)]


@pytest.mark.engines
def test_spark_local_driver_has_a_quarter_of_the_ram_within_two_and_eight_gigabytes(spark_local_engine):
    from servlens.engines.spark_engine import driver_conf

    assert spark_local_engine.spark.sparkContext.getConf().get("spark.driver.memory") == \
        driver_conf()["spark.driver.memory"]


@pytest.mark.parametrize("ram_gib, env, expected", [(24, "", "6g"), (4, "", "2g"), (64, "", "8g"), (24, "12g", "12g")])
def test_the_spark_driver_memory_follows_the_ram_unless_spark_driver_memory_is_set(monkeypatch, ram_gib, env,
                                                                                    expected):
    from servlens.engines import spark_engine
    from servlens.store import schema

    monkeypatch.setenv("SPARK_DRIVER_MEMORY", env)
    monkeypatch.setattr(schema, "physical_memory_bytes", lambda: ram_gib << 30)
    assert spark_engine.driver_conf() == {"spark.driver.memory": expected}


DISTINCT_STRING_AGG = ("SELECT run, string_agg(DISTINCT finish_reason, ', ' ORDER BY finish_reason) "
                       "FILTER (WHERE completion_tokens > 20) AS reasons, string_agg(DISTINCT model, ', ' ORDER BY model) "
                       "FILTER (WHERE false) AS none FROM requests GROUP BY run ORDER BY run")


def test_a_distinct_string_agg_is_collected_sorted_and_joined_on_spark():
    # Spark 4 fails on LISTAGG(DISTINCT ...) WITHIN GROUP with a FILTER, or two of them, with a ClassCastException
    # (rule SL006)
    sql = "SELECT string_agg(DISTINCT kind, ', ' ORDER BY kind) FILTER (WHERE is_error) AS e FROM r"
    items = "ARRAY_SORT(ARRAY_DISTINCT(COLLECT_LIST(kind) FILTER(WHERE is_error)))"
    assert translate(sql, "spark") == (
        f"SELECT CASE WHEN SIZE({items}) = 0 THEN NULL ELSE ARRAY_JOIN({items}, ', ') END AS e FROM r AS r")
    plain = "SELECT string_agg(kind, ', ' ORDER BY kind) AS e FROM r"   # no DISTINCT: Spark's LISTAGG as written
    assert translate(plain, "spark") == "SELECT LISTAGG(kind, ', ') WITHIN GROUP (ORDER BY kind NULLS LAST) AS e FROM r AS r"


@pytest.mark.engines
def test_a_distinct_string_agg_filter_gives_duckdbs_text_on_spark(duckdb_engine, spark_local_engine):
    expected = duckdb_engine.query(DISTINCT_STRING_AGG)
    assert len(expected) == 4 and all(row["none"] is None for row in expected)
    assert spark_local_engine.query(DISTINCT_STRING_AGG) == expected


@pytest.mark.engines
def test_a_scope_view_is_stored_once_read_as_stored_and_replaced_by_the_next_scope_on_spark(spark_local_engine):
    """materialise() keeps one checkpointed frame per view name. A query that reads it as a CTE, as every rule query
    reads its views, scans the stored rows, not the files (a persisted frame read there missed Spark's cache and was
    computed again). The next scope's frame replaces it and the old one's rows are freed."""
    engine = spark_local_engine
    stored = engine.spark.sparkContext._jsc.getPersistentRDDs
    before = len(stored())
    first = engine.materialise("scope_requests", "SELECT * FROM requests WHERE run = 'edge'")
    assert first == "SELECT * FROM servlens_scratch_scope_requests"
    views = {"scope_requests": first}
    assert engine.query("SELECT count(*) AS n FROM scope_requests", views=views) == [{"n": 60}]
    in_a_cte = engine.native("WITH c AS (SELECT count(*) AS n FROM scope_requests) SELECT n FROM c", views)
    plan = engine.spark.sql(in_a_cte)._jdf.queryExecution().executedPlan().toString()
    assert "Scan ExistingRDD" in plan and "FileScan" not in plan, plan
    assert len(stored()) == before + 1
    second = engine.materialise("scope_requests", "SELECT * FROM requests WHERE run = 'edge' AND false")
    assert engine.query("SELECT count(*) AS n FROM scope_requests", views={"scope_requests": second}) == [{"n": 0}]
    assert len(stored()) == before + 1


def test_a_spark_driver_memory_that_is_not_a_size_is_one_sentence(monkeypatch):
    from servlens.engines import spark_engine
    from servlens.errors import ConfigError

    monkeypatch.setenv("SPARK_DRIVER_MEMORY", "banana")
    with pytest.raises(ConfigError, match=r"^SPARK_DRIVER_MEMORY='banana' is not a memory size\. Set it like 8g or 4096m, or unset it for a "
                                         r"quarter of the RAM\.$"):
        spark_engine.driver_conf()
