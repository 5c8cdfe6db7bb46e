"""AIPerf profile_export.jsonl, from AIPerf's own example artifact."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

SAMPLE = FORMATS / "aiperf" / "profile_export.jsonl"


def test_records_ms_metrics_and_cancelled_requests():
    assert sniffed_name(SAMPLE) == "aiperf-records"
    source, rows, _ = ingest_rows(SAMPLE)
    assert (source["rows"], source["bad_lines"]) == (5, 0)
    cancelled, ok = rows[0], rows[2]
    assert (cancelled["finish_reason"], cancelled["status"], cancelled["http_status"]) == ("abort", "error", 499)
    assert cancelled["error_type"] == "RequestCancellationError" and cancelled["ttft_s"] is None
    assert ok["request_id"] == "1ed40a0d-e708-434d-bb8e-fb1b44cb8717"
    assert ok["t_arrival"] == datetime(2025, 10, 3, 20, 13, 39, 159192)  # timestamp_ns 1759522419159192408
    assert ok["ttft_s"] == pytest.approx(1.680543782) and ok["e2e_s"] == pytest.approx(7.936968269)
    assert ok["tpot_s"] == pytest.approx(0.032585544203124996)
    assert (ok["prompt_tokens"], ok["completion_tokens"], ok["reasoning_tokens"]) == (550, 193, 132)
    assert ok["t_end"] == datetime(2025, 10, 3, 20, 13, 47, 96160)  # max_response_timestamp
    assert ok["stream"] is True and ok["status"] == "ok" and ok["finish_reason"] is None
