"""Helicone exports, JSONL and CSV (samples built from the export tool's source: ATTRIBUTION.md)."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

JSONL = FORMATS / "helicone" / "helicone-export.jsonl"
CSV = FORMATS / "helicone" / "helicone-export.csv"


def test_jsonl_ms_fields_become_seconds():
    assert sniffed_name(JSONL) == "helicone-export"
    source, rows, _ = ingest_rows(JSONL)
    assert (source["rows"], source["bad_lines"]) == (2, 0)
    ok, limited = rows
    assert ok["t_arrival"] == datetime(2025, 3, 10, 14, 2, 4, 100000)
    assert ok["e2e_s"] == pytest.approx(1.812) and ok["ttft_s"] == pytest.approx(0.42)
    assert (ok["prompt_tokens"], ok["cached_tokens"], ok["completion_tokens"]) == (1536, 1280, 120)
    assert (ok["model"], ok["served_model"], ok["provider"], ok["stream"]) == (
        "gpt-4o-mini", "gpt-4o-mini-2024-07-18", "openai", True)
    assert (ok["finish_reason"], ok["status"], ok["max_tokens"]) == ("stop", "ok", 256)
    # a zone-less ClickHouse time is UTC
    assert limited["t_arrival"] == datetime(2025, 3, 10, 14, 3, 0)
    assert (limited["status"], limited["http_status"], limited["ttft_s"]) == ("error", 429, None)
    assert limited["error_message"] == "Rate limit reached for gpt-4o-mini"


def test_csv_latency_column_is_empty_so_e2e_comes_from_the_timestamps():
    assert sniffed_name(CSV) == "helicone-export-csv"
    source, rows, _ = ingest_rows(CSV)
    assert (source["rows"], source["bad_lines"]) == (2, 0)
    ok = rows[0]
    assert ok["e2e_s"] == pytest.approx(1.812)  # response_created_at - request_created_at
    assert ok["ttft_s"] is None and ok["cached_tokens"] is None
    assert (ok["prompt_tokens"], ok["completion_tokens"], ok["stream"], ok["max_tokens"]) == (1536, 120, True, 256)
    assert rows[1]["status"] == "error" and rows[1]["http_status"] == 429


def test_helicone_own_fixture_without_a_response_keeps_unknowns_unknown():
    path = FORMATS / "helicone" / "helicone-test-fixture.jsonl"
    assert sniffed_name(path) == "helicone-export"
    source, rows, _ = ingest_rows(path)
    assert (source["rows"], source["bad_lines"]) == (1, 0)
    (row,) = rows
    # no stored response: times and counts unknown; "unknown" is Helicone's placeholder, not a model
    assert row["e2e_s"] is None and row["t_end"] is None and row["ttft_s"] is None
    assert (row["prompt_tokens"], row["completion_tokens"], row["cached_tokens"]) == (None, None, None)
    assert (row["model"], row["served_model"], row["provider"]) == (None, "gemini-2.0-flash", "google")
