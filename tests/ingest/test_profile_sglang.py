"""SGLang per-request metrics files and JSON request logs (samples built from SGLang's source: see ATTRIBUTION.md)."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

METRICS = FORMATS / "sglang" / "sglang-request-metrics-20251201_08.log"
REQUEST_LOG = FORMATS / "sglang" / "sglang-request-log.jsonl"


def test_metrics_file_sniffed_with_units():
    assert sniffed_name(METRICS) == "sglang-request-metrics"
    source, rows, _ = ingest_rows(METRICS)
    assert (source["rows"], source["bad_lines"]) == (3, 0)
    stop, length, abort = rows
    assert stop["request_id"] == "9f1c2a" and stop["provider"] == "sglang" and stop["model"] is None
    assert stop["t_arrival"] == datetime(2025, 12, 1, 8, 20, 0, 125000)
    assert stop["ttft_s"] == pytest.approx(0.0625) and stop["e2e_s"] == pytest.approx(0.2141)
    assert stop["queue_s"] == pytest.approx(0.0123) and stop["max_tokens"] == 16 and stop["stream"] is False
    # finish_reason is an object in the file: its type, normalised
    assert (stop["finish_reason"], stop["finish_reason_raw"], stop["status"]) == ("stop", "stop", "ok")
    assert (length["finish_reason"], length["cached_tokens"], length["prompt_tokens"]) == ("length", 5, 6)
    assert length["tpot_s"] == pytest.approx((0.5 - 0.25) / 7)
    assert (abort["finish_reason"], abort["http_status"], abort["status"]) == ("abort", 400, "error")
    assert abort["error_message"].startswith("Requested token count exceeds")
    assert abort["ttft_s"] is None  # no first token: unknown, not 0


def test_request_log_reads_finished_events_only():
    assert sniffed_name(REQUEST_LOG) == "sglang-request-log"
    source, rows, con = ingest_rows(REQUEST_LOG)
    # 4 lines: two request.received events (dropped by the profile's `where`, not errors) and two finished ones
    assert (source["rows"], source["bad_lines"]) == (2, 0)
    assert [r["source_line"] for r in rows] == [2, 4]
    assert con.execute("SELECT count(*) FROM ingest_errors").fetchone()[0] == 0
    first = rows[0]
    # times from meta_info's Unix stamps, not from the naive local `timestamp`
    assert first["t_arrival"] == datetime(2025, 12, 1, 8, 20, 0, 125000)
    assert first["attrs"]["logged_at_local"] == "2025-12-01T09:20:00.340000"
    assert first["ttft_s"] == pytest.approx(0.0625) and first["finish_reason"] == "stop"
    assert rows[1]["cached_tokens"] == 5 and rows[1]["stream"] is True
