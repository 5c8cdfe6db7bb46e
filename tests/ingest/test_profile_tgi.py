"""TGI router --json-output: Rust Duration strings in mixed units, Success and error events (see ATTRIBUTION.md)."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.ingest.format_rows import FORMATS, ingest_rows, sniffed_name

SAMPLE = FORMATS / "tgi" / "tgi-router.jsonl"


def test_durations_in_mixed_units_become_seconds():
    assert sniffed_name(SAMPLE) == "tgi-router-json"
    source, rows, _ = ingest_rows(SAMPLE)
    # the two "Connected" startup lines and the backend's batch-span error are not requests (where), nor bad lines
    assert (source["rows"], source["bad_lines"]) == (6, 0)
    ok, failed, real_error, overloaded, generation, incomplete = rows
    assert ok["e2e_s"] == pytest.approx(0.357867572, abs=1e-12)
    assert ok["queue_s"] == pytest.approx(49.382e-6, abs=1e-12)  # "49.382µs"
    assert ok["attrs"]["validation_s"] == pytest.approx(1.96844e-3, abs=1e-12)
    assert ok["attrs"]["tgi_time_per_token_s"] == pytest.approx(14.827082e-3, abs=1e-12)
    assert ok["completion_tokens"] == 24  # round(355.849981 / 14.827082)
    assert ok["ttft_s"] is None and ok["prompt_tokens"] is None and ok["model"] is None
    assert ok["t_end"] == datetime(2024, 7, 1, 5, 12, 41, 583307)
    assert ok["t_arrival"] == datetime(2024, 7, 1, 5, 12, 41, 225439)  # end - total_time, to the microsecond
    assert (ok["max_tokens"], ok["stream"], ok["status"], ok["error_type"]) == (512, False, "ok", None)
    # server.rs logs a streaming-only validation error as "Input validation error: ..." in the handler's span
    assert (failed["status"], failed["error_type"], failed["http_status"]) == ("error", "validation", 422)
    assert failed["t_arrival"] is None and failed["e2e_s"] is None and failed["stream"] is True
    assert failed["finish_reason"] == "error" and failed["endpoint"] == "/generate_stream"
    # a real TGI --json-output error line: the bare validation message from text_generation_router::infer, under
    # a Vertex handler (its route is AIP_PREDICT_ROUTE: endpoint unknown) calling the non-streamed generate
    assert (real_error["status"], real_error["error_type"], real_error["http_status"]) == ("error", "validation", 422)
    assert real_error["t_end"] == datetime(2024, 10, 25, 22, 35, 49, 174225)
    assert (real_error["stream"], real_error["endpoint"]) == (None, None)
    assert real_error["error_message"].startswith("`inputs` tokens + `max_new_tokens` must be <= 2048")
    # infer's own generate_stream span under a /generate call: the handler (outermost span) says not streamed
    assert (overloaded["error_type"], overloaded["http_status"], overloaded["stream"]) == ("overloaded", 429, False)
    assert (overloaded["error_message"], overloaded["max_tokens"]) == ("no permits available", 256)
    # a shard failure is logged in the backend's send_error span, four spans below the handler
    assert (generation["error_type"], generation["http_status"], generation["stream"]) == ("generation", 424, True)
    assert generation["endpoint"] == "/generate_stream" and generation["max_tokens"] == 256
    assert (incomplete["error_type"], incomplete["http_status"]) == ("incomplete_generation", 500)


def test_router_errors_are_failed_requests_of_their_class():
    from servlens.analysis.vocabulary import ERROR_CLASS, FAILED
    _, _, con = ingest_rows(SAMPLE)
    found = con.execute(f"SELECT error_type, {FAILED}, {ERROR_CLASS} FROM requests WHERE status = 'error' "
                        "ORDER BY source_line").fetchall()
    assert found == [("validation", True, "context_validation"), ("validation", True, "context_validation"),
                     ("overloaded", True, "rate_limit"), ("generation", True, "server_5xx"),
                     ("incomplete_generation", True, "server_5xx")]

TEXT_SAMPLE = FORMATS / "tgi" / "tgi-router-text.log"


def test_default_text_log_success_lines_of_five_versions():
    assert sniffed_name(TEXT_SAMPLE) == "tgi-router-text"
    source, rows, _ = ingest_rows(TEXT_SAMPLE, order="source_line")
    # 10 real lines: 6 Success events and a request's ERROR line (line 9) are rows; the "Connected" and "Invalid
    # hostname" lines are not requests: none of them is a bad line
    assert (source["rows"], source["bad_lines"]) == (7, 0)
    assert [r["source_line"] for r in rows] == [1, 2, 4, 5, 7, 9, 10]
    otel, _, _, v2, chat, refused, v3 = rows
    # TGI 3.x refusing a /v1/chat/completions request too long for the model (router/src/infer/mod.rs:126, inside
    # infer's generate_stream span under the chat_completions handler): TGI's validation error, HTTP 422, no timing
    assert (refused["status"], refused["error_type"], refused["http_status"]) == ("error", "validation", 422)
    assert (refused["endpoint"], refused["max_tokens"]) == ("/v1/chat/completions", 20)
    assert refused["error_message"].startswith("`inputs` tokens + `max_new_tokens` must be <= 512. Given: 1864")
    assert refused["t_end"] == datetime(2025, 9, 9, 11, 28, 3, 840209)
    assert (refused["t_arrival"], refused["e2e_s"], refused["completion_tokens"]) == (None, None, None)
    assert all(r["status"] == "ok" and r["error_type"] is None for r in rows if r is not refused)
    # TGI 1.0 with OpenTelemetry: parent span carries the trace id; old `max_new_tokens: 20` without Some(...)
    assert otel["trace_id"] == "d6e2778955d17bf523e3dc568754ef3e" and otel["max_tokens"] == 20
    assert otel["e2e_s"] == pytest.approx(0.986532642) and otel["queue_s"] == pytest.approx(188.125e-6)
    assert otel["completion_tokens"] == 20 and otel["t_end"] == datetime(2023, 9, 6, 13, 47, 1, 731233)
    assert otel["t_arrival"] == datetime(2023, 9, 6, 13, 47, 0, 744700)
    # seconds-valued durations; 93 tokens generated of max 100; validation in ms kept in attrs
    assert (v2["e2e_s"], v2["completion_tokens"], v2["max_tokens"]) == (pytest.approx(4.065504959), 93, 100)
    assert v2["attrs"]["validation_s"] == pytest.approx(0.440038965) and v2["stream"] is False
    # OpenAI route: no parameters field, stream unknown (not in the span), never a TTFT
    assert (chat["endpoint"], chat["stream"], chat["max_tokens"], chat["completion_tokens"]) == (
        "/v1/chat/completions", None, None, 20)
    # TGI 3.x /generate_stream (server.rs:637): 20 tokens of max 20 in 1.194 s, 53.525 µs queued
    assert (v3["endpoint"], v3["stream"], v3["max_tokens"], v3["completion_tokens"]) == ("/generate_stream", True, 20, 20)
    assert v3["e2e_s"] == pytest.approx(1.194364886) and v3["queue_s"] == pytest.approx(53.525e-6)
    assert v3["attrs"]["validation_s"] == pytest.approx(204.821e-6)
    assert v3["attrs"]["tgi_time_per_token_s"] == pytest.approx(59.705335e-3)
    assert v3["t_end"] == datetime(2025, 9, 9, 11, 29, 51, 795563)
    assert v3["t_arrival"] == datetime(2025, 9, 9, 11, 29, 50, 601198)
    assert all(r["ttft_s"] is None and r["prompt_tokens"] is None for r in rows)


def test_a_success_line_in_another_layout_is_a_bad_line(tmp_path):
    """A Success line whose span fields come in another order (a future TGI release) cannot be read: it is a bad line
    with its line number, not a request silently dropped."""
    lines = TEXT_SAMPLE.read_text().splitlines()
    success = lines[9]
    assert success.endswith(": Success")
    reordered = success.replace('queue_time="', 'queue_time_ns="')
    path = tmp_path / "router.log"
    path.write_text("\n".join([*lines, reordered]) + "\n")
    source, rows, con = ingest_rows(path, order="source_line")
    assert (source["rows"], source["bad_lines"]) == (7, 1)
    line, reason = con.execute("SELECT line, reason FROM ingest_errors").fetchone()
    assert (line, reason) == (11, "the line starts like a tgi-router-text record but matches none of its [lines] patterns")
