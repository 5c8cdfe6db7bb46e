"""The documented views over Langfuse's `observations` and Helicone's `request_response_rmt`, on tables created in
chDB from the vendors' own migrations (tests/data/engines, cited there): every canonical column, in order, with the
vendor's traps handled (latest row version, usage keys, defaults that are not measurements, ms units)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from servlens.engines import TableSource
from servlens.engines.views import VIEWS, view_sql
from servlens.store.schema import REQUEST_COLUMNS

SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "engines"

pytest.importorskip("chdb", reason="chdb is not installed (pip install 'servlens[engines]')")


def _statements(folder: Path) -> list[str]:
    text = "\n".join(p.read_text() for p in sorted(folder.glob("*.sql"), key=_migration_order))
    return [s.strip() for s in text.split(";") if s.strip()]


def _migration_order(path: Path) -> tuple:
    digits = "".join(c if c.isdigit() else " " for c in path.stem).split()
    return (int(digits[0]) % 1000 if digits else 0, path.name)


@pytest.fixture(scope="module")
def vendor_engine():
    from servlens.engines.clickhouse_engine import ChDBEngine

    engine = ChDBEngine()
    yield engine
    engine.close()


def _install(engine, database: str, folder: str, inserts: list[str], view: str) -> None:
    engine.execute(f"CREATE DATABASE IF NOT EXISTS {database}")
    engine.execute(f"USE {database}")
    try:
        for statement in _statements(SCHEMAS / folder):
            engine.execute(statement.replace("default.", f"{database}."))
        for insert in inserts:
            engine.execute(insert)
        engine.execute(f"CREATE VIEW {database}.requests AS {view_sql(view)}")
    finally:
        engine.execute("USE default")
    engine.bind(TableSource.parse(f"{database}.requests"))


LANGFUSE_ROWS = [
    # a streamed generation: OpenAI usage as Langfuse stores it (input without the cached tokens), two versions
    # of the row (the later one has the end time and the usage) before the ReplacingMergeTree merges them
    """INSERT INTO observations (id, trace_id, project_id, environment, type, start_time, end_time, name, level,
        provided_model_name, model_parameters, usage_details, completion_start_time, event_ts, is_deleted)
       VALUES ('g1', 't1', 'p', 'production', 'GENERATION', '2026-11-28 10:00:00.000', NULL, 'chat', 'DEFAULT',
               'gpt-4o', '{"max_tokens": 256}', map(), NULL, '2026-11-28 10:00:00.000', 0),
              ('g1', 't1', 'p', 'production', 'GENERATION', '2026-11-28 10:00:00.000', '2026-11-28 10:00:02.500',
               'chat', 'DEFAULT', 'gpt-4o', '{"max_tokens": 256}',
               map('input', 900, 'input_cached_tokens', 100, 'output', 40, 'output_reasoning_tokens', 10, 'total', 1050),
               '2026-11-28 10:00:00.250', '2026-11-28 10:00:02.600', 0)""",
    # a failed generation: usage 0 (not measured), the error in status_message, max_tokens given as a string
    """INSERT INTO observations (id, trace_id, project_id, environment, type, start_time, end_time, name, level,
        status_message, provided_model_name, model_parameters, usage_details, event_ts, is_deleted)
       VALUES ('g2', 't2', 'p', 'production', 'GENERATION', '2026-11-28 10:00:01.000', '2026-11-28 10:00:31.000',
               'chat', 'ERROR', 'Request timed out.', 'gpt-4o', '{"max_tokens": "128"}',
               map('input', 0, 'output', 0, 'total', 0), '2026-11-28 10:00:31.000', 0)""",
    # not requests: a span, and a generation deleted later (its latest version says so)
    """INSERT INTO observations (id, trace_id, project_id, environment, type, start_time, name, level, event_ts,
        is_deleted) VALUES ('s1', 't1', 'p', 'production', 'SPAN', '2026-11-28 10:00:00.000', 'retrieve', 'DEFAULT',
        '2026-11-28 10:00:00.000', 0),
       ('g3', 't3', 'p', 'production', 'GENERATION', '2026-11-28 10:00:05.000', 'chat', 'DEFAULT',
        '2026-11-28 10:00:05.000', 0),
       ('g3', 't3', 'p', 'production', 'GENERATION', '2026-11-28 10:00:05.000', 'chat', 'DEFAULT',
        '2026-11-28 10:09:00.000', 1)""",
]


def test_langfuse_observations_view(vendor_engine):
    _install(vendor_engine, "lf", "langfuse", LANGFUSE_ROWS, "langfuse_observations")
    assert vendor_engine.columns("requests") == list(REQUEST_COLUMNS)
    rows = vendor_engine.query("SELECT * FROM requests ORDER BY request_id")
    assert [r["request_id"] for r in rows] == ["g1", "g2"]
    ok, failed = rows
    assert ok["run"] == "production" and ok["model"] == "gpt-4o" and ok["trace_id"] == "t1"
    assert ok["t_arrival"] == datetime(2026, 11, 28, 10, 0, 0)
    assert ok["t_first_token"] == datetime(2026, 11, 28, 10, 0, 0, 250000)
    assert (ok["ttft_s"], ok["e2e_s"], ok["decode_s"]) == (0.25, 2.5, 2.25)
    assert (ok["prompt_tokens"], ok["cached_tokens"], ok["completion_tokens"], ok["reasoning_tokens"]) == (1000, 100, 50, 10)
    assert (ok["max_tokens"], ok["status"], ok["finish_reason"]) == (256, "ok", None)
    assert ok["http_status"] is None and ok["cache_hit"] is None  # unknown, not zero or false
    assert (failed["status"], failed["finish_reason"], failed["error_message"]) == ("error", "error", "Request timed out.")
    assert failed["prompt_tokens"] is None and failed["completion_tokens"] is None  # Langfuse writes 0: not measured
    assert (failed["max_tokens"], failed["e2e_s"], failed["ttft_s"]) == (128, 30.0, None)
    # no metric_samples beside a Langfuse table: the engine reads an empty canonical table, rules needing it are
    # not evaluable
    assert vendor_engine.query("SELECT count(*) AS n FROM metric_samples") == [{"n": 0}]
    assert vendor_engine.one("SELECT quantile_cont(e2e_s, 0.5) AS p50 FROM requests") == {"p50": 16.25}


HELICONE_ROWS = [
    """INSERT INTO request_response_rmt (response_id, response_created_at, latency, status, completion_tokens,
        prompt_tokens, model, request_id, request_created_at, user_id, organization_id, time_to_first_token, provider,
        target_url, properties, scores, request_body, response_body, assets, updated_at, cache_reference_id)
       VALUES (generateUUIDv4(), '2026-11-28 10:00:01.800', 1800, 200, 64, 1200, 'gpt-4o-mini',
               '11111111-1111-1111-1111-111111111111', '2026-11-28 10:00:00.000', 'u1',
               'aaaaaaaa-0000-0000-0000-000000000001', 350, 'OPENAI', 'https://api.openai.com/v1/chat/completions',
               map(), map(), '{"model":"gpt-4o-mini","max_tokens":64,"stream":true}',
               '{"choices":[{"index":0,"finish_reason":"length","message":{"role":"assistant","content":"..."}}]}',
               [], '2026-11-28 10:00:02.000', '00000000-0000-0000-0000-000000000000'),
              (generateUUIDv4(), '2026-11-28 10:00:05.100', 100, 429, NULL, NULL, 'gpt-4o-mini',
               '22222222-2222-2222-2222-222222222222', '2026-11-28 10:00:05.000', 'u1',
               'aaaaaaaa-0000-0000-0000-000000000001', NULL, 'OPENAI', 'https://api.openai.com/v1/chat/completions',
               map(), map(), '{}', '{"error":{"message":"Rate limit reached","type":"requests"}}', [],
               '2026-11-28 10:00:05.200', '00000000-0000-0000-0000-000000000000')""",
    # the same request written again later (a ReplacingMergeTree version): the latest wins, not two rows
    """INSERT INTO request_response_rmt (response_id, response_created_at, latency, status, completion_tokens,
        prompt_tokens, prompt_cache_read_tokens, model, request_id, request_created_at, user_id, organization_id,
        time_to_first_token, provider, target_url, properties, scores, request_body, response_body, assets,
        updated_at, cache_reference_id)
       VALUES (generateUUIDv4(), '2026-11-28 10:00:01.800', 1800, 200, 64, 1200, 1024, 'gpt-4o-mini',
               '11111111-1111-1111-1111-111111111111', '2026-11-28 10:00:00.000', 'u1',
               'aaaaaaaa-0000-0000-0000-000000000001', 350, 'OPENAI', 'https://api.openai.com/v1/chat/completions',
               map(), map(), '{"model":"gpt-4o-mini","max_tokens":64,"stream":true}',
               '{"choices":[{"index":0,"finish_reason":"length","message":{"role":"assistant","content":"..."}}]}',
               [], '2026-11-28 10:00:09.000', '00000000-0000-0000-0000-000000000000')""",
]


def test_helicone_request_response_rmt_view(vendor_engine):
    _install(vendor_engine, "hc", "helicone", HELICONE_ROWS, "helicone_request_response_rmt")
    assert vendor_engine.columns("requests") == list(REQUEST_COLUMNS)
    rows = vendor_engine.query("SELECT * FROM requests ORDER BY request_id")
    assert [r["request_id"][:8] for r in rows] == ["11111111", "22222222"]
    ok, limited = rows
    assert ok["run"] == "aaaaaaaa-0000-0000-0000-000000000001" and ok["provider"] == "OPENAI"
    assert (ok["ttft_s"], ok["e2e_s"]) == (0.35, 1.8)
    assert ok["t_first_token"] == datetime(2026, 11, 28, 10, 0, 0, 350000)
    assert (ok["prompt_tokens"], ok["completion_tokens"], ok["cached_tokens"]) == (1200, 64, 1024)  # latest version
    assert (ok["finish_reason"], ok["max_tokens"], ok["http_status"], ok["status"]) == ("length", 64, 200, "ok")
    assert ok["cache_hit"] is False
    assert (limited["http_status"], limited["status"], limited["error_message"]) == (429, "error", "Rate limit reached")
    assert limited["cached_tokens"] is None  # the column's default 0 is not a measured zero
    assert limited["ttft_s"] is None and limited["prompt_tokens"] is None


def test_every_view_is_documented_with_its_source():
    for name in VIEWS:
        text = view_sql(name)
        assert "Source schema:" in text and "@" in text  # file and commit
        for column in REQUEST_COLUMNS:
            assert f" AS {column}," in text or f" AS {column}\n" in text, (name, column)
