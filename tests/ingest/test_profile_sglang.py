"""SGLang per-request metrics files and JSON request logs (samples built from SGLang's source), and the default text
request log (a real SGLang 0.5.10 line): see tests/data/formats/sglang/ATTRIBUTION.md."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

METRICS = FORMATS / "sglang" / "sglang-request-metrics-20251201_08.log"
REQUEST_LOG = FORMATS / "sglang" / "sglang-request-log.jsonl"
TEXT_LOG = FORMATS / "sglang" / "sglang-issue-25887-server.log"


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


def test_text_request_log_of_a_real_server():
    assert sniffed_name(TEXT_LOG) == "sglang-request-log-text"
    source, rows, con = ingest_rows(TEXT_LOG)
    # the Finish line is the row; the scheduler's Decode / Prefill batch lines and the blank lines are not, nor bad
    assert (source["rows"], source["bad_lines"]) == (1, 0)
    # the batch lines are gauge samples: rank TP0's Decode line (4 running, 6 queued, 0.90 of the KV pool) and its
    # Prefill line (3, 5, 0.97); the same Prefill batch printed by the seven other context-parallel ranks is not
    # counted again
    samples = con.execute("SELECT ts, name, value FROM metric_samples ORDER BY name, value").fetchall()
    at = datetime(2026, 5, 20, 8, 2, 44)
    assert samples == [(at, "sglang:num_queue_reqs", 5.0), (at, "sglang:num_queue_reqs", 6.0),
                       (at, "sglang:num_running_reqs", 3.0), (at, "sglang:num_running_reqs", 4.0),
                       (at, "sglang:token_usage", 0.9), (at, "sglang:token_usage", 0.97)]
    (row,) = rows
    assert (row["source_line"], row["request_id"], row["provider"], row["stream"]) == (
        3, "bf890d9ca8ce4008bef7ef25d97f8fba", "sglang", True)
    # meta_info's Unix stamps, UTC: the end is the log collector's own time of the line (08:02:44.565Z)
    assert row["t_arrival"] == datetime(2026, 5, 20, 7, 42, 42, 640887)
    assert row["t_end"] == datetime(2026, 5, 20, 8, 2, 44, 565102)
    assert row["e2e_s"] == pytest.approx(1201.9242150001228)
    # the server's request timeout: an abort with its HTTP status and message
    assert (row["finish_reason"], row["status"], row["http_status"]) == ("abort", "error", 503)
    assert row["error_message"] == "Request running timeout reached."
    assert (row["prompt_tokens"], row["cached_tokens"], row["completion_tokens"], row["reasoning_tokens"]) == (
        32472, 32320, 23297, 23297)
    assert (row["max_tokens"], row["queue_s"]) == (32000, 0.0)
    # no first-token stamp in 0.5.10's meta_info: TTFT unknown, not derived from the first chunk sent
    assert row["ttft_s"] is None
    assert row["attrs"]["response_sent_to_client_ts"] == pytest.approx(1779262965.4523866)
    # inference_time is the raw perf_counter() of the finish here (26520974.38 s beside 1201.92 s e2e): dropped
    assert row["attrs"]["inference_s"] is None
    assert row["attrs"]["decode_throughput"] == pytest.approx(19.428522417494694)


def test_a_finish_line_the_pattern_cannot_read_is_a_bad_line(tmp_path):
    """The real log with one Finish line cut short (as a log shipper's line limit does): it starts like a record, so it
    is counted and kept with its line number, never skipped as another message; the whole line still gives its row."""
    lines = TEXT_LOG.read_text().splitlines()
    finish = next(i for i, line in enumerate(lines) if "Finish: obj=" in line)
    cut = lines[finish][: lines[finish].index(", out=")]
    path = tmp_path / "server.log"
    path.write_text("\n".join([*lines, cut]) + "\n")
    source, rows, con = ingest_rows(path)
    assert (source["rows"], source["bad_lines"]) == (1, 1)
    line, reason = con.execute("SELECT line, reason FROM ingest_errors").fetchone()
    assert line == len(lines) + 1
    assert reason == "the line starts like a sglang-request-log-text record but matches none of its [lines] patterns"
