"""SGLang per-request metrics files and JSON request logs (recorded by SGLang 0.5.23's own writers), and the default
text request log (a real SGLang 0.5.10 line): see tests/data/formats/sglang/ATTRIBUTION.md."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

RECORDED = FORMATS / "sglang" / "recorded-0.5.23"
METRICS = RECORDED / "sglang-request-metrics-20261207_19.log"
REQUEST_LOG = RECORDED / "vm_0.log"
TEXT_LOG = FORMATS / "sglang" / "sglang-issue-25887-server.log"

IDS = ["a1f0c2d4e6b84f1a9c3e5d7b9f1a2c4e", "b2e1d3c5a7f94e2b8d4f6a8c0e2b4d6f", "c3f2e4d6b8a04f3c9e5a7b9d1f3c5e7a",
       "d4a3f5e7c9b14a4d8f6b8c0e2a4d6f8b", "e5b4a6f8d0c24b5e9a7c9d1f3b5e7a9c"]


def _check_recorded_rows(rows):
    """The five requests SGLang's writers recorded, the same in both files (meta_info is shared)."""
    assert [r["request_id"] for r in rows] == IDS
    stop, length, stop_str, rejected, timeout = rows
    assert (stop["provider"], stop["model"], stop["stream"], length["stream"]) == ("sglang", None, False, True)
    # meta_info's Unix stamps, UTC (the machine's clock was UTC: the naive local times agree)
    assert stop["t_arrival"] == datetime(2026, 12, 7, 19, 0, 32, 425791)
    assert stop["t_end"] == datetime(2026, 12, 7, 19, 0, 32, 511599)
    assert stop["e2e_s"] == pytest.approx(0.08580780900001628)
    # TTFT is first_token_latency (0.5.23); the non-streamed one is the scheduler's prefill end
    assert stop["ttft_s"] == pytest.approx(0.02554102997441987)
    assert stop["tpot_s"] == pytest.approx((0.08580780900001628 - 0.02554102997441987) / 7)
    assert stop["queue_s"] == pytest.approx(0.004076865999877555)
    assert (stop["prompt_tokens"], stop["cached_tokens"], stop["completion_tokens"], stop["reasoning_tokens"]) == (
        6, 0, 8, 0)
    # finish_reason is an object: its type, normalised
    assert (stop["finish_reason"], stop["status"], stop["max_tokens"], stop["http_status"]) == ("stop", "ok", 32, None)
    assert (length["finish_reason"], length["max_tokens"], length["completion_tokens"]) == ("length", 16, 16)
    assert (length["prompt_tokens"], length["cached_tokens"]) == (6, 5)  # radix-cache hit
    assert length["ttft_s"] == pytest.approx(0.011578525999993872)
    assert stop_str["finish_reason"] == "stop" and stop_str["queue_s"] == pytest.approx(0.15009397200014973)
    # rejected before any prefill: HTTP 400 and its message; first_token_latency is its e2e there, so no TTFT
    assert (rejected["finish_reason"], rejected["status"], rejected["http_status"]) == ("abort", "error", 400)
    assert rejected["error_message"] == "Request prompt exceeds the KV memory budget: input_len=3001."
    assert (rejected["prompt_tokens"], rejected["completion_tokens"], rejected["ttft_s"], rejected["queue_s"]) == (
        3001, 0, None, 0.0)
    # the scheduler's running timeout: an abort by message, whose meta_info has no stamps and no prompt_tokens
    assert (timeout["finish_reason"], timeout["http_status"], timeout["stream"]) == ("abort", 503, True)
    assert timeout["error_message"] == "Request running timeout reached."
    assert (timeout["t_arrival"], timeout["t_end"], timeout["prompt_tokens"], timeout["ttft_s"]) == (
        None, None, None, None)
    assert (timeout["e2e_s"], timeout["completion_tokens"]) == (pytest.approx(0.21866668500001651), 24)
    assert stop["attrs"]["decode_throughput"] == pytest.approx(116.1502259317189)
    assert stop["attrs"]["inference_s"] is None  # no inference_time in 0.5.23


def test_metrics_file_sniffed_with_units():
    assert sniffed_name(METRICS) == "sglang-request-metrics"
    source, rows, _ = ingest_rows(METRICS)
    assert (source["rows"], source["bad_lines"]) == (5, 0)
    _check_recorded_rows(rows)
    assert [r["attrs"]["finish_matched"] for r in rows[:3]] == ["128009", None, "\n\n"]


def test_request_log_reads_finished_events_only():
    """SGLang's JSON request log is '[local time] {json}' lines, not JSON lines: sniffed as such, finished events
    only."""
    assert sniffed_name(REQUEST_LOG) == "sglang-request-log"
    source, rows, con = ingest_rows(REQUEST_LOG)
    # 10 lines: five request.received events (other messages, not errors) and five request.finished ones
    assert (source["rows"], source["bad_lines"]) == (5, 0)
    assert [r["source_line"] for r in rows] == [2, 4, 6, 8, 10]
    assert con.execute("SELECT count(*) FROM ingest_errors").fetchone()[0] == 0
    _check_recorded_rows(rows)
    # the naive local `timestamp` is kept aside, never used for the row's times
    assert rows[0]["attrs"]["logged_at_local"] == "2026-12-07T19:00:32.511887"


def test_request_log_line_cut_short_is_a_bad_line(tmp_path):
    """A request.finished line cut short (a shipper's line limit) starts like a record: a bad line, kept with its
    number, where the request.received lines stay other messages."""
    lines = REQUEST_LOG.read_text().splitlines()
    path = tmp_path / "vm_0.log"
    path.write_text("\n".join([*lines, lines[1][:300]]) + "\n")
    source, rows, con = ingest_rows(path)
    assert (source["rows"], source["bad_lines"]) == (5, 1)
    assert con.execute("SELECT line FROM ingest_errors").fetchone()[0] == len(lines) + 1


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


def test_text_log_as_sglang_prints_it_is_sniffed(tmp_path):
    """SGLang's console lines start with '[2026-05-20 08:02:44 ...]': without the issue's collector prefix the file
    opens with '[', which must not be taken for a JSON array."""
    lines = [line.split("\t", 2)[-1] for line in TEXT_LOG.read_text().splitlines()]
    path = tmp_path / "server.log"
    path.write_text("\n".join(lines) + "\n")
    assert lines[0].startswith("[2026-05-20 ")
    assert sniffed_name(path) == "sglang-request-log-text"
    source, rows, _ = ingest_rows(path)
    assert (source["rows"], source["bad_lines"], rows[0]["http_status"]) == (1, 0, 503)


def test_a_folder_reads_the_json_request_log_and_lists_the_console_log(tmp_path):
    """SGLang's --log-requests-target folder: the JSON request log (written through SGLang's logger, so a line
    reader) holds requests only and is read from a folder; the text console log beside it is listed, not read."""
    import shutil

    from servlens.ingest.api import ingest_inputs
    from servlens.store.schema import open_store

    for path in (REQUEST_LOG, TEXT_LOG):
        shutil.copy(path, tmp_path / path.name)
    report = ingest_inputs(open_store(None), [str(tmp_path)], run="t").to_dict()
    assert [(s["path"].rsplit("/", 1)[-1], s["format"], s["rows"]) for s in report["sources"]] == [
        ("vm_0.log", "sglang-request-log", 5)]
    assert [(s["path"].rsplit("/", 1)[-1], s["reason"].rsplit("(", 1)[-1]) for s in report["skipped"]] == [
        (TEXT_LOG.name, "sglang-request-log-text)")]
