"""Rule SQL stays portable (DESIGN.md "Beyond one machine"): every SQL of every rule (detector, views, decide,
evidence), after macro expansion and parameter substitution, and the window/percentile snippets the built-in
detectors share transpile from DuckDB to Trino, Spark and ClickHouse without unsupported constructs."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from servlens.analysis.detectors._common import q
from servlens.analysis.rule_sql import prepare
from servlens.analysis.rules import load_rules
from servlens.analysis.sql_rules import examples_sql
from servlens.analysis.windows import spec_for

sqlglot = pytest.importorskip("sqlglot")
from sqlglot.errors import ErrorLevel  # noqa: E402

DIALECTS = ("trino", "spark", "clickhouse")
USER_RULES = Path(__file__).parent / "data" / "user_rules"
SQL_USER_RULES = Path(__file__).parent / "data" / "sql_user_rules"
ALL_RULES = load_rules([USER_RULES, SQL_USER_RULES])


def _transpile(sql: str, dialect: str) -> str:
    return sqlglot.transpile(sql, read="duckdb", write=dialect, unsupported_level=ErrorLevel.RAISE)[0]


def _statement(key: str, sql: str) -> str:
    """The statement the runner builds around one of a rule's SQL texts."""
    if key.startswith("decide."):
        return f"SELECT ({sql}) AS decided FROM rule_metrics"
    if key == "evidence.examples.where":
        prefix, suffix = examples_sql("", "t_at", "scope_requests", 5)
        return prefix + sql + suffix
    if key == "evidence.examples.order_by":
        return f"SELECT request_id FROM scope_requests ORDER BY {sql}"
    return sql


def test_every_rule_with_sql_is_covered():
    with_sql = {rule.id for rule in ALL_RULES if rule.sql}
    assert {"SL003", "XY901", "UR001"} <= with_sql


@pytest.mark.parametrize("rule", [r for r in ALL_RULES if r.sql], ids=lambda r: r.id)
@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_sql_of_every_rule_transpiles_after_expansion(rule, dialect):
    params = rule.default_params()
    for key, sql in rule.sql_items():
        expanded = prepare(sql, params)
        assert "sl_failed(" not in expanded and "$" not in expanded.replace("'$", "")
        try:
            _transpile(_statement(key, expanded), dialect)
        except Exception as exc:  # the rule file and key, so the failing SQL is found at once
            pytest.fail(f"{rule.path.name} {key} does not transpile to {dialect}: {exc}")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_window_and_percentile_snippets_transpile(dialect):
    spec = spec_for(datetime(2026, 11, 28, 10), datetime(2026, 11, 28, 11))
    sql = (f"SELECT {spec.index_sql()} AS w, count(*) AS n, {q('ttft_s', 0.99)} AS p99, "
           "count(*) FILTER (WHERE finish_reason = 'length') AS capped "
           "FROM scope_requests GROUP BY 1")
    out = _transpile(sql, dialect)
    assert "0.99" in out
