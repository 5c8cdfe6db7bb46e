"""Rule SQL stays portable (DESIGN.md "Beyond one machine"): SQL detectors and the window/percentile snippets the
built-in detectors share transpile from DuckDB to Trino, Spark and ClickHouse without unsupported constructs."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from servlens.analysis.detectors._common import q
from servlens.analysis.rules import load_rules
from servlens.analysis.windows import spec_for

sqlglot = pytest.importorskip("sqlglot")
from sqlglot.errors import ErrorLevel  # noqa: E402

DIALECTS = ("trino", "spark", "clickhouse")
USER_RULES = Path(__file__).parent / "data" / "user_rules"


def _transpile(sql: str, dialect: str) -> str:
    return sqlglot.transpile(sql, read="duckdb", write=dialect, unsupported_level=ErrorLevel.RAISE)[0]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_sql_detectors_transpile(dialect):
    sql_rules = [rule for rule in load_rules([USER_RULES]) if rule.sql]
    assert sql_rules, "the test user rule is a SQL rule"
    for rule in sql_rules:
        out = _transpile(rule.sql, dialect)
        assert "scope_requests" in out


@pytest.mark.parametrize("dialect", DIALECTS)
def test_window_and_percentile_snippets_transpile(dialect):
    spec = spec_for(datetime(2026, 11, 28, 10), datetime(2026, 11, 28, 11))
    sql = (f"SELECT {spec.index_sql()} AS w, count(*) AS n, {q('ttft_s', 0.99)} AS p99, "
           "count(*) FILTER (WHERE finish_reason = 'length') AS capped "
           "FROM scope_requests GROUP BY 1")
    out = _transpile(sql, dialect)
    assert "0.99" in out
