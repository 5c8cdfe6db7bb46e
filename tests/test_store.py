from servlens.store.schema import REQUEST_COLUMNS, SCHEMA_VERSION, open_store
from servlens.errors import InputError, redact_secrets, redact_sql

import duckdb
import pytest


def test_new_store_has_every_table_and_the_schema_version(tmp_path):
    con = open_store(tmp_path / "s.duckdb")
    tables = {r[0] for r in con.execute("select table_name from information_schema.tables").fetchall()}
    assert {"runs", "sources", "requests", "metric_samples", "ingest_errors", "servlens_meta"} <= tables
    assert [r[0] for r in con.execute("describe requests").fetchall()] == list(REQUEST_COLUMNS)
    assert con.execute("select value from servlens_meta where key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)


def test_a_store_from_a_newer_servlens_is_refused(tmp_path):
    con = open_store(tmp_path / "s.duckdb")
    con.execute("update servlens_meta set value = '99' where key = 'schema_version'")
    con.close()
    with pytest.raises(InputError, match="schema version 99, newer"):
        open_store(tmp_path / "s.duckdb")


def test_secrets_are_redacted_alike_in_python_and_in_sql():
    text = 'Incorrect API key provided: sk-proj-abcdef1234567890. Authorization: Bearer eyJhbGciOi.xyz api_key="abc123456789"'
    expected = 'Incorrect API key provided: sk-[REDACTED]. Authorization: Bearer [REDACTED] api_key="[REDACTED]"'
    assert redact_secrets(text) == expected
    assert duckdb.execute("select " + redact_sql("?"), [text]).fetchone()[0] == expected


def test_simultaneous_samples_of_a_counter_never_make_a_reset_whatever_their_order():
    """Two samples of one series at one instant (one source) are taken in rising value order: no reset between them,
    and the increases do not depend on the order the rows were inserted (or an export file holds them) in."""
    from datetime import datetime

    results = []
    for values in ((5.0, 3.0), (3.0, 5.0)):
        con = open_store(None)
        rows = [(datetime(2026, 11, 28, 9, 0, 0), 1.0)] + [(datetime(2026, 11, 28, 9, 0, 1), v) for v in values]
        con.executemany("INSERT INTO metric_samples (run, source_id, ts, name, name_raw, type, series, labels, value) "
                        "VALUES ('r1', 1, ?, 'c', 'c_total', 'counter', 'value', MAP {}, ?)", rows)
        results.append(con.execute("SELECT value, increase, is_reset FROM metric_counter_increases "
                                   "WHERE increase IS NOT NULL ORDER BY ts, value").fetchall())
        con.close()
    assert results[0] == results[1] == [(3.0, 2.0, False), (5.0, 2.0, False)]
