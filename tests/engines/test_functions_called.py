"""What `servlens engines check` counts as a function a rule calls: syntax is no function, and a query sqlglot cannot
read back for the engine is still read right (no words from strings, comments or CTE column lists)."""

from __future__ import annotations

from servlens.engines.check import functions_called


def test_exists_is_syntax_not_a_function():
    sql = "SELECT count(*) FILTER (WHERE EXISTS (SELECT 1 FROM r WHERE r.x = s.x)) AS n FROM s"
    assert functions_called(sql, "duckdb") == {"count"}


def test_a_query_sqlglot_cannot_parse_back_is_read_without_literals_comments_or_cte_names():
    sql = """WITH t(error_class, label) AS (SELECT 'a', 'the answer (cut)')
             -- beyond chance (one-sided)
             SELECT quantileExactInclusive(0.5)(x), "odd name(" FROM t WHERE x IN (1, 2) AND ("""
    assert functions_called(sql, "clickhouse") == {"quantileexactinclusive"}


def test_string_agg_distinct_with_a_filter_runs_on_chdb_as_on_duckdb():
    """SL006, SL012 and SL013 list the distinct error kinds of their failures this way."""
    import duckdb
    import pytest

    chdb = pytest.importorskip("chdb", reason="chdb is not installed (pip install 'servlens[engines]')")
    from servlens.engines.functions import translate

    sql = ("SELECT string_agg(DISTINCT kind, ', ' ORDER BY kind) FILTER (WHERE failed) AS kinds FROM (SELECT 'b' AS "
           "kind, true AS failed UNION ALL SELECT 'a', true UNION ALL SELECT 'b', true UNION ALL SELECT 'c', false) t")
    assert duckdb.connect().execute(sql).fetchone()[0] == "a, b"
    assert chdb.query(translate(sql, "clickhouse"), "CSV").data().strip() == '"a, b"'
