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
